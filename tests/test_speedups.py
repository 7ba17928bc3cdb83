"""The optional C fast path of PoolResource (ignis/_speedups.c) against the
Python implementation: same results, same errors, no leaked references, and the
Python path whenever a hook, a miss or a busy lock needs it."""

from __future__ import annotations

import gc
import os
import sys
import threading
import types

import pytest

import ignis as ig
from ignis.memory import Access, BlockState
from ignis.memory import history as _history
from ignis.memory import pool as _pool

fast_only = pytest.mark.skipif(not _pool.FAST, reason="ignis._speedups is not built (or IGNIS_PURE_PYTHON=1)")


def python_path(mr: ig.PoolResource) -> ig.PoolResource:
    """Drop the instance's C-bound methods: the class's Python methods run."""
    mr.__dict__.pop("allocate", None)
    mr.__dict__.pop("deallocate", None)
    return mr


def test_the_fast_path_is_built_where_required():
    # CI sets IGNIS_REQUIRE_SPEEDUPS=1: a silently failed build must not pass as green.
    if os.environ.get("IGNIS_REQUIRE_SPEEDUPS") == "1":
        assert _pool.FAST, "ignis._speedups did not build or import"
    if _pool.FAST:
        mr = ig.PoolResource(device=0)
        assert isinstance(mr.allocate, types.MethodType) and mr.allocate.__func__ is _pool._speedups.pool_allocate
        mr.close()


def _python_calls(fn) -> int:
    """Python functions called by ``fn`` (not counting ``fn`` itself)."""
    calls = -1

    def prof(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


@fast_only
def test_a_cached_pair_runs_no_python(dev):
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    mr.deallocate(mr.allocate(1000, s))  # fill the cache

    def pairs():
        for _ in range(50):
            mr.deallocate(mr.allocate(1000, s, "x"))
            mr.deallocate(mr.allocate(1000, stream=s, tag="y"))

    assert _python_calls(pairs) == 0
    slow = python_path(ig.PoolResource(device=0))
    slow.deallocate(slow.allocate(1000, s))
    assert _python_calls(lambda: slow.deallocate(slow.allocate(1000, s))) > 0
    mr.close()
    slow.close()
    s.close()


def _script(mr: ig.PoolResource, streams: list) -> list:
    """A fixed sequence of hits, misses, splits, cross-stream reuse and errors;
    returns what a caller can observe."""
    seen: list = []
    a, b = streams
    held = []
    for i, n in enumerate([256, 256, 4096, 1 << 20, (1 << 20) + 1, 12 << 20, 700, 256]):
        held.append(mr.allocate(n, a if i % 2 else b, f"t{i}"))
    for blk in held[::2]:
        mr.deallocate(blk)
    for n in (256, 4096, 12 << 20, 600):
        held.append(mr.allocate(n, stream=a, tag="again"))
    mr.prepare_block_use(held[-1], b, Access.WRITE)  # a cross-stream use: its free goes through ordering
    mr.finish_block_use(held[-1], b, Access.WRITE)
    for bad in (0, -5, 2.0, True):
        with pytest.raises((ValueError, TypeError)) as ei:
            mr.allocate(bad, a)
        seen.append((type(ei.value).__name__, str(ei.value)))
    with pytest.raises(TypeError):
        mr.allocate(256, a, "t", extra=1)
    live = [blk for blk in held if blk.state is BlockState.LIVE]
    for blk in live:
        mr.deallocate(blk)
    with pytest.raises(ig.DoubleFreeError) as ei:
        mr.deallocate(live[0])
    seen.append(str(ei.value).split(" was")[0].split(" (")[1])
    other = ig.PoolResource(device=0)
    foreign = other.allocate(256, a)
    with pytest.raises(ValueError):
        mr.deallocate(foreign)
    other.deallocate(foreign)
    other.close()
    seen.append([(blk.bytes, blk.requested, blk.tag, blk.state.name, blk.alloc_stream is a) for blk in held])
    seen.append((mr.bytes_outstanding, mr.bytes_reserved, mr.num_segment_allocs))
    seen.append(sorted((seg["size"], len(seg["blocks"])) for seg in mr.segments()))
    return seen


def test_fast_and_python_paths_agree(dev, streams):
    fast = ig.PoolResource(device=0)
    slow = python_path(ig.PoolResource(device=0))
    ss = streams[:2]
    assert _script(fast, ss) == _script(slow, ss)
    dev.synchronize()
    assert fast.bytes_outstanding == 0 and slow.bytes_outstanding == 0
    fast.close()
    slow.close()


def test_no_references_leak(dev):
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    tag = "leak-check-tag"
    for _ in range(100):
        mr.deallocate(mr.allocate(512, s, tag))
    gc.collect()
    before = (sys.getrefcount(s), sys.getrefcount(tag), len(mr._live), mr.bytes_outstanding,
              sum(1 for o in gc.get_objects() if type(o) is ig.DeviceBlock))
    for _ in range(5000):
        mr.deallocate(mr.allocate(512, s, tag))
    gc.collect()
    after = (sys.getrefcount(s), sys.getrefcount(tag), len(mr._live), mr.bytes_outstanding,
             sum(1 for o in gc.get_objects() if type(o) is ig.DeviceBlock))
    assert after == before
    mr.close()
    s.close()


def test_hooks_take_the_python_path(dev):
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    mr.deallocate(mr.allocate(2048, s))
    events = []
    old = _history.recorder
    _history.recorder = lambda what, res, ptr, size, stream, block: events.append(what) if res is mr else None
    try:
        mr.deallocate(mr.allocate(2048, s))
    finally:
        _history.recorder = old
    assert events == ["alloc", "free_requested", "free_completed"]
    mr.close()
    s.close()


def test_a_busy_lock_waits_in_the_python_path(dev):
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    mr.deallocate(mr.allocate(4096, s))
    got = []
    mr._lock.acquire()
    t = threading.Thread(target=lambda: got.append(mr.allocate(4096, s)))
    t.start()
    t.join(0.2)
    assert t.is_alive() and not got  # waiting for the lock, not racing past it
    mr._lock.release()
    t.join(5)
    assert got and got[0].state is BlockState.LIVE and mr.bytes_outstanding == got[0].bytes
    mr.deallocate(got[0])
    mr.close()
    s.close()


def test_a_rebuilt_context_frees_through_the_python_path():
    dev = ig.Device(0)
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    b = mr.allocate(256, s)
    dev.rebuild()
    mr.deallocate(b)  # the memory went with the context: the block is FREED, not cached
    assert b.state is BlockState.FREED and mr.bytes_outstanding == 0
