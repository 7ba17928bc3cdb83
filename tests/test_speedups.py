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
from helpers import python_calls
from ignis.memory import Access, BlockState
from ignis.memory import history as _history
from ignis.memory import pool as _pool

fast_only = pytest.mark.skipif(not _pool.FAST, reason="ignis._speedups is not built (or IGNIS_PURE_PYTHON=1)")


def python_path(mr: ig.PoolResource) -> ig.PoolResource:
    """Drop the instance's C-bound methods: the class's Python methods run."""
    for name in ("allocate", "deallocate", "prepare_block_use", "finish_block_use"):
        mr.__dict__.pop(name, None)
    return mr


def test_the_fast_path_is_built_where_required():
    # CI sets IGNIS_REQUIRE_SPEEDUPS=1: a silently failed build must not pass as green.
    if os.environ.get("IGNIS_REQUIRE_SPEEDUPS") == "1":
        import ignis._speedups  # noqa: F401  (ImportError: it did not build)
        if os.environ.get("IGNIS_PURE_PYTHON", "") in ("", "0"):
            assert _pool.FAST, "ignis._speedups is built but PoolResource does not use it"
    elif os.environ.get("IGNIS_PURE_PYTHON", "") not in ("", "0"):
        assert not _pool.FAST
    if _pool.FAST:
        mr = ig.PoolResource(device=0)
        assert isinstance(mr.allocate, types.MethodType) and mr.allocate.__func__ is _pool._speedups.pool_allocate
        mr.close()


@fast_only
def test_a_cached_pair_runs_no_python(dev):
    mr = ig.PoolResource(device=0)
    s = dev.create_stream()
    mr.deallocate(mr.allocate(1000, s))  # fill the cache

    def pairs():
        for _ in range(50):
            mr.deallocate(mr.allocate(1000, s, "x"))
            mr.deallocate(mr.allocate(1000, stream=s, tag="y"))

    assert python_calls(pairs) == 0
    slow = python_path(ig.PoolResource(device=0))
    slow.deallocate(slow.allocate(1000, s))
    assert python_calls(lambda: slow.deallocate(slow.allocate(1000, s))) > 0
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


def _record(blk, streams) -> tuple:
    """The block's hazard record, with streams by index and events as 'set' / 'lazy'."""
    idx = {id(s): i for i, s in enumerate(streams)}
    ev = lambda e: "set" if e else "lazy"  # noqa: E731
    ws = None if blk._ws is None else idx[id(blk._ws)]
    rd = None if blk._rd is None else sorted((idx[id(s)], ev(e)) for s, e in blk._rd.items())
    return ws, ev(blk._we), rd


USES = [(1, "WRITE"), (0, "READ"), (2, "READ"), (0, "READ"), (1, "READ_WRITE"), (1, "READ"), (0, "WRITE"),
        (0, "READ"), (2, "WRITE"), (2, "WRITE"), (1, "READ"), (2, "READ"), (0, "READ_WRITE"), (0, "READ")]


def _track_script(mr: ig.PoolResource, streams: list) -> list:
    blk = mr.allocate(4096, streams[0], "tracked")
    seen = []
    for s, acc in USES:
        mr.prepare_block_use(blk, streams[s], Access[acc])
        mr.finish_block_use(blk, streams[s], Access[acc])
        seen.append(_record(blk, streams))
    seen.append(mr.cross_stream_waits)
    mr.deallocate(blk)
    seen.append((blk.state.name, blk._ws, blk._rd))
    return seen


@pytest.mark.parametrize("policy", ["auto", "manual", "manual-but-stream-auto"])
def test_tracking_paths_agree(dev, streams, policy):
    fast = ig.PoolResource(device=0)
    slow = python_path(ig.PoolResource(device=0))
    with ig.ordering("auto" if policy == "auto" else "manual"):
        if policy == "manual-but-stream-auto":
            ig.set_ordering("auto", stream=streams[1])
        try:
            assert _track_script(fast, streams) == _track_script(slow, streams)
        finally:
            ig.set_ordering(None, stream=streams[1])
    dev.synchronize()
    fast.close()
    slow.close()


@fast_only
def test_tracked_uses_run_no_python_tracking(dev, streams):
    mr = ig.PoolResource(device=0)
    blk = mr.allocate(4096, streams[0])
    a, b = streams[0], streams[1]
    names = {"prepare_block_use", "finish_block_use", "_wait", "_record", "_resolve"}
    called = set()

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_name in names:
            called.add(frame.f_code.co_name)

    before = ig._speedups.driver_calls()
    sys.setprofile(prof)
    try:
        for i in range(20):
            s = b if i % 2 else a
            mr.prepare_block_use(blk, s, Access.READ_WRITE)
            mr.finish_block_use(blk, s, Access.READ_WRITE)
    finally:
        sys.setprofile(None)
    after = ig._speedups.driver_calls()
    assert not called
    # Alternating streams, queued from C: the first use (on the block's own stream)
    # needs nothing; each of the 10 uses on b records the lazy write on a, waits for
    # it and records its own end; each of the 9 later uses on a waits for that end.
    assert after["event_record"] - before["event_record"] == 20
    assert after["stream_wait_event"] - before["stream_wait_event"] == 19
    mr.deallocate(blk)
    dev.synchronize()
    mr.close()


def test_tracking_with_an_armed_fault_raises_the_driver_error(dev, streams, backend):
    mr = ig.PoolResource(device=0)
    blk = mr.allocate(4096, streams[0])
    mr.prepare_block_use(blk, streams[1], Access.WRITE)
    backend.inject_fault("event_record", error="CUDA_ERROR_LAUNCH_FAILED")
    with pytest.raises(ig.DriverError) as ei:
        mr.finish_block_use(blk, streams[1], Access.WRITE)  # records an event on the other stream
    assert ei.value.name == "CUDA_ERROR_LAUNCH_FAILED"
    backend.clear_faults()
    mr.finish_block_use(blk, streams[1], Access.WRITE)
    mr.deallocate(blk)
    dev.synchronize()
    mr.close()


def test_tracking_refuses_stale_blocks_in_both_paths(dev, streams):
    for mr in (ig.PoolResource(device=0), python_path(ig.PoolResource(device=0))):
        blk = mr.allocate(256, streams[0])
        mr.deallocate(blk)
        with pytest.raises(ig.UseAfterFreeError):
            mr.prepare_block_use(blk, streams[1], Access.READ)
        with pytest.raises(ig.UseAfterFreeError):
            mr.finish_block_use(blk, streams[1], Access.READ)
        mr.close()


@fast_only
def test_unbound_module_raises_instead_of_crashing():
    import subprocess
    code = ("import ignis._speedups as m\n"
            "for f, a in ((m.pool_allocate, (1, 2, 3)), (m.pool_deallocate, (1, 2)),\n"
            "             (m.tracked_prepare, (1, 2, 3, 4)), (m.tracked_finish, (1, 2, 3, 4))):\n"
            "    try:\n        f(*a)\n    except RuntimeError as e:\n        print('refused:', e)\n")
    env = dict(os.environ, IGNIS_PURE_PYTHON="1")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(ig.__file__)))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("refused: ignis._speedups is not set up") == 4
