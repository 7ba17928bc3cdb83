"""DebugGuardResource: canaries, poison and quarantine, parametrized over its upstream."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ignis as ig
import ignis.backends.emulated  # noqa: F401 - tests build emulated backends
from helpers import pinned, read, read_after_slow_write, read_into, sleep_on, write
from ignis.memory import Access, BlockState, history

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE
G = 256  # default guard size per side
POISON, CANARY = 0xA5, 0xFD


UPSTREAMS = ["pool_direct", "pool_async", "direct"]


def _upstream(dev, kind):
    if kind == "pool_async" and not dev.capabilities["memory_pools"]:
        pytest.skip("needs memory pools")
    return {"pool_direct": lambda: ig.PoolResource(ig.DirectResource(dev)),
            "pool_async": lambda: ig.PoolResource(ig.AsyncResource(dev)),
            "direct": lambda: ig.DirectResource(dev)}[kind]()


@pytest.fixture(params=UPSTREAMS)
def up(request, dev):
    return _upstream(dev, request.param)


@pytest.fixture
def guard(up):
    return ig.DebugGuardResource(up)


def upstream_bytes(mr) -> int:
    mr.upstream.reap_pending()
    return mr.upstream.bytes_outstanding


def tracks(mr) -> bool:
    return mr.supports_block_use_tracking


# -- layout -----------------------------------------------------------------------

def test_layout_guards_and_poison(guard, streams):
    s = streams[0]
    start = upstream_bytes(guard)
    b = guard.allocate(1000, s, tag="act")
    assert b.state is BlockState.LIVE and b.requested == b.bytes == 1000
    assert b.ptr % 256 == 0 and b.align >= 256 and b.tag == "act" and b.alloc_stream is s
    assert guard.bytes_outstanding == 1000
    assert guard.upstream.bytes_outstanding >= start + 1000 + 2 * G
    raw = read(b.ptr - G, 1000 + 2 * G, s)
    assert raw[:G] == bytes([CANARY]) * G
    assert raw[G:G + 1000] == bytes([POISON]) * 1000
    assert raw[G + 1000:] == bytes([CANARY]) * G
    other = guard.allocate(1000, s)
    assert other.generation > b.generation
    guard.deallocate(b)
    guard.deallocate(other)
    assert guard.bytes_outstanding == 0
    guard.flush()
    assert upstream_bytes(guard) == start


def test_options_are_validated_and_rounded(dev):
    up = ig.DirectResource(dev)
    assert ig.DebugGuardResource(up, canary_bytes=1).canary_bytes == 256
    assert ig.DebugGuardResource(up, canary_bytes=300).canary_bytes == 512
    with pytest.raises(ValueError, match="differ"):
        ig.DebugGuardResource(up, poison=7, canary=7)
    with pytest.raises(ValueError, match="byte value"):
        ig.DebugGuardResource(up, poison=256)
    with pytest.raises(ValueError, match="non-negative"):
        ig.DebugGuardResource(up, quarantine_count=-1)
    with pytest.raises(TypeError):
        ig.DebugGuardResource("pool")


def test_bad_requests_are_clear_errors(guard, streams):
    start = upstream_bytes(guard)
    with pytest.raises(ValueError, match="zero-byte"):
        guard.allocate(0, streams[0])
    with pytest.raises(TypeError, match="Stream"):
        guard.allocate(64, "stream0")
    assert upstream_bytes(guard) == start and guard.bytes_outstanding == 0


# -- poison: uninitialized reads ---------------------------------------------------

def test_fresh_block_holds_poison_until_written(guard, streams):
    s = streams[0]
    b = guard.allocate(4096, s)
    assert guard.holds_poison(b) and ig.holds_poison(b) and ig.holds_poison((b.ptr, 4096), s)
    assert guard.first_poisoned_offset(b) == 0
    k = write(b.ptr, b"\x01" * 100, s)
    assert not guard.holds_poison(b)
    assert guard.first_poisoned_offset(b) == 100
    assert ig.holds_poison((b.ptr + 100, 3996), s)  # the rest was never written
    k2 = write(b.ptr + 100, b"\x02" * 3996, s)
    assert guard.first_poisoned_offset(b) is None
    guard.deallocate(b)
    guard.flush()
    del k, k2


def test_holds_poison_sees_arrays(guard, streams):
    s = streams[0]
    a = ig.NvArray((256,), "float32", stream=s, mr=guard)
    assert ig.holds_poison(a) and guard.holds_poison(a)
    a.fill_(1.0)
    assert not guard.holds_poison(a) and guard.first_poisoned_offset(a) is None
    a.free()
    assert guard.bytes_outstanding == 0 and guard.quarantined_count == 1
    guard.flush()
    with pytest.raises(TypeError, match="DeviceBlock"):
        ig.holds_poison("buffer")


# -- out of bounds ----------------------------------------------------------------

def _check_oob(err, block, side, offset, nbytes):
    assert isinstance(err, ig.OutOfBoundsError)
    assert (err.ptr, err.tag, err.side, err.offset, err.generation) == \
        (block.ptr, block.tag, side, offset, block.generation)
    assert err.nbytes == nbytes
    assert "test_guard.py" in err.stack
    msg = str(err)
    assert f"{block.ptr:#x}" in msg and repr(block.tag) in msg and "allocated at" in msg


def test_write_past_the_end_detected_on_free(guard, streams):
    s = streams[0]
    start = upstream_bytes(guard)
    b = guard.allocate(1000, s, tag="overflow")
    k = write(b.ptr + 1000, b"\x00\x11\x22\x33", s)  # 4 bytes just past the request
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.deallocate(b)
    _check_oob(ei.value, b, "after", 1000, 1000)
    assert ei.value.last_offset == 1003 and ei.value.damaged == 4
    assert ei.value.found[:4] == b"\x00\x11\x22\x33"
    assert "past the end" in str(ei.value) and "test_write_past_the_end_detected_on_free" in str(ei.value)
    # The free completed: nothing is live, the block waits in quarantine, nothing leaks.
    assert b.state is BlockState.QUARANTINED and guard.bytes_outstanding == 0
    assert guard.flush() == []
    assert b.state is BlockState.FREED and upstream_bytes(guard) == start
    del k


def test_write_before_the_start_detected_on_free(guard, streams):
    s = streams[0]
    start = upstream_bytes(guard)
    b = guard.allocate(512, s, tag="underflow")
    k = write(b.ptr - 8, b"\x00" * 8, s)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.deallocate(b)
    _check_oob(ei.value, b, "before", -8, 512)
    assert ei.value.last_offset == -1 and "before the start" in str(ei.value)
    guard.flush()
    assert upstream_bytes(guard) == start
    del k


def test_check_finds_live_damage_and_changes_nothing(guard, streams):
    s = streams[0]
    good = guard.allocate(300, s, tag="good")
    b = guard.allocate(300, s, tag="bad")
    assert guard.check() == []
    k1 = write(b.ptr - 1, b"\x00", s)
    k2 = write(b.ptr + 300 + 10, b"\x00", s)
    problems = guard.check(raise_=False)
    assert [(p.side, p.offset) for p in problems] == [("before", -1), ("after", 310)]
    for p in problems:
        _check_oob(p, b, p.side, p.offset, 300)
        assert "check()" in str(p)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.check()
    assert ei.value.side == "before" and [o.side for o in ei.value.others] == ["after"]
    assert b.state is BlockState.LIVE and guard.bytes_outstanding == 600
    with pytest.raises(ig.OutOfBoundsError):
        guard.deallocate(b)  # still damaged when freed
    guard.deallocate(good)
    guard.flush()
    del k1, k2


def test_capture_stacks_off(up, streams):
    guard = ig.DebugGuardResource(up, capture_stacks=False)
    s = streams[0]
    b = guard.allocate(64, s)
    assert guard.stack_of(b) is None
    k = write(b.ptr + 64, b"\x00", s)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.deallocate(b)
    assert ei.value.stack is None and "allocated at" not in str(ei.value)
    guard.flush()
    del k


# -- quarantine: writes after free ----------------------------------------------------

def _check_uaf(err, block, offset):
    assert type(err) is ig.UseAfterFreeError
    assert (err.ptr, err.tag, err.side, err.offset, err.generation) == \
        (block.ptr, block.tag, "after-free", offset, block.generation)
    assert "test_guard.py" in err.stack
    msg = str(err)
    assert f"{block.ptr:#x}" in msg and "after it was freed" in msg and "allocated at" in msg


def test_write_after_free_detected_when_pushed_out(up, streams):
    guard = ig.DebugGuardResource(up, quarantine_count=2)
    s = streams[0]
    start = upstream_bytes(guard)
    a = guard.allocate(2048, s, tag="stale")
    guard.deallocate(a)
    assert a.state is BlockState.QUARANTINED
    k = write(a.ptr + 10, b"\x42\x43", s)  # through a pointer kept past the free
    b, c = guard.allocate(2048, s), guard.allocate(2048, s)
    assert a.ptr not in (b.ptr, c.ptr), "quarantined memory must not be reused"
    guard.deallocate(b)
    with pytest.raises(ig.UseAfterFreeError) as ei:
        guard.deallocate(c)  # pushes `a` out of the quarantine
    _check_uaf(ei.value, a, 10)
    assert ei.value.found[:2] == b"\x42\x43"
    assert a.state is BlockState.FREED and c.state is BlockState.QUARANTINED
    assert guard.quarantined_count == 2
    guard.flush()
    assert upstream_bytes(guard) == start
    del k


def test_write_after_free_detected_by_flush_and_check(guard, streams):
    s = streams[0]
    start = upstream_bytes(guard)
    a = guard.allocate(100, s, tag="late")
    b = guard.allocate(100, s)
    guard.deallocate(a)
    guard.deallocate(b)
    k = write(a.ptr + 99, b"\x00", s)
    found = guard.check(raise_=False)
    assert len(found) == 1
    _check_uaf(found[0], a, 99)
    assert a.state is BlockState.QUARANTINED  # check() moves nothing
    with pytest.raises(ig.UseAfterFreeError) as ei:
        guard.flush()
    _check_uaf(ei.value, a, 99)
    # Every block was handed back even though one failed.
    assert a.state is b.state is BlockState.FREED
    assert guard.quarantined_count == 0 and guard.quarantined_bytes == 0
    assert upstream_bytes(guard) == start
    del k


def test_freed_blocks_are_poisoned(guard, streams):
    s = streams[0]
    b = guard.allocate(1024, s)
    k = write(b.ptr, b"\x01" * 1024, s)
    guard.deallocate(b)
    assert read(b.ptr, 1024, s) == bytes([POISON]) * 1024
    guard.flush()
    del k


def test_quarantine_count_bound(up, streams):
    guard = ig.DebugGuardResource(up, quarantine_count=3)
    s = streams[0]
    start = upstream_bytes(guard)
    blocks = [guard.allocate(1000, s) for _ in range(5)]
    for b in blocks:
        guard.deallocate(b)
    assert [b.state for b in blocks] == [BlockState.FREED] * 2 + [BlockState.QUARANTINED] * 3
    assert guard.quarantined_count == 3 and guard.quarantined_bytes == 3 * (1000 + 2 * G)
    guard.flush()
    assert guard.quarantined_count == 0 and all(b.state is BlockState.FREED for b in blocks)
    assert upstream_bytes(guard) == start


def test_quarantine_bytes_bound(up, streams):
    held = 4096 + 2 * G
    guard = ig.DebugGuardResource(up, quarantine_bytes=2 * held + 100)
    s = streams[0]
    start = upstream_bytes(guard)
    blocks = [guard.allocate(4096, s) for _ in range(4)]
    for b in blocks:
        guard.deallocate(b)
    assert guard.quarantined_count == 2 and guard.quarantined_bytes == 2 * held
    assert [b.state for b in blocks] == [BlockState.FREED] * 2 + [BlockState.QUARANTINED] * 2
    big = guard.allocate(1 << 20, s)  # larger than the whole quarantine: skips it, pushes out nothing
    guard.deallocate(big)
    assert big.state is BlockState.FREED and guard.quarantined_count == 2
    guard.flush()
    assert upstream_bytes(guard) == start


def test_quarantine_off(up, streams):
    guard = ig.DebugGuardResource(up, quarantine_count=0)
    s = streams[0]
    start = upstream_bytes(guard)
    b = guard.allocate(64, s)
    guard.deallocate(b)
    assert b.state is BlockState.FREED and guard.quarantined_count == 0
    assert upstream_bytes(guard) == start


def test_closed_alloc_stream_is_handled(guard, dev):
    s = dev.create_stream()
    start = upstream_bytes(guard)
    b = guard.allocate(128, s)
    k = write(b.ptr + 128, b"\x00", s)
    s.close()
    with pytest.raises(ig.OutOfBoundsError):
        guard.deallocate(b)
    guard.flush()
    assert upstream_bytes(guard) == start
    del k


def test_closed_alloc_stream_after_cross_stream_use(guard, dev, streams):
    if not tracks(guard):
        pytest.skip("upstream does not track")
    s = dev.create_stream()
    start = upstream_bytes(guard)
    b = guard.allocate(4096, s)
    guard.prepare_block_use(b, streams[1], W)
    k = write(b.ptr, b"\x03" * 4096, streams[1])
    guard.finish_block_use(b, streams[1], W)
    s.close()
    guard.deallocate(b)
    guard.flush()
    assert upstream_bytes(guard) == start
    del k


# -- double free and foreign blocks ---------------------------------------------------

def test_double_free(guard, streams):
    b = guard.allocate(64, streams[0])
    guard.deallocate(b)
    with pytest.raises(ig.DoubleFreeError) as ei:
        guard.deallocate(b)  # while quarantined
    assert ei.value.generation == b.generation and "QUARANTINED" in str(ei.value)
    guard.flush()
    with pytest.raises(ig.DoubleFreeError):
        guard.deallocate(b)  # after it left
    assert guard.bytes_outstanding == 0


def test_foreign_blocks_are_refused(guard, dev, streams):
    other = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    b = other.allocate(64, streams[0])
    with pytest.raises(ValueError, match="not allocated by this"):
        guard.deallocate(b)
    raw = guard.upstream.allocate(64, streams[0])
    with pytest.raises(ValueError, match="not allocated by this"):
        guard.deallocate(raw)  # an upstream block is not a guarded one
    with pytest.raises(TypeError):
        guard.deallocate(b.id)
    guard.upstream.deallocate(raw)
    other.deallocate(b)
    other.flush()


# -- tracking -----------------------------------------------------------------------

def test_tracking_follows_the_upstream(guard, streams):
    assert tracks(guard) == guard.upstream.supports_block_use_tracking
    b = guard.allocate(64, streams[0])
    if tracks(guard):
        guard.prepare_block_use(b.id, streams[1], R)
        guard.finish_block_use(b.id, streams[1], R)
        guard.prepare_block_use(b, streams[1], W, (0, 16, "test"))
        guard.finish_block_use(b, streams[1], W)
        guard.record_block_use(b, streams[2])
    else:
        for call in (lambda: guard.prepare_block_use(b.id, streams[1], R),
                     lambda: guard.finish_block_use(b.id, streams[1], R),
                     lambda: guard.record_block_use(b, streams[1])):
            with pytest.raises(ig.StreamMisuseError, match="does not track"):
                call()
    guard.deallocate(b)
    guard.flush()


def test_stale_inner_id_is_use_after_free(guard, streams):
    if not tracks(guard):
        pytest.skip("upstream does not track")
    b = guard.allocate(64, streams[0])
    bid = b.id
    guard.deallocate(b)
    with pytest.raises(ig.UseAfterFreeError, match="quarantine") as ei:
        guard.prepare_block_use(bid, streams[1], R)
    assert ei.value.generation == bid.generation and ei.value.ptr == bid.ptr
    guard.flush()
    b2 = guard.allocate(64, streams[0])
    for call in (lambda: guard.finish_block_use(bid, streams[1], W),
                 lambda: guard.record_block_use(bid, streams[1])):
        with pytest.raises(ig.UseAfterFreeError):
            call()
    guard.prepare_block_use(b2.id, streams[1], R)  # the live one still works
    guard.finish_block_use(b2.id, streams[1], R)
    guard.deallocate(b2)
    guard.flush()


def test_cross_stream_read_waits_for_write(guard, streams):
    if not tracks(guard):
        pytest.skip("upstream does not track")
    a, b = streams[0], streams[1]
    blk = guard.allocate(4096, a)
    out, k = read_after_slow_write(guard, blk, a, b)
    assert (out == 7).all(), "the read on stream B ran before the write on stream A"
    guard.deallocate(blk)
    guard.flush()
    del k


def test_free_waits_for_a_late_write_elsewhere(guard, streams):
    # Stream B writes past the end late; the free (on A) must wait for it and see it.
    if not tracks(guard):
        pytest.skip("upstream does not track")
    a, b = streams[0], streams[1]
    blk = guard.allocate(1000, a, tag="late-overflow")
    guard.prepare_block_use(blk, b, W)
    sleep_on(b, 0.25)
    k = write(blk.ptr + 1000, b"\x00" * 8, b)
    guard.finish_block_use(blk, b, W)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.deallocate(blk)
    assert ei.value.side == "after" and ei.value.offset == 1000
    guard.flush()
    del k


def test_free_waits_for_a_late_read_elsewhere(guard, streams):
    # The poison written by the free must not overtake a read on another stream.
    if not tracks(guard):
        pytest.skip("upstream does not track")
    a, b = streams[0], streams[1]
    blk = guard.allocate(4096, a)
    k = write(blk.ptr, b"\x05" * 4096, a)
    guard.finish_block_use(blk, a, W)
    guard.prepare_block_use(blk, b, R)
    out = pinned(4096)
    sleep_on(b, 0.25)
    read_into(out, blk.ptr, b)
    guard.finish_block_use(blk, b, R)
    guard.deallocate(blk)
    b.synchronize()
    assert (out == 5).all(), "the free poisoned the block before stream B's read"
    guard.flush()
    del k


# -- nothing leaks ---------------------------------------------------------------------

@pytest.mark.parametrize("op,nbytes,nth", [
    ("memset_d32_async", 1000, 1),    # the first canary (aligned words)
    ("memset_d32_async", 1000, 3),    # the poison, after both canaries were queued
    ("memset_d8_async", 1001, 1),     # the after-guard of an odd size (unaligned, byte-wise)
    ("memset_d8_async", 1 << 17 | 3, 2),  # the unaligned tail of a large poison, its words queued
])
def test_failing_memset_on_allocate_leaks_nothing(guard, streams, backend, op, nbytes, nth):
    start = upstream_bytes(guard)
    backend.inject_fault(op, nth=nth, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        guard.allocate(nbytes, streams[0])
    assert op not in backend.armed_faults()
    backend.clear_faults()
    assert guard.bytes_outstanding == 0 and upstream_bytes(guard) == start


@pytest.mark.parametrize("nbytes", [4096, 4099, (1 << 17) + 2])
def test_poison_and_canaries_are_exact_for_any_size(guard, streams, nbytes):
    # Word-wide fills where aligned, byte-wise heads and tails: the same bytes as a byte memset.
    s = streams[0]
    b = guard.allocate(nbytes, s)
    raw = read(b.ptr - G, nbytes + 2 * G, s)
    assert raw == bytes([CANARY]) * G + bytes([POISON]) * nbytes + bytes([CANARY]) * G
    write(b.ptr, b"\x01" * nbytes, s)
    guard.deallocate(b)
    assert read(b.ptr, nbytes, s) == bytes([POISON]) * nbytes
    guard.flush()


def test_fill_bytes_splits_unaligned_regions(dev, streams):
    from ignis.memory.guard_base import fill_bytes
    s = streams[0]
    calls = []

    class Spy:
        def memset_d8_async(self, *a):
            calls.append(("d8", *a))

        def memset_d32_async(self, *a):
            calls.append(("d32", *a))

    base = 0x10000
    fill_bytes(Spy(), base, 0xA5, 4096, s.handle)
    fill_bytes(Spy(), base + 1, 0xA5, 100, s.handle)       # small, unaligned: one byte memset
    fill_bytes(Spy(), base + 1, 0xA5, 1 << 17, s.handle)   # large: head, words, tail
    fill_bytes(Spy(), base, 0xA5, 0, s.handle)
    h = s.handle
    assert calls == [("d32", base, 0xA5A5A5A5, 1024, h), ("d8", base + 1, 0xA5, 100, h),
                     ("d8", base + 1, 0xA5, 3, h), ("d32", base + 4, 0xA5A5A5A5, (1 << 15) - 1, h),
                     ("d8", base + 4 + 4 * ((1 << 15) - 1), 0xA5, 1, h)]
    with pytest.raises(ValueError, match="byte value"):
        fill_bytes(Spy(), base, 256, 4, h)


def test_uniform_compares_words_and_finds_any_byte():
    from ignis.memory.guard import _uniform
    raw = np.full(70001 + 16, POISON, np.uint8)
    for start in range(8):  # every alignment of the start
        for n in (0, 1, 7, 64, 1000, 1 << 14, (1 << 14) + 5, 70001):  # byte-wise below 16 KiB, words above
            data = raw[start:start + n]
            assert _uniform(data, POISON)
            for i in {0, n // 2, n - 1} if n else ():
                data[i] ^= 1
                assert not _uniform(data, POISON), (start, n, i)
                data[i] ^= 1


def test_failing_check_on_free_leaks_nothing(guard, streams, backend):
    start = upstream_bytes(guard)
    b = guard.allocate(1000, streams[0])
    backend.inject_fault("memcpy_dtoh_async", nth=1, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        guard.deallocate(b)
    backend.clear_faults()
    assert b.state is BlockState.FREED and guard.bytes_outstanding == 0
    assert guard.quarantined_count == 0 and upstream_bytes(guard) == start


def test_failing_check_on_flush_leaks_nothing(guard, streams, backend):
    start = upstream_bytes(guard)
    blocks = [guard.allocate(1000, streams[0]) for _ in range(3)]
    for b in blocks:
        guard.deallocate(b)
    backend.inject_fault("memcpy_dtoh_async", nth=1, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        guard.flush()
    backend.clear_faults()
    assert all(b.state is BlockState.FREED for b in blocks)
    assert guard.quarantined_count == 0 and upstream_bytes(guard) == start


def test_upstream_out_of_memory_empties_the_quarantine():
    be = ig.backends.emulated.EmulatedBackend(devices=1, memory="64MiB")
    prev = ig.get_backend()
    ig.set_backend(be)
    try:
        d = ig.Device(0)
        s = d.create_stream()
        guard = ig.DebugGuardResource(ig.DirectResource(d), quarantine_bytes=1 << 30)
        a = guard.allocate(40 << 20, s)
        guard.deallocate(a)
        assert guard.quarantined_count == 1
        b = guard.allocate(40 << 20, s)  # fits only once the quarantine is released
        assert a.state is BlockState.FREED and guard.quarantined_count == 0
        guard.deallocate(b)
        guard.close()
        assert guard.upstream.bytes_outstanding == 0
        s.close()
    finally:
        ig.set_backend(prev)


# -- bookkeeping -----------------------------------------------------------------------

def test_counters_numbers_and_history(guard, streams):
    events = []

    def rec(action, resource, ptr, size, stream, block):
        if resource is guard:
            events.append((action, ptr, size))

    prev = history.set_recorder(rec)
    try:
        b = guard.allocate(700, streams[0])
        assert guard.memory_numbers()["live_bytes"] == 700
        guard.deallocate(b)
        assert guard.quarantined_bytes == 700 + 2 * G
        assert guard.memory_numbers()["cached_bytes"] >= 700 + 2 * G
        assert [e[0] for e in events] == ["alloc", "free_requested"]
        guard.flush()
    finally:
        history.set_recorder(prev)
    assert events == [("alloc", b.ptr, 700), ("free_requested", b.ptr, 700), ("free_completed", b.ptr, 700)]


def test_close_flushes_and_refuses_new_work(guard, streams):
    start = upstream_bytes(guard)
    a, b = guard.allocate(64, streams[0]), guard.allocate(64, streams[0])
    guard.deallocate(a)
    guard.close()
    assert a.state is BlockState.FREED and guard.quarantined_count == 0
    with pytest.raises(ig.ClosedError):
        guard.allocate(64, streams[0])
    guard.deallocate(b)  # live blocks stay valid; their free skips the quarantine
    assert b.state is BlockState.FREED and upstream_bytes(guard) == start
    guard.close()  # idempotent


def test_as_the_current_resource_for_arrays(dev, streams):
    guard = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    prev = ig.set_current_resource(guard)
    try:
        x = ig.from_numpy(np.arange(100, dtype=np.int32), stream=streams[0])
        assert x.resource is guard and x.to_numpy().tolist() == list(range(100))
        x.free()
    finally:
        ig.set_current_resource(prev if prev is not None else None, device=0)
    guard.close()
    assert guard.upstream.bytes_outstanding == 0


def test_many_threads_leak_nothing(up, dev):
    guard = ig.DebugGuardResource(up, quarantine_count=16)
    start = upstream_bytes(guard)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        s = dev.create_stream()
        held = []
        try:
            for _ in range(100):
                if held and rng.random() < 0.5:
                    guard.deallocate(held.pop(int(rng.integers(len(held)))))
                else:
                    held.append(guard.allocate(int(rng.integers(1, 100_000)), s))
            for b in held:
                guard.deallocate(b)
        except Exception as e:  # pragma: no cover
            errors.append(e)
        finally:
            s.synchronize()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors
    assert guard.bytes_outstanding == 0 and guard.quarantined_count <= 16
    guard.flush()
    assert upstream_bytes(guard) == start


# -- with the sanitizer ------------------------------------------------------------------

def test_sanitizer_judges_spans_against_the_user_bytes(dev, streams, san):
    # Translated to the upstream block, a span into the after-guard would look in bounds.
    guard = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    s = streams[0]
    b = guard.allocate(1000, s, tag="spans")
    guard.prepare_block_use(b, s, W, (0, 1000, "fill"))
    guard.finish_block_use(b, s, W)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        guard.prepare_block_use(b, s, W, (996, 8, "kernel"))
    assert (ei.value.side, ei.value.offset, ei.value.ptr, ei.value.tag) == ("after", 1000, b.ptr, "spans")
    guard.deallocate(b)
    guard.flush()


def test_correct_cross_stream_arrays_are_quiet_under_the_sanitizer(dev, streams, san):
    guard = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    a, b = streams[0], streams[1]
    for _ in range(5):
        x = ig.from_numpy(np.arange(1000, dtype=np.float32), stream=a, mr=guard)
        assert x.to_numpy(stream=b).tolist() == list(range(1000))  # auto ordering makes B wait
        x.free()
    guard.flush()
    assert san.reports == []


def test_unordered_free_under_manual_ordering_is_reported(dev, streams, san):
    guard = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    a, b = streams[0], streams[1]
    with ig.ordering("manual"):
        blk = guard.allocate(4096, a)
        dev.synchronize()
        guard.prepare_block_use(blk, b, W)
        k = write(blk.ptr, b"\x01" * 4096, b)
        guard.finish_block_use(blk, b, W)
        with pytest.raises(ig.RaceError):
            guard.deallocate(blk)  # nothing orders A's free after B's write
        assert blk.state is BlockState.LIVE and guard.bytes_outstanding == 4096
        a.wait(b)
        guard.deallocate(blk)
    guard.flush()
    assert guard.upstream.bytes_outstanding == 0
    del k


def test_trim_flushes_the_quarantine(up, streams):
    guard = ig.DebugGuardResource(up)
    start = upstream_bytes(guard)
    b = guard.allocate(5000, streams[0])
    guard.deallocate(b)
    assert guard.quarantined_count == 1
    guard.trim()
    assert guard.quarantined_count == 0 and b.state is BlockState.FREED
    assert upstream_bytes(guard) == start


# -- one guard, two modes: the eager one here, the deferred one (DeferredGuardResource) --------

def _damage_past_the_end(mr, s, n=1000):
    b = mr.allocate(n, s, tag="twice")  # the allocation site both reports name
    k = write(b.ptr + n + 3, b"\x11\x22", s)
    return b, k


def test_both_modes_report_the_same_damage_the_same_way(up, streams):
    """The deferred guard is the debug guard with its checks batched on the device: the same
    allocation, the same record, the same report (only when it is found differs)."""
    s = streams[0]
    eager = ig.DebugGuardResource(up, quarantine_count=0)
    b1, k1 = _damage_past_the_end(eager, s)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        eager.deallocate(b1)
    deferred = ig.DeferredGuardResource(up, quarantine_count=0)
    b2, k2 = _damage_past_the_end(deferred, s)
    deferred.deallocate(b2)  # never waits: the check is queued
    (e2,) = deferred.check(raise_=False)
    e1 = ei.value
    for e, b in ((e1, b1), (e2, b2)):
        assert (e.side, e.offset, e.last_offset, e.damaged, e.nbytes, e.tag) == ("after", 1003, 1004, 2, 1000, "twice")
        assert e.found[:2] == b"\x11\x22" and e.ptr == b.ptr and e.generation == b.generation
        assert "_damage_past_the_end" in e.stack and "ignis" not in e.stack.split("test_guard.py")[0]
    # one wording (the block's address and generation aside; the eager mode keeps more frames)
    head = [str(e).partition("\nallocated at")[0].replace(f"{b.ptr:#x}", "P").replace(f"generation {b.generation}", "G")
            for e, b in ((e1, b1), (e2, b2))]
    assert head[0] == head[1] and "allocated at" in str(e1) and "allocated at" in str(e2)
    deferred.close()  # gives back its ready cache (checked blocks kept for a reuse on their stream)
    assert upstream_bytes(eager) == 0 and deferred.bytes_outstanding == 0
    del k1, k2


def test_the_eager_mode_reports_every_damaged_byte_after_free(guard, streams):
    s = streams[0]
    b = guard.allocate(3 << 20, s, tag="uaf")
    guard.deallocate(b)
    k = write(b.ptr + 5, b"\x01", s)
    k2 = write(b.ptr + (2 << 20) + 7, b"\x02\x03", s)  # in another chunk of the read-back
    (e,) = guard.flush(raise_=False)
    assert type(e) is ig.UseAfterFreeError
    assert (e.offset, e.last_offset, e.damaged) == (5, (2 << 20) + 8, 3)
    assert e.found == b"\x01" + bytes([POISON]) * 15
    assert "3 byte(s) at offsets 5..2097160" in str(e) and "allocated at" in str(e)
    del k, k2


def test_a_closed_deferred_guard_still_checks_and_returns_what_is_freed(up, streams):
    s = streams[0]
    mr = ig.DeferredGuardResource(up)
    kept = mr.allocate(512, s, tag="kept")
    k = write(kept.ptr - 4, b"\x00", s)
    mr.close()
    with pytest.raises(ig.ClosedError):
        mr.allocate(16, s)
    mr.deallocate(kept)  # no batches any more: checked at once, handed back
    assert kept.state is BlockState.FREED and upstream_bytes(mr) == 0
    (e,) = mr.found
    assert isinstance(e, ig.OutOfBoundsError) and (e.side, e.offset) == ("before", -4)
    del k


@pytest.mark.parametrize("kw,match", [({"batch": 0}, "batch must be an int from 1 to 1024"),
                                      ({"batch": True}, "batch must be"),
                                      ({"ready_limit": -1}, "ready_limit must be a non-negative int"),
                                      ({"stack_depth": 0}, "stack_depth must be an int from 1 to 64")])
def test_the_deferred_guard_refuses_bad_options(up, kw, match):
    with pytest.raises(ValueError, match=match):
        ig.DeferredGuardResource(up, **kw)
    with pytest.raises(ValueError, match="stack_depth"):
        ig.DebugGuardResource(up, stack_depth=65)


def test_a_closed_deferred_guard_reports_a_damage_once_and_queues_nothing(up, streams):
    s = streams[0]
    mr = ig.DeferredGuardResource(up)
    b = mr.allocate(256, s, tag="once")
    k = write(b.ptr + 256, b"\x01", s)
    (e,) = mr.check(raise_=False)  # found by check(), on the device
    assert (e.side, e.when) == ("after", "by check()")
    mr.close()
    slots = len(mr._checker.all_slots)
    assert mr.check(raise_=False) == []  # closed: read here, already reported
    mr.on_sync(True)
    mr.deallocate(b)  # checked at once: the same damage, not reported again
    assert len(mr.found) == 1 and len(mr._checker.all_slots) == slots == 0
    assert upstream_bytes(mr) == 0
    del k


def test_the_eager_guard_takes_the_deferred_free_and_refuses_bad_frames(guard, streams):
    s = streams[0]
    with pytest.raises(TypeError, match="frames must be a tuple"):
        guard.allocate(64, s, frames=["not", "a", "capture"])
    b = guard.allocate(64, s, frames=())  # no site
    assert guard.stack_of(b) is None
    guard.free_fast(b)  # the eager mode's free_fast is its deallocate
    assert b.state is BlockState.QUARANTINED and guard.quarantined_count == 1
    guard.flush()


def test_the_quarantine_lets_its_oldest_out_first_and_reads_as_a_mapping(streams):
    from ignis.memory.guard_base import _Quarantine
    q = _Quarantine()
    assert len(q) == 0 and not q and q.get(0x100) is None and 0x100 not in q
    for p in (0x300, 0x100, 0x200):
        q[p] = f"rec {p:#x}"
    q[0x100] = "rec 0x100, again"          # already quarantined: keeps its place
    assert len(q) == 3 and 0x100 in q and q[0x100] == "rec 0x100, again" and q.get(0x999, "none") == "none"
    assert list(q) == [0x300, 0x100, 0x200] and list(q.values())[0] == "rec 0x300"
    g = ig.DeferredGuardResource(ig.PoolResource(ig.get_current_resource()), quarantine_count=2)
    s = streams[0]
    blocks = [g.allocate(256 * (i + 1), s) for i in range(4)]
    for b in blocks:
        g.deallocate(b)
    held = list(g._quarantine)                 # at most two: the two freed last, oldest first
    assert held == [blocks[2].ptr, blocks[3].ptr] and len(g._quarantine) == g.quarantined_count == 2
    g.close()


@pytest.mark.parametrize("direct", [True, False])
def test_check_batches_go_straight_to_the_driver_where_the_backend_allows(up, streams, direct):
    """On a GPU the deferred guard queues a check batch's six driver calls (the jobs' copy, the
    results' fill, the kernel's two phases, the results' copy back, the event's record) without
    the backend's methods, and finds the same damage either way; the emulated backend has no
    direct calls, and every batch goes through its methods."""
    from ignis.memory import guard_base
    s = streams[0]
    was = guard_base.check_batches_direct(direct)
    try:
        mr = ig.DeferredGuardResource(up, quarantine_count=4)
        before, batches = mr._checker.direct_batches, mr._checker.batches
        found = []
        for i in range(3):  # three batches (one free each), each finding its own damage
            b = mr.allocate(1000 + i, s, tag="twice")
            k = write(b.ptr + 1000 + i + 3, b"\x11\x22", s)
            mr.deallocate(b)
            found += mr.check(raise_=False)
            del k
        assert [(e.side, e.offset, e.last_offset, e.damaged) for e in found] == \
            [("after", 1003 + i, 1004 + i, 2) for i in range(3)]
        assert all(e.found[:2] == b"\x11\x22" for e in found)
        on_gpu = not s.device.backend.host_kernels
        launched = mr._checker.batches - batches  # (a free's batch, and check()'s own of the quarantine)
        assert launched >= 3
        assert mr._checker.direct_batches - before == (launched if direct and on_gpu else 0)
        mr.close()
        assert mr.bytes_outstanding == 0
    finally:
        guard_base.check_batches_direct(was)


def test_guard_timing_counts_the_deferred_guards_parts(up, streams):
    """A diagnostic: off by default; on, it counts the batches queued, the blocks handed back and
    the time of the compiled free and allocate; each call restarts the count."""
    from ignis.memory import guard_base
    s = streams[0]
    guard_base.guard_timing(False)
    mr = ig.DeferredGuardResource(up, quarantine_count=2, batch=2)
    guard_base.guard_timing(True)
    try:
        for _ in range(8):
            mr.free_fast(mr.allocate(4096, s))
        got = guard_base.guard_timing(False)
    finally:
        guard_base.guard_timing(False)
    assert got["launches"] >= 4 and got["released"] >= 4
    assert got["free_ns"] >= got["queue_ns"] > 0 and got["alloc_ns"] > 0 and got["launch_ns"] > 0
    assert guard_base.guard_timing(False) == dict.fromkeys(got, 0)
    mr.close()


def test_the_live_check_at_a_synchronize_point_finds_damage_on_open_and_closed_streams(up, dev, streams):
    """The live check queues one job per live block in one call, each on its block's stream, or
    where that stream closed, on the device's default stream after a device synchronization."""
    mr = ig.DeferredGuardResource(up, batch=2)
    closing = dev.create_stream()
    a = mr.allocate(100, streams[0], tag="open")
    b = mr.allocate(200, closing, tag="closed")
    c = mr.allocate(300, streams[1], tag="clean")
    keep = [write(a.ptr + 100, b"\x01", streams[0]), write(b.ptr - 1, b"\x02", closing)]
    closing.close()
    mr.on_sync(True)
    found = mr.check(raise_=False)
    got = sorted((e.tag, e.side, e.when) for e in found if e.when == "at a synchronize point")
    assert got == [("closed", "before", "at a synchronize point"), ("open", "after", "at a synchronize point")]
    for x in (a, c):
        mr.deallocate(x)
    mr.close()
    del keep
