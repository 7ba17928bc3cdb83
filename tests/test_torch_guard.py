"""The debug guard as PyTorch's allocator (ignis.torch._guard).

CPU part (any backend; the emulated one in CI): the compiled entry points
``ignis_torch_alloc`` / ``ignis_torch_free`` (of ``ignis.torch._guard_fast``) are
driven directly through ctypes with stream handles of Ignis's own streams (the
fake "PyTorch streams"), so
the allocator's bookkeeping, checks, reports, record_stream ordering and
option checks run without torch's CUDA. GPU part (``@pytest.mark.gpu``): the
zoo programs under tests/guard_zoo run under the guard in a subprocess.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import weakref

import pytest

import ignis as ig
from helpers import IMPORT_ROOT, read, sleep_on, write
from ignis.telemetry._torch import guard_memory_stats
from ignis.torch import _guard as tg
from ignis.torch import _guard_fast as _fast
from ignis.memory import guard_alloc, guard_front

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(HERE, "guard_zoo")
G, POISON, CANARY = 256, 0xA5, 0xFD


# -- the C entry points, as PyTorch calls them -----------------------------------------
_lib = ctypes.CDLL(_fast.__file__)
c_alloc = _lib.ignis_torch_alloc
c_alloc.restype = ctypes.c_void_p
c_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
c_free = _lib.ignis_torch_free
c_free.restype = None
c_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]


def alloc(n: int, stream: "ig.Stream | None" = None) -> int:  # the line every report below points at
    p = c_alloc(n, 0, 0 if stream is None else stream.handle)
    assert p, "the allocation failed"
    return p


def free(p: int, n: int, stream: "ig.Stream | None" = None) -> None:
    c_free(p, n, 0, 0 if stream is None else stream.handle)


@pytest.fixture
def guard(request, streams):
    """The guard bound to the C entry points (small batches, so checks run often). It
    depends on ``streams`` so that it is torn down (its checks queued and waited for)
    before those streams close."""
    opts = getattr(request, "param", None) or {"batch": 4}
    tg._reset()
    tg._configure(opts)
    _fast.torch_guard_bind(tg._alloc, tg._free)
    g = tg.guard_resource(0)
    yield g
    tg._reset()


def _raw(g, p: int, n: int, stream: ig.Stream) -> bytes:
    return read(p - G, n + 2 * G, stream)


# -- bookkeeping -------------------------------------------------------------------------
def test_entry_points_allocate_guarded_poisoned_blocks(guard, streams):
    s = streams[0]
    p = alloc(1000, s)
    assert p % 256 == 0
    raw = _raw(guard, p, 1000, s)
    assert raw[:G] == bytes([CANARY]) * G and raw[G + 1000:] == bytes([CANARY]) * G
    assert raw[G:G + 1000] == bytes([POISON]) * 1000
    assert guard.bytes_outstanding == 1000 and p in tg._s.blocks
    free(p, 1000, s)
    assert guard.bytes_outstanding == 0 and p not in tg._s.blocks
    assert guard.quarantined_count == 1
    assert tg.check(raise_=False) == []
    assert tg.reports() == []


def test_default_stream_handle_and_unknown_frees(guard, dev):
    p = alloc(64)  # handle 0: the framework's default stream
    assert guard._live[p].block.alloc_stream is tg._stream(0, 0)
    free(p, 64)
    free(12345 * 256, 64)  # not ours: ignored
    c_free(None, 0, 0, None)  # NULL: ignored
    assert c_alloc(0, 0, None) is None  # an empty allocation is NULL, as PyTorch expects
    assert guard.bytes_outstanding == 0


def test_entry_point_timing_counts_only_while_on(guard, streams):
    s = streams[0]
    _fast.torch_guard_timing(False)  # (whatever an earlier test left)
    free(alloc(512, s), 512, s)
    assert _fast.torch_guard_timing(True) == (0,) * 7  # off: nothing counted
    for _ in range(3):
        free(alloc(512, s), 512, s)
    c_free(None, 0, 0, None)  # NULL: no free, not counted
    na, ta, nf, tf, tp, gil, cpu = _fast.torch_guard_timing(False)
    assert (na, nf) == (3, 3) and ta > 0 and tf > 0 and 0 <= gil < ta + tf and 0 < cpu
    assert 0 <= tp <= tf  # (the poison's driver calls, where the C poison is bound: a part of the frees)
    assert _fast.torch_guard_timing(False) == (0,) * 7  # restarted, and off again
    free(alloc(512, s), 512, s)
    assert _fast.torch_guard_timing(False) == (0,) * 7


def test_unbound_entry_points_fail_cleanly(guard, streams):
    _fast.torch_guard_bind(None, None)
    assert c_alloc(256, 0, streams[0].handle) is None
    _fast.torch_guard_bind(tg._alloc, tg._free)


def test_freed_blocks_are_poisoned_then_reused_without_memsets(guard, streams):
    s = streams[0]
    p = alloc(4096, s)
    write(p, b"\x11" * 4096, s)
    free(p, 4096, s)
    assert read(p, 4096, s) == bytes([POISON]) * 4096  # poisoned on free, in stream order
    guard.flush()  # checked, repaired, back in the pool
    fresh = guard.formatted_fresh
    q = alloc(4096, s)
    assert q == p and guard.reused >= 1 and guard.formatted_fresh == fresh  # no memset: the check left it intact
    raw = _raw(guard, q, 4096, s)
    assert raw == bytes([CANARY]) * G + bytes([POISON]) * 4096 + bytes([CANARY]) * G
    free(q, 4096, s)
    q2 = alloc(4000, s)  # another size: the after-guard moves, so it is written afresh
    assert _raw(guard, q2, 4000, s)[G + 4000:] == bytes([CANARY]) * G
    free(q2, 4000, s)


def test_a_checked_block_of_another_size_is_formatted_in_part(guard, streams):
    # 4096, 4000, 3999, 4090 user bytes all take one 4608-byte pool block (512-byte rounding):
    # after the first, each allocation writes only what differs, and must hold exactly the
    # fresh layout (a stale canary, or poison in the after-guard, would be a false report).
    s = streams[0]
    p0 = alloc(4096, s)
    free(p0, 4096, s)
    guard.flush()  # checked, repaired, back in the pool
    fresh, resized = guard.formatted_fresh, guard.resized
    for n in (4000, 3999, 4090, 4096, 4096):  # the last: the same size again, no memset
        p = alloc(n, s)
        assert p == p0, "the pool should hand back the same block"
        assert _raw(guard, p, n, s) == bytes([CANARY]) * G + bytes([POISON]) * n + bytes([CANARY]) * G, n
        write(p, b"\x11" * n, s)
        free(p, n, s)
        guard.flush()
    assert guard.formatted_fresh == fresh and guard.resized == resized + 4 and guard.reused >= 1
    # What the guard finds is unchanged on a block formatted in part (3600 and 3900 bytes
    # take the 4608-byte block too; smaller ones split it, which formats them whole).
    p = alloc(3600, s)
    assert p == p0 and guard.resized == resized + 5
    write(p + 3600, b"\x09", s)  # one byte past the end: where the poison of 4096 was
    free(p, 3600, s)
    (e,) = tg.check(raise_=False)
    assert isinstance(e, ig.OutOfBoundsError) and e.side == "after" and e.offset == 3600
    guard.flush()
    p = alloc(3900, s)  # larger again: from the repaired 3600-byte layout
    assert p == p0 and guard.resized == resized + 6
    assert _raw(guard, p, 3900, s) == bytes([CANARY]) * G + bytes([POISON]) * 3900 + bytes([CANARY]) * G
    free(p, 3900, s)
    write(p + 3899, b"\x2a", s)  # after the free, in the poison that grew
    (e,) = guard.flush(raise_=False)
    assert isinstance(e, ig.UseAfterFreeError) and e.offset == 3899


def test_a_failing_partial_format_leaks_nothing(guard, streams, backend):
    s = streams[0]
    p = alloc(4096, s)
    free(p, 4096, s)
    guard.flush()
    guard.upstream.reap_pending()
    start = guard.upstream.bytes_outstanding
    backend.inject_fault("memset_d32_async", nth=1, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        guard.allocate(4000, s)  # the same pool block: its new after-guard fails
    assert "memset_d32_async" not in backend.armed_faults()
    guard.upstream.reap_pending()
    assert guard.bytes_outstanding == 0 and guard.upstream.bytes_outstanding == start
    fresh = guard.formatted_fresh
    q = alloc(4000, s)  # formatted whole now: the failed attempt left no record of a checked layout
    assert q == p and guard.formatted_fresh == fresh + 1
    assert _raw(guard, q, 4000, s) == bytes([CANARY]) * G + bytes([POISON]) * 4000 + bytes([CANARY]) * G
    free(q, 4000, s)


def test_many_blocks_batches_and_quarantine_bound(streams):
    tg._reset()
    tg._configure({"batch": 8, "quarantine_count": 5})
    _fast.torch_guard_bind(tg._alloc, tg._free)
    try:
        g = tg.guard_resource(0)
        s = streams[1]
        ptrs = [alloc(512 + 64 * i, s) for i in range(40)]
        for i, p in enumerate(ptrs):
            free(p, 512 + 64 * i, s)
        assert g.quarantined_count == 5
        assert tg.check(raise_=False) == []
        assert g._checker.batches >= 5 and g._checker.jobs >= 40 + 35
        g.flush()
        assert g.quarantined_count == 0 and not g._held_exit
        g.upstream.reap_pending()
        assert g.upstream.bytes_outstanding == 0  # everything went back to the pool
    finally:
        tg._reset()


@pytest.fixture
def small_quarantine(streams):
    """The guard with a quarantine of one block and batches of two jobs: the second free of
    a size pushes the first block out, and that batch is queued at once."""
    tg._reset()
    tg._configure({"batch": 2, "quarantine_count": 1})
    _fast.torch_guard_bind(tg._alloc, tg._free)
    yield tg.guard_resource(0)
    tg._reset()


def _through_quarantine(n: int, s: ig.Stream) -> int:
    """Allocate and free two blocks of ``n`` bytes on ``s``: the first leaves the quarantine."""
    a = alloc(n, s)
    free(a, n, s)
    b = alloc(n, s)
    free(b, n, s)
    return a


def test_a_block_leaving_the_quarantine_waits_in_the_ready_cache_for_its_size_and_stream(small_quarantine, streams):
    g, s, other = small_quarantine, streams[0], streams[1]
    a = _through_quarantine(4096, s)
    held = 4096 + 2 * G
    assert g._ready_bytes == held and tg.guard_stats(0)["guard.ready_bytes"] == held
    pool_out = g.upstream.bytes_outstanding  # the ready block is still the guard's, not the pool's
    assert g.memory_numbers()["cached_bytes"] >= held + g.quarantined_bytes
    x = alloc(4096, other)  # another stream: never from the ready cache
    y = alloc(4000, s)      # another size: neither
    assert a not in (x, y) and g._ready_bytes == held
    reused, fresh = g.reused, g.formatted_fresh
    c = alloc(4096, s)
    assert c == a and g._ready_bytes == 0 and g.reused == reused + 1 and g.formatted_fresh == fresh
    assert _raw(g, c, 4096, s) == bytes([CANARY]) * G + bytes([POISON]) * 4096 + bytes([CANARY]) * G
    assert g.upstream.bytes_outstanding == pool_out + 2 * (4096 + 2 * G)  # x and y only: c took no pool block
    for p, n, st in ((x, 4096, other), (y, 4000, s), (c, 4096, s)):
        free(p, n, st)
    assert tg.check(raise_=False) == []
    g.flush()  # the ready cache goes back to the pool with the quarantine
    assert g._ready_bytes == 0 and not g._ready and g.quarantined_count == 0
    g.upstream.reap_pending()
    assert g.upstream.bytes_outstanding == 0


def test_a_write_after_free_is_reported_and_repaired_before_the_ready_cache_hands_the_block_out(small_quarantine, streams):
    g, s = small_quarantine, streams[0]
    a = alloc(2048, s)
    free(a, 2048, s)
    write(a + 10, b"\x2a" * 4, s)  # through a stale pointer, while quarantined
    b = alloc(2048, s)
    free(b, 2048, s)  # a leaves the quarantine: its check and repair are queued, it waits as ready
    assert g._ready_bytes == 2048 + 2 * G
    c = alloc(2048, s)
    assert c == a and read(c, 2048, s) == bytes([POISON]) * 2048  # repaired in stream order before the reuse
    errs = tg.check(raise_=False)
    assert len(errs) == 1 and isinstance(errs[0], ig.UseAfterFreeError)
    assert errs[0].offset == 10 and errs[0].damaged == 4 and errs[0].found[:4] == b"\x2a" * 4
    free(c, 2048, s)


def test_the_ready_cache_keeps_to_its_bound(small_quarantine, streams):
    g, s = small_quarantine, streams[0]
    g.ready_limit = 4096 + 2 * G  # room for one 4 KiB block, not for an 8 KiB one
    _through_quarantine(8192, s)
    assert g._ready_bytes == 0  # went back to the pool
    _through_quarantine(4096, s)
    assert g._ready_bytes == 4096 + 2 * G
    g.ready_limit = 0
    g.flush()
    _through_quarantine(4096, s)
    assert g._ready_bytes == 0  # a limit of 0: no ready cache
    assert tg.check(raise_=False) == []


def test_running_out_hands_the_ready_cache_back_and_retries(small_quarantine, streams, backend):
    g, s = small_quarantine, streams[0]
    n = 12 << 20  # over 10 MiB: a pool segment of its own
    _through_quarantine(n, s)
    assert g._ready_bytes == n + 2 * G
    op = "mem_alloc_async" if isinstance(g.upstream.upstream, ig.AsyncResource) else "mem_alloc"
    backend.inject_fault(op, 1, times=2)  # the pool's attempt and its own retry fail
    q = alloc(n + (1 << 20), s)  # another size: served after the guard gave everything back
    assert op not in backend.armed_faults()
    assert g._ready_bytes == 0 and g.quarantined_count == 0
    free(q, n + (1 << 20), s)
    assert tg.check(raise_=False) == []


def _guard_through_quarantine(g, n: int, s: ig.Stream) -> int:
    """``_through_quarantine`` through the guard's own allocate / free (Ignis's streams)."""
    a = g.allocate(n, s)
    g.free_fast(a)
    g.free_fast(g.allocate(n, s))
    return a.ptr


def test_the_ready_cache_serves_only_an_open_stream_of_a_live_context(small_quarantine, dev):
    g = small_quarantine
    s = dev.create_stream()
    _guard_through_quarantine(g, 4096, s)
    assert g._ready_bytes
    s.close()
    with pytest.raises(ig.ClosedError):  # the pool's error, as without the cache
        g.allocate(4096, s)
    t = dev.create_stream()
    _guard_through_quarantine(g, 4096, t)  # a release of blocks leaving the quarantine...
    assert g._ready and all(not k[0]._closed for k in g._ready)  # ...gave the closed stream's block back
    dev.synchronize()
    dev.rebuild()
    assert not g._context_alive() and g._ready_bytes
    with pytest.raises(ig.StaleHandleError):  # never a block of the dead context
        g.allocate(4096, t)


def test_a_pool_refusing_a_closed_streams_ready_block_loses_nothing(small_quarantine, dev):
    g = small_quarantine
    s = dev.create_stream()
    kept = _guard_through_quarantine(g, 4096, s) - G  # its pool block
    s.close()  # its ready block is to go back at the next release
    pool = g.upstream
    real = type(pool).deallocate

    def refuse_one(block):
        if block.ptr == kept:
            raise ig.IgnisError("refused")
        real(pool, block)

    pool.deallocate = refuse_one
    try:
        t = dev.create_stream()
        with pytest.raises(ig.IgnisError, match="refused"):
            _guard_through_quarantine(g, 2048, t)  # the release that meets the refusal
        # the block leaving the quarantine with that release (t's) went back all the same
        assert all(e.up.alloc_stream is not t for e in g._held_exit.values())
        assert [u.ptr for lst in g._ready.values() for u in lst] == [kept]  # the refused one is kept
    finally:
        del pool.deallocate
    g.flush()
    assert not g._ready and g._ready_bytes == 0
    t.synchronize()
    pool.reap_pending()
    assert pool.bytes_outstanding == 0
    t.close()


def test_a_failing_flush_still_hands_the_ready_cache_back(small_quarantine, streams, backend):
    g, s = small_quarantine, streams[0]
    _through_quarantine(4096, s)
    a = alloc(2048, s)
    free(a, 2048, s)
    assert g._ready_bytes and g.quarantined_count
    backend.inject_fault("kernel_launch", 1, times=100)
    with pytest.raises(ig.DriverError):
        g.flush()
    backend.clear_faults()
    assert g._ready_bytes == 0 and not g._ready and g.quarantined_count == 0
    streams[0].synchronize()
    g.upstream.reap_pending()
    assert g.upstream.bytes_outstanding == 0


def test_the_ready_cache_keeps_tags_apart_and_steps_aside_while_events_are_recorded(small_quarantine, streams):
    from ignis.memory import history
    g, s = small_quarantine, streams[0]
    a = g.allocate(4096, s, "A")
    g.free_fast(a)
    b = g.allocate(4096, s, "A")
    g.free_fast(b)  # a's block leaves the quarantine: ready under (s, 4096, "A")
    assert [k[2] for k in g._ready] == ["A"]
    c = g.allocate(4096, s, "B")
    assert c.ptr != a.ptr and g._ready_bytes  # another tag: from the pool
    events = []
    prev = history.set_recorder(lambda action, mr, ptr, size, stream, block: events.append((action, mr)))
    try:
        d = g.allocate(4096, s, "A")  # recording: the cache goes back to the pool, d comes from the pool
        assert g._ready_bytes == 0 and any(mr is g.upstream and act == "alloc" for act, mr in events)
    finally:
        history.set_recorder(prev)
    for x in (c, d):
        g.free_fast(x)
    assert tg.check(raise_=False) == []


def test_snapshots_show_the_ready_cache_as_the_guards_inactive_memory(small_quarantine, streams):
    g, s = small_quarantine, streams[0]
    _through_quarantine(4096, s)
    (up,) = [u for lst in g._ready.values() for u in lst]
    snap = ig.snapshot()
    blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["address"] == up.ptr]
    assert blocks == [{"address": up.ptr, "size": up._impl.size, "requested_size": 0, "state": "inactive",
                       "frames": [], "tag": "ignis.guard"}]


# -- what it finds -----------------------------------------------------------------------
def _site_line() -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if "the line every report below points at" in line:
                return i + 1
    raise AssertionError


def test_write_past_the_end_is_reported_on_free(guard, streams):
    s = streams[0]
    p = alloc(4096, s)
    keep = write(p + 4096, b"\x07" * 64, s)  # 64 bytes past the end
    free(p, 4096, s)
    errs = tg.check(raise_=False)
    assert len(errs) == 1
    e = errs[0]
    assert isinstance(e, ig.OutOfBoundsError)
    assert e.side == "after" and e.offset == 4096 and e.last_offset == 4159 and e.damaged == 64
    assert e.nbytes == 4096 and e.tag == "torch" and e.found == b"\x07" * 16 and e.when == "on free"
    text = str(e)
    assert "past the end of a 4096-byte tensor" in text and "07 07 07" in text and "expected 0xfd" in text
    assert f'{os.path.basename(__file__)}", line {_site_line()}' in text  # the allocation site
    assert tg.reports() == [e] and e.count == 1
    del keep


@pytest.mark.gpu
def test_a_framework_streams_check_batches_go_straight_to_the_driver(guard, dev):
    """PyTorch's streams are not the backend's (adopted by handle): their check batches' copies,
    launches and event record still go straight to the driver while a context of the device is
    current, and find the same damage."""
    from cuda.bindings import driver as cu
    err, raw = cu.cuStreamCreate(1)  # a stream the backend did not make, as PyTorch's are
    assert int(err) == 0
    s = ig.Stream.from_handle(int(raw), dev)
    try:
        before = guard._checker.direct_batches
        p = alloc(4096, s)
        keep = write(p + 4096, b"\x07" * 8, s)
        free(p, 4096, s)
        (e,) = tg.check(raise_=False)
        assert isinstance(e, ig.OutOfBoundsError)
        assert (e.side, e.offset, e.last_offset, e.damaged, e.found[:8]) == ("after", 4096, 4103, 8, b"\x07" * 8)
        assert guard._checker.direct_batches > before
        del keep
    finally:
        tg._reset()  # (its checks waited for) before the stream goes
        s.synchronize()
        cu.cuStreamDestroy(raw)


def test_write_before_the_start_is_reported(guard, streams):
    s = streams[0]
    p = alloc(256, s)
    write(p - 16, b"\x03" * 16, s)
    free(p, 256, s)
    with pytest.raises(ig.OutOfBoundsError, match="before the start of a 256-byte tensor") as ei:
        tg.check()
    assert ei.value.side == "before" and ei.value.offset == -16 and ei.value.last_offset == -1


def test_live_damage_is_found_by_check_and_reported_once(guard, streams):
    s = streams[0]
    p = alloc(1024, s)
    write(p + 1024 + 100, b"\x01", s)
    with pytest.raises(ig.OutOfBoundsError, match="by check"):
        tg.check()
    assert tg.check(raise_=False) == []  # the same damage is not reported again
    free(p, 1024, s)
    assert tg.check(raise_=False) == []
    assert len(tg.reports()) == 1


def test_write_after_free_is_reported_when_it_leaves_the_quarantine(guard, streams):
    s = streams[0]
    p = alloc(2048, s)
    free(p, 2048, s)
    write(p + 100, b"\x2a" * 8, s)  # through a stale pointer
    errs = guard.flush(raise_=False)
    assert len(errs) == 1 and isinstance(errs[0], ig.UseAfterFreeError)
    e = errs[0]
    assert e.side == "after-free" and e.offset == 100 and e.last_offset == 107 and e.damaged == 8
    assert e.found[:8] == b"\x2a" * 8 and e.found[8:] == bytes([POISON]) * 8
    assert "written after it was freed" in str(e) and "allocated at" in str(e)
    # the check repaired the block: it goes back to the pool intact and is reused as is
    q = alloc(2048, s)
    assert q == p and read(q, 2048, s) == bytes([POISON]) * 2048
    free(q, 2048, s)


def test_write_after_free_is_found_by_check_while_quarantined(guard, streams):
    s = streams[0]
    p = alloc(512, s)
    free(p, 512, s)
    write(p, b"\x00" * 4, s)
    with pytest.raises(ig.UseAfterFreeError, match="waits in the quarantine"):
        tg.check()


def test_reads_of_never_written_memory_show_the_poison(guard, streams):
    s = streams[0]
    p = alloc(4096, s)
    assert read(p, 4096, s) == bytes([POISON]) * 4096
    write(p, b"\x00" * 100, s)
    blk = tg._s.blocks[p]
    assert guard.first_poisoned_offset(blk, s) == 100
    free(p, 4096, s)


def test_reports_are_grouped_by_site(guard, streams):
    s = streams[0]
    for _ in range(3):
        p = alloc(128, s)
        write(p + 128, b"\x09", s)
        free(p, 128, s)
    tg.check(raise_=False)
    (e,) = tg.reports()
    assert e.count == 3
    assert "1 problem(s) found (3 report(s)" in tg.summary()


def test_reports_join_the_sanitizer_list_when_it_collects(guard, streams):
    s = streams[0]
    ig.sanitizer.enable("collect")
    try:
        p = alloc(256, s)
        write(p + 256, b"\x05", s)
        free(p, 256, s)
        tg.check(raise_=False)
        reps = ig.sanitizer.reports()
        assert any(isinstance(r, ig.OutOfBoundsError) and "256-byte tensor" in str(r) for r in reps)
        assert tg.reports() == []  # one list: the sanitizer's
    finally:
        ig.sanitizer.sanitizer.clear()
        ig.sanitizer.disable()


# -- stream semantics --------------------------------------------------------------------
def test_record_stream_orders_the_free_after_the_other_streams_work(guard, streams):
    a, b = streams[0], streams[1]
    p = alloc(4096, a)
    assert tg.note_record_stream(p, b.handle, 0)
    sleep_on(b, 0.2)
    keep = write(p, b"\x07" * 4096, b)  # a correct late use on b, declared with record_stream
    free(p, 4096, a)  # the poison waits for b's work
    assert tg.check(raise_=False) == []
    assert read(p, 4096, a) == bytes([POISON]) * 4096
    del keep


def test_without_record_stream_the_late_use_is_a_write_after_free(guard, streams):
    a, b = streams[0], streams[1]
    p = alloc(4096, a)
    sleep_on(b, 0.2)
    keep = write(p, b"\x07" * 4096, b)  # nothing tells the allocator about b
    free(p, 4096, a)  # the poison lands at once; b's write comes after it
    b.synchronize()
    errs = guard.flush(raise_=False)
    assert errs and isinstance(errs[0], ig.UseAfterFreeError)
    del keep


MEMSET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p)
MEMSET32 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
CTXDEV = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))


def _bind_c_poison(dev, *, words: bool, fail32: list | None = None):
    """Stand-ins for cuMemsetD8Async / cuCtxGetDevice (and, with ``words``, cuMemsetD32Async)
    that queue the memsets through the active backend and record each call; bound as the C
    free's own poison. ``fail32``: a one-element list, true while the 32-bit memset fails."""
    calls: list[tuple] = []
    current = [0]

    def memset(ptr, value, n, stream):
        calls.append((ptr, value, n, stream or 0))
        dev.backend.memset_d8_async(ptr, value, n, stream or dev.default_stream.handle)
        return 0

    def memset32(ptr, value, n, stream):
        calls.append(("d32", ptr, value, n, stream or 0))
        if fail32 and fail32[0]:
            return 1  # CUDA_ERROR_INVALID_VALUE
        dev.backend.memset_d32_async(ptr, value, n, stream or dev.default_stream.handle)
        return 0

    def ctx_device(out):
        out[0] = current[0]
        return 0

    fns = (MEMSET(memset), CTXDEV(ctx_device), MEMSET32(memset32))
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in fns]
    _fast.torch_guard_poison(addr[0], addr[1], POISON, tg._s.blocks, tg._s.rs_ptrs, addr[2] if words else 0)
    return calls, current, fns


@pytest.fixture
def c_poison(guard, dev):
    """The C free's own poison with byte-wise memsets only (no cuMemsetD32Async)."""
    calls, current, fns = _bind_c_poison(dev, words=False)
    yield calls, current
    _fast.torch_guard_poison(0, 0, -1, None, None)
    del fns


def test_the_c_free_poisons_aligned_words_word_wide(guard, streams, dev):
    fail32 = [False]
    calls, _, fns = _bind_c_poison(dev, words=True, fail32=fail32)
    try:
        s, h = streams[0], streams[0].handle
        word = POISON * 0x01010101
        for n in (4096, 4099, (1 << 17) + 3):  # whole words; a small odd size; a large odd size
            p = alloc(n, s)
            write(p, b"\x11" * n, s)
            del calls[:]
            free(p, n, s)
            assert read(p, n, s) == bytes([POISON]) * n, n
            if n == 4096:
                assert calls == [("d32", p, word, 1024, h)]
            elif n == 4099:
                assert calls == [(p, POISON, 4099, h)]  # below the split: one byte-wise memset
            else:
                assert calls == [("d32", p, word, n >> 2, h), (p + (n & ~3), POISON, 3, h)]
        assert tg.check(raise_=False) == []
        fail32[0] = True  # the driver refuses the 32-bit memset: the Python free poisons the block
        p = alloc(4096, s)
        write(p, b"\x11" * 4096, s)
        free(p, 4096, s)
        assert read(p, 4096, s) == bytes([POISON]) * 4096
        assert tg.check(raise_=False) == []
    finally:
        _fast.torch_guard_poison(0, 0, -1, None, None)
        del fns


def test_the_c_free_queues_the_poison_itself(guard, streams, c_poison):
    calls, _ = c_poison
    s = streams[0]
    p = alloc(4096, s)
    write(p, b"\x11" * 4096, s)
    free(p, 4096, s)
    assert calls == [(p, POISON, 4096, s.handle)]
    assert read(p, 4096, s) == bytes([POISON]) * 4096
    assert tg.check(raise_=False) == []
    free(0x5000 * 256, 64, s)  # not a guarded block: never touched
    assert len(calls) == 1


def test_the_c_free_leaves_record_stream_blocks_and_other_devices_to_python(guard, streams, c_poison):
    calls, current = c_poison
    a, b = streams[0], streams[1]
    p = alloc(4096, a)
    tg.note_record_stream(p, b.handle, 0)
    sleep_on(b, 0.1)
    keep = write(p, b"\x07" * 4096, b)
    free(p, 4096, a)  # the poison must wait for b: Python queues it after the wait
    assert calls == []
    assert read(p, 4096, a) == bytes([POISON]) * 4096 and tg.check(raise_=False) == []
    current[0] = 1  # the thread's context is another device's
    q = alloc(512, a)
    free(q, 512, a)
    assert calls == [] and read(q, 512, a) == bytes([POISON]) * 512
    del keep


def test_running_out_empties_the_quarantine_and_retries(guard, streams, backend):
    s = streams[0]
    n = 12 << 20  # over 10 MiB: a pool segment of its own
    p = alloc(n, s)
    free(p, n, s)
    assert guard.quarantined_count == 1
    op = "mem_alloc_async" if isinstance(guard.upstream.upstream, ig.AsyncResource) else "mem_alloc"
    backend.inject_fault(op, 1, times=2)  # the pool's attempt and its own retry fail
    q = alloc(n, s)  # served by the block the guard's drain gave back
    assert q == p and guard.quarantined_count == 0
    assert op not in backend.armed_faults()  # both injected failures happened
    free(q, n, s)
    assert tg.check(raise_=False) == []


def test_record_stream_of_unknown_pointers_is_ignored(guard, streams):
    assert tg.note_record_stream(0x1234 * 256, streams[0].handle) is False


def test_a_free_from_inside_the_allocator_is_deferred(guard, streams):
    s = streams[0]
    p = alloc(256, s)
    tg._s.tls.busy = True  # as if the garbage collector ran a tensor's free inside _alloc
    try:
        free(p, 256, s)
        assert p in tg._s.blocks and tg._s.deferred
    finally:
        tg._s.tls.busy = False
    q = alloc(256, s)  # the deferred free runs when the outer call ends
    assert p not in tg._s.blocks and not tg._s.deferred
    free(q, 256, s)


def test_synchronize_points_queue_and_read_checks(guard, streams):
    s = streams[0]
    p = alloc(300, s)
    write(p + 300, b"\x01", s)
    tg._s.note_live_check(0.0)
    tg._on_sync()  # a live-guard check is due
    s.synchronize()
    time.sleep(0.05)
    tg._on_sync()
    assert any(isinstance(e, ig.OutOfBoundsError) and "at a synchronize point" in str(e) for e in tg.reports())
    free(p, 300, s)


# -- memory views ------------------------------------------------------------------------
def test_statistics_and_snapshot_cover_the_guarded_blocks(guard, streams):
    s = streams[0]
    p = alloc(10000, s)
    st = guard_memory_stats(0)
    assert st["guard.live_bytes"] == 10000 and st["allocated_bytes.all.current"] >= 10000 + 2 * G
    assert ig.get_current_resource(0) is guard  # Ignis's own statistics see it as the device's resource
    snap = ig.snapshot()
    blocks = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert any(b["requested_size"] == 10000 for b in blocks)
    free(p, 10000, s)


def test_torch_memory_functions_answer_with_the_guard_statistics(guard, streams):
    # patch_memory_stats: the guard installs what telemetry (ignis.torch.memory_views) returns
    import types

    torch = types.ModuleType("torch")
    torch.cuda = types.ModuleType("torch.cuda")
    torch.cuda.memory = types.ModuleType("torch.cuda.memory")
    torch.cuda.current_device = lambda: 0
    torch.cuda._utils = types.SimpleNamespace(_get_device_index=lambda d, optional=True: int(d))
    for name in ("memory_stats", "memory_summary", "reset_peak_memory_stats"):
        setattr(torch.cuda.memory, name, None)
        setattr(torch.cuda, name, None)
    tg._patch_memory_views(torch)
    assert set(tg._s.saved) >= {"torch.cuda.memory_stats", "torch.cuda.memory.memory_summary"}
    s = streams[0]
    p = alloc(5000, s)
    for stats in (torch.cuda.memory_stats(), torch.cuda.memory.memory_stats(0)):
        assert stats["guard.live_bytes"] == 5000 and stats["allocated_bytes.all.current"] >= 5000 + 2 * G
        assert list(stats) == sorted(stats)
    assert "Quarantined" in torch.cuda.memory_summary(0)
    free(p, 5000, s)
    assert torch.cuda.memory_stats()["guard.live_bytes"] == 0


# -- the compiled hot path (ignis/torch/_guard_fast.pyx) ------------------------------------
def test_the_entry_points_are_exported_by_the_compiled_module():
    # PyTorch's CUDAPluggableAllocator finds them by name in the dynamic symbols of that library
    assert callable(_lib.ignis_torch_alloc) and callable(_lib.ignis_torch_free)
    nm = shutil.which("nm")
    if nm is not None:
        out = subprocess.run([nm, "-D", "--defined-only", _fast.__file__], capture_output=True, text=True).stdout
        kinds = {f[-1]: f[-2] for f in (line.split() for line in out.splitlines()) if len(f) >= 2}
        assert kinds.get("ignis_torch_alloc") == "T" and kinds.get("ignis_torch_free") == "T", out
    compiled = [p for p in pathlib.Path(ig.__file__).parent.rglob("*.so") if p.name != pathlib.Path(_fast.__file__).name]
    assert compiled and not any(hasattr(ctypes.CDLL(str(p)), "ignis_torch_alloc") for p in compiled)  # one home


def test_the_guards_hot_path_is_the_compiled_one():
    from ignis.memory.guard_base import GuardBase
    # One guard, in the memory layer: the deferred guard is the debug guard (no second base), and
    # the allocation (both modes), the deferred free and the return of checked blocks are compiled there.
    assert tg.DeferredGuardResource is ig.DeferredGuardResource
    assert tg.DeferredGuardResource.__bases__ == (ig.DebugGuardResource,)
    for name in ("allocate", "free_fast", "_release_exits"):
        assert getattr(tg.DeferredGuardResource, name) is GuardBase.__dict__[name]
        assert getattr(ig.DebugGuardResource, name) is GuardBase.__dict__[name]
    for name in ("_held", "_overflow", "_take_quarantine"):  # the quarantine's bookkeeping: one, compiled
        assert not any(name in c.__dict__ for c in tg.DeferredGuardResource.__mro__
                       if c.__module__ not in ("ignis.memory.guard_base",))
    for name in ("_oob", "_after_free"):  # one report path for both modes
        assert name in ig.DebugGuardResource.__dict__ and name not in tg.DeferredGuardResource.__dict__
    # The frameworks' allocate and free: the front's, compiled (PyTorch's entry points and CuPy's
    # allocator call the same two).
    assert tg._alloc is guard_alloc.alloc and tg._free is guard_alloc.free and tg._s is guard_alloc.state
    assert guard_alloc.__file__.endswith((".so", ".pyd")) and _fast.__file__.endswith((".so", ".pyd"))


def test_the_compiled_free_keeps_double_free_detection(guard, streams):
    s = streams[0]
    b = guard.allocate(1000, s, "torch", ())
    guard.free_fast(b)
    assert b.state is ig.BlockState.QUARANTINED and guard.quarantined_count == 1
    with pytest.raises(ig.DoubleFreeError):
        guard.free_fast(b)
    with pytest.raises(ig.DoubleFreeError):
        guard.deallocate(b)
    guard.flush()  # checked, then back in the pool
    assert b.state is ig.BlockState.FREED
    with pytest.raises(ig.DoubleFreeError):
        guard.free_fast(b)
    assert guard.bytes_outstanding == 0 and guard.quarantined_count == 0 and guard.quarantined_bytes == 0
    assert tg.check(raise_=False) == []


@pytest.mark.parametrize("guard", [{"batch": 4, "quarantine_count": 3}], indirect=True)
def test_the_compiled_free_keeps_the_quarantine_bound_and_its_counts(guard, streams):
    s = streams[0]
    blocks = [guard.allocate(512 * (i + 1), s, "torch", ()) for i in range(8)]
    for i, b in enumerate(blocks):
        guard.free_fast(b)
        held = list(guard._quarantine.values())
        assert [e.block for e in held] == blocks[max(0, i - 2):i + 1]  # the oldest leave first
        assert guard.quarantined_bytes == sum(e.block.requested + 2 * G for e in held)
    assert guard.bytes_outstanding == 0
    assert tg.check(raise_=False) == []  # every check queued and waited for
    assert all(b.state is ig.BlockState.FREED for b in blocks[:5]) and not guard._held_exit
    assert all(b.state is ig.BlockState.QUARANTINED for b in blocks[5:])


@pytest.mark.parametrize("guard", [{"batch": 4, "quarantine_bytes": 2 * (4096 + 2 * G)}], indirect=True)
def test_the_compiled_free_keeps_the_quarantine_byte_bound(guard, streams):
    s = streams[0]
    small = [guard.allocate(4096, s, "torch", ()) for _ in range(3)]
    for b in small:
        guard.free_fast(b)
    assert guard.quarantined_count == 2 and guard.quarantined_bytes == 2 * (4096 + 2 * G)
    big = guard.allocate(3 * 4096, s, "torch", ())
    guard.free_fast(big)  # larger than the whole quarantine: it skips it rather than emptying it
    assert guard.quarantined_count == 2 and [e.block for e in guard._quarantine.values()] == small[1:]
    assert tg.check(raise_=False) == []
    assert big.state is ig.BlockState.FREED and small[0].state is ig.BlockState.FREED


@pytest.mark.parametrize("guard", [{"batch": 4, "quarantine_count": 1 << 70, "quarantine_bytes": 1 << 80}],
                         indirect=True)
def test_quarantine_bounds_beyond_any_size_hold_every_block(guard, streams):
    s = streams[0]
    blocks = [guard.allocate(4096, s, "torch", ()) for _ in range(5)]
    for b in blocks:
        guard.free_fast(b)
    assert guard.quarantined_count == 5 and all(b.state is ig.BlockState.QUARANTINED for b in blocks)
    assert guard.flush(raise_=False) == [] and guard.quarantined_count == 0


def test_a_released_block_and_its_record_go_without_the_garbage_collector(guard, streams):
    s = streams[0]
    gc.disable()
    try:
        b = guard.allocate(256, s, "torch", ())
        ref = weakref.ref(b)
        guard.free_fast(b)
        del b
        guard.flush()  # checked and back in the pool: nothing refers to the block any more
        assert ref() is None
    finally:
        gc.enable()


def test_the_busy_flag_is_the_threads_own(guard, streams):
    s = streams[0]
    p = alloc(256, s)
    seen = []

    def inside_the_allocator_elsewhere() -> None:
        seen.append(tg._s.tls.busy)
        tg._s.tls.busy = True

    t = threading.Thread(target=inside_the_allocator_elsewhere)
    t.start()
    t.join()
    assert seen == [False] and tg._s.tls.busy is False
    free(p, 256, s)  # this thread is not inside the allocator: freed at once
    assert p not in tg._s.blocks and not tg._s.deferred


def test_the_entry_points_call_other_bound_callables_with_plain_ints(guard, streams):
    s = streams[0]
    calls = []

    def a(size, device, handle):
        calls.append(("alloc", size, device, handle))
        return tg._alloc(size, device, handle)

    def f(ptr, size, device, handle, poisoned):
        calls.append(("free", ptr, size, device, handle, poisoned))
        tg._free(ptr, size, device, handle, poisoned)

    before = _fast.torch_guard_bind(a, f)
    try:
        p = alloc(300, s)
        free(p, 300, s)
    finally:
        after = _fast.torch_guard_bind(tg._alloc, tg._free)
    assert calls == [("alloc", 300, 0, s.handle), ("free", p, 300, 0, s.handle, False)]
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    assert guard.bytes_outstanding == 0 and guard.quarantined_count == 1
    with pytest.raises(TypeError, match="two callables"):
        _fast.torch_guard_bind(1, 2)


def test_a_failed_allocation_raises_in_the_caller_and_a_failed_free_is_unraisable(guard, streams, monkeypatch):
    s = streams[0]

    def no_room(size, device, handle):
        raise MemoryError("no room")

    def refused(*args):
        raise RuntimeError("free refused")

    _fast.torch_guard_bind(no_room, refused)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    try:
        with pytest.raises(SystemError) as ei:  # what the framework's call raises: the error, as its cause
            c_alloc(256, 0, s.handle)
        assert isinstance(ei.value.__cause__, MemoryError) and str(ei.value.__cause__) == "no room"
        c_free(0x4000 * 256, 256, 0, s.handle)  # a free has nobody to raise to
    finally:
        _fast.torch_guard_bind(tg._alloc, tg._free)
    assert len(unraisable) == 1 and isinstance(unraisable[0].exc_value, RuntimeError)


def test_an_allocation_nothing_can_serve_fails_with_the_pools_error(guard, streams, backend, capsys):
    s = streams[0]
    n = 12 << 20  # a pool segment of its own
    op = "mem_alloc_async" if isinstance(guard.upstream.upstream, ig.AsyncResource) else "mem_alloc"
    backend.inject_fault(op, 1, times=2)  # the pool's attempt and its own retry fail; the quarantine is empty
    with pytest.raises(SystemError) as ei:
        c_alloc(n, 0, s.handle)
    assert isinstance(ei.value.__cause__, ig.OutOfMemoryError)
    assert f"ignis guard: allocating {n} bytes on device 0 failed: OutOfMemoryError" in capsys.readouterr().err
    assert guard.bytes_outstanding == 0 and not tg._s.blocks


# -- options and installation --------------------------------------------------------------
@pytest.mark.parametrize("opts, match", [
    ({"batch": 0}, "batch"), ({"batch": 5000}, "batch"), ({"poison": 256}, "byte value"),
    ({"poison": 7, "canary": 7}, "differ"), ({"quarantine_count": -1}, "non-negative"),
    ({"sync_check_interval": -1}, "sync_check_interval"), ({"stack_depth": 0}, "stack_depth"),
    ({"tag": 3}, "tag"), ({"bogus": 1}, "unknown guard option"), ({"ready_limit": -1}, "non-negative"),
])
def test_options_are_checked(opts, match):
    with pytest.raises(tg.GuardError, match=match):
        guard_front._options(opts)


def test_a_reset_keeps_the_maps_the_compiled_poison_path_holds():
    # torch_guard_poison binds the front's block map and record_stream set: a reset empties
    # them in place rather than replacing them, so the compiled path never reads stale maps
    st = guard_alloc.state
    blocks, rs = st.blocks, st.rs_ptrs
    blocks[0x1000] = "a block"
    rs.add(0x1000)
    guard_front.reset()
    assert guard_alloc.state.blocks is blocks and guard_alloc.state.rs_ptrs is rs
    assert not blocks and not rs and guard_front._printed == 0


def test_one_set_of_options_per_process():
    tg._reset()
    try:
        tg._configure({"batch": 8})
        tg._configure({"batch": 8})
        tg._configure({})
        with pytest.raises(tg.GuardError, match="other options"):
            tg._configure({"batch": 16})
    finally:
        tg._reset()


def test_use_guard_refuses_a_torch_without_cuda():
    torch = pytest.importorskip("torch", reason="needs PyTorch (its CPU build will do)")
    if hasattr(torch._C, "_cuda_customAllocator"):
        pytest.skip("this PyTorch has CUDA")
    tg._reset()
    try:
        with pytest.raises(tg.GuardError, match="built without CUDA"):
            tg.use_guard()
    finally:
        tg._reset()


def test_use_guard_too_late_is_a_clear_error(monkeypatch):
    torch = pytest.importorskip("torch", reason="needs PyTorch (its CPU build will do)")
    monkeypatch.setattr(torch._C, "_cuda_customAllocator", lambda *a: None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    tg._reset()
    try:
        with pytest.raises(tg.GuardError, match="came too late.*before any CUDA work.*ignis run --guard"):
            tg.use_guard()
    finally:
        tg._reset()


def _wrapper(*args: str, script: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """``ignis run [flags] script`` in a child process (the unmodified program, as a user runs it)."""
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ignis", "run", *args, script],
                          capture_output=True, text=True, env=env, timeout=240)


def test_a_script_without_cuda_runs_unchanged(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import sys\nprint('plain', sum(range(10)))\nprint('torch' in sys.modules)\n")
    r = _wrapper("--guard", script=str(script))
    assert r.returncode == 0, r.stderr
    assert "plain 45" in r.stdout and "False" in r.stdout  # torch never imported by the guard


def test_a_torch_cpu_script_runs_unchanged_under_the_guard():
    pytest.importorskip("torch", reason="needs PyTorch (its CPU build will do)")
    r = _wrapper("--guard", script=os.path.join(ZOO, "zoo_nocuda.py"))
    assert r.returncode == 0, r.stderr
    assert "ZOO cpu" in r.stdout and "problem" not in r.stderr.replace("no problems", "")


# -- GPU: the zoo ------------------------------------------------------------------------------
def _zoo(name: str, *flags: str) -> subprocess.CompletedProcess:
    return _wrapper(*flags, script=os.path.join(ZOO, name), env_extra={"IGNIS_BACKEND": "cuda"})


def _site(name: str, marker: str) -> str:
    with open(os.path.join(ZOO, name)) as f:
        for i, line in enumerate(f, 1):
            if f"SITE:{marker}" in line:
                return f'{name}", line {i}'
    raise AssertionError(marker)


def _gpu_zoo_ready() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("cupy")


@pytest.mark.gpu
def test_zoo_raw_kernel_on_a_torch_tensor_past_the_end_and_before_the_start():
    _gpu_zoo_ready()
    r = _zoo("zoo_oob_torch.py", "--guard")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "past the end of a 4096-byte tensor" in out and _site("zoo_oob_torch.py", "a") in out
    assert "before the start of a 1024-byte tensor" in out and _site("zoo_oob_torch.py", "c") in out
    assert "found 00 00 e0 40" in out  # 7.0f, the bytes the kernel wrote


@pytest.mark.gpu
def test_zoo_cupy_array_raw_and_elementwise_kernels():
    _gpu_zoo_ready()
    r = _zoo("zoo_oob_cupy.py", "--guard")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "past the end of a 4000-byte array" in out and _site("zoo_oob_cupy.py", "x") in out
    assert "past the end of a 1024-byte array" in out and _site("zoo_oob_cupy.py", "y") in out


@pytest.mark.gpu
def test_zoo_write_through_a_stale_tensor_after_free():
    _gpu_zoo_ready()
    r = _zoo("zoo_uaf.py", "--guard")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "UseAfterFreeError" in out and "written after it was freed" in out
    assert _site("zoo_uaf.py", "t") in out


@pytest.mark.gpu
def test_zoo_read_of_torch_empty_shows_the_poison():
    _gpu_zoo_ready()
    r = _zoo("zoo_uninit.py", "--guard")
    out = r.stdout + r.stderr
    assert "ZOO poison seen: True" in out, out
    r2 = _zoo("zoo_uninit.py", "--guard", "--sanitize")  # with the op front end: reported
    out2 = r2.stdout + r2.stderr
    assert "ZOO poison seen: True" in out2, out2
    assert re.search(r"nothing wrote|UninitializedRead", out2) and _site("zoo_uninit.py", "x") in out2, out2


@pytest.mark.gpu
def test_zoo_training_loop_same_loss_and_no_report():
    _gpu_zoo_ready()
    plain = _zoo("zoo_train.py")
    guarded = _zoo("zoo_train.py", "--guard")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert guarded.returncode == 0, guarded.stdout + guarded.stderr

    def loss(r: subprocess.CompletedProcess) -> float:
        return float(re.search(r"ZOO loss ([-\d.e]+)", r.stdout).group(1))

    assert abs(loss(plain) - loss(guarded)) <= 1e-5 * max(1.0, abs(loss(plain)))
    assert "ignis guard: no problems found" in guarded.stderr
    assert "ZOO guarded True" in guarded.stdout and "ZOO guarded False" in plain.stdout
    assert re.search(r"ZOO memory_allocated [1-9]", guarded.stdout)  # answered by Ignis's statistics
    assert re.search(r"ZOO snapshot blocks [1-9]", guarded.stdout)


# -- CUDA graphs: a capturing stream's memory is its graph pool's, unguarded -----------------------
def test_a_capturing_streams_memory_is_its_graph_pools_and_nothing_is_queued_on_it(guard, streams, dev):
    s, other = streams[0], streams[1]
    made = []

    def graph_memory(device, size):  # what _guard._graph_memory does with the driver
        ptr = dev.backend.mem_alloc(0, max(512, size))
        made.append(ptr)
        return ptr

    tg._s.bind(graph_alloc=graph_memory)
    outside = alloc(1024, s)                       # a guarded block of the stream, before the capture
    guard_alloc.graph_begin(0, s.handle, (1, 0))
    jobs = guard._checker.jobs
    p = alloc(4096, s)                             # inside the capture: the pool's, unguarded
    assert p not in tg._s.blocks and tg._s.graph_blocks[p] == (0, (1, 0), 4096)
    free(p, 4096, s)                               # freed inside the capture: kept for the pool
    assert alloc(4096, s) == p and len(made) == 1  # the pool takes it again
    q = alloc(2048, other)                         # another stream: guarded as ever
    assert q in tg._s.blocks
    free(outside, 1024, s)                         # a guarded block of the capturing stream: waits
    assert outside in tg._s.blocks and tg._s.after_capture and guard._checker.jobs == jobs
    guard_alloc.graph_end(0, s.handle)
    assert outside not in tg._s.blocks and not tg._s.after_capture   # freed (and poisoned) now
    r = alloc(4096, s)                             # after the capture: guarded again, not the pool's memory
    assert r in tg._s.blocks and r != p
    free(r, 4096, s)
    free(q, 2048, other)
    free(p, 4096, s)                               # the graph's memory never goes to the guard's pool
    assert tg._s.graph_free[(0, (1, 0))][4096] == [p] and p not in tg._s.blocks
    assert tg.check(raise_=False) == [] and tg.reports() == []
    for ptr in made:
        dev.backend.mem_free(0, ptr)


def test_a_block_freed_while_another_stream_is_current_is_poisoned_at_its_streams_next_work(guard, streams):
    # PyTorch hands a freed block only to its own stream's later work (FSDP2 frees gradients of its
    # reduce-scatter stream from the default stream while the optimizer may still read them): the
    # guard's poison, a write, waits for that point too.
    s, other = streams[0], streams[1]
    p = alloc(4096, s)
    write(p, b"\x11" * 4096, s)
    tg._s.bind(current_stream=lambda device: other.handle)  # the program's current stream: not s
    try:
        free(p, 4096, s)
        assert read(p, 4096, s) == b"\x11" * 4096          # not poisoned yet
        assert guard._unpoisoned_n == 1
        q = alloc(256, s)                                   # s's next work: the poison goes first
        assert guard._unpoisoned_n == 0
        assert read(p, 4096, s) == bytes([POISON]) * 4096
        free(q, 256, s)
    finally:
        tg._s.bind(current_stream=None)
    guard.flush()
    assert tg.reports() == []


def test_a_late_poison_is_queued_before_the_checks_that_read_it(guard, streams):
    s, other = streams[0], streams[1]
    ptrs = [alloc(512, s) for _ in range(3)]
    tg._s.bind(current_stream=lambda device: other.handle)
    try:
        for p in ptrs:
            free(p, 512, s)
    finally:
        tg._s.bind(current_stream=None)
    assert guard.flush(raise_=False) == []                  # the exit checks find the poison in place
    assert guard._unpoisoned_n == 0 and tg.reports() == []


# -- the final check ----------------------------------------------------------------------
def test_the_final_check_runs_the_checks_of_a_closed_stream(guard, dev):
    """A block freed on a stream queues its check in that stream's batch; the program then
    writes into it and closes the stream. The final check still runs that batch (on the default
    stream, after the device's work) and finds the write."""
    import io as _io
    s = dev.create_stream()
    blk = guard.allocate(1024, s)  # as an Ignis array on s allocates under ``ignis run --guard``
    guard.deallocate(blk)
    dev.backend.memset_d8_async(blk.ptr, 7, 16, s.handle)  # a write after free
    s.synchronize()
    s.close()
    out = _io.StringIO()
    n = tg.finish(out)
    text = out.getvalue()
    assert n >= 1 and "UseAfterFreeError" in text and "written after it was freed" in text, text
    assert "failed" not in text and "no problems found" not in text, text


def test_a_failed_step_of_the_final_check_does_not_skip_the_rest(guard, streams, backend):
    """The flush's wait fails: that is reported and counted, and the check after it still runs
    and reads the batch the failed wait left in flight."""
    import io as _io
    s = streams[0]
    p = alloc(1024, s)
    free(p, 1024, s)
    s.device.backend.memset_d8_async(p, 7, 16, s.handle)
    backend.inject_fault("event_synchronize", nth=1)
    out = _io.StringIO()
    n = tg.finish(out)
    text = out.getvalue()
    assert "final flush of the quarantine on device 0 failed" in text, text
    assert "UseAfterFreeError" in text and "written after it was freed" in text, text
    assert n >= 2 and "no problems found" not in text


@pytest.fixture
def autotuner(monkeypatch):
    """PyTorch's cuDNN autotuner setting, as the guard finds it before it comes: (torch, its cudnn
    module, the guard's PyTorch adapter, the real setter). Everything the guard replaces is put
    back after the test, and the setting as it was."""
    torch = pytest.importorskip("torch")
    import torch.backends.cudnn as cudnn
    from ignis.torch import _guard

    real_set = torch._C._set_cudnn_benchmark
    monkeypatch.setattr(torch._C, "_set_cudnn_benchmark", real_set)
    monkeypatch.setattr(type(cudnn), "benchmark", type(cudnn).__dict__["benchmark"])
    monkeypatch.setattr(_guard, "_cudnn_asked", [False])
    monkeypatch.delitem(_guard._s.saved, "torch._C._set_cudnn_benchmark", raising=False)
    was = torch._C._get_cudnn_benchmark()
    try:
        yield torch, cudnn, _guard, real_set
    finally:
        real_set(was)
        _guard._s.saved.pop("torch._C._set_cudnn_benchmark", None)


def test_the_guard_keeps_cudnns_autotuner_off_and_says_so(autotuner):
    # With the autotuner on, PyTorch's convolutions ask the allocator for its largest free block,
    # which a pluggable allocator refuses (the first convolution fails): every way to turn it on
    # leaves it off under the guard, and the summary says the program asked for it.
    torch, cudnn, _guard, real_set = autotuner
    real_set(False)
    _guard._no_cudnn_benchmark(cudnn)
    assert "autotuner" not in _guard._graph_note()
    torch.backends.cudnn.benchmark = False
    assert not _guard._cudnn_asked[0]
    torch.backends.cudnn.benchmark = True
    assert torch.backends.cudnn.benchmark is False and not torch._C._get_cudnn_benchmark()
    assert _guard._cudnn_asked[0]
    assert "torch.backends.cudnn.benchmark = True) was off" in _guard._graph_note()
    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        assert not torch._C._get_cudnn_benchmark()


def test_the_guard_turns_off_an_autotuner_the_program_turned_on_before_it(autotuner):
    torch, cudnn, _guard, real_set = autotuner
    real_set(True)
    _guard._no_cudnn_benchmark(cudnn)
    assert not torch._C._get_cudnn_benchmark() and _guard._cudnn_asked[0]
