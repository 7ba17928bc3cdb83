"""Memory resources and adaptors (layer 2), parametrized over every base and adaptor."""

from __future__ import annotations

from contextlib import closing
import csv
import ctypes
import io
import threading
import time
import types

import numpy as np
import pytest

import ignis as ig
import ignis.backends.emulated  # noqa: F401 - tests build emulated backends
from helpers import pinned, read, read_after_slow_write, read_into, sleep_on, write
from ignis.memory import Access, BlockState

R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE


def _bases(dev):
    out = {"direct": lambda: ig.DirectResource(dev), "pool_direct": lambda: ig.PoolResource(ig.DirectResource(dev))}
    if dev.capabilities["memory_pools"]:
        out["async"] = lambda: ig.AsyncResource(dev)
        out["pool_async"] = lambda: ig.PoolResource(ig.AsyncResource(dev))
    return out


BASES = ["direct", "async", "pool_direct", "pool_async"]
ADAPTORS = {
    "plain": lambda up: up,
    "budget": lambda up: ig.BudgetResource(up, 1 << 34),
    "logging": lambda up: ig.LoggingResource(up, io.StringIO(), extra_columns=True),
    "statistics": lambda up: ig.StatisticsResource(up),
    "tracking": lambda up: ig.TrackingResource(up, capture_stacks=True),
    "stack": lambda up: ig.TrackingResource(ig.StatisticsResource(ig.LoggingResource(
        ig.BudgetResource(up, 1 << 34), io.StringIO()))),
}


def make(dev, base, adaptor="plain"):
    bases = _bases(dev)
    if base not in bases:
        pytest.skip(f"{base} needs memory pools")
    return ADAPTORS[adaptor](bases[base]())


def tracks(mr) -> bool:
    return mr.supports_block_use_tracking


@pytest.fixture(params=[(b, a) for b in BASES for a in ADAPTORS], ids=lambda p: f"{p[1]}-{p[0]}")
def mr(request, dev):
    return make(dev, *request.param)


# -- the contract -----------------------------------------------------------------

def test_allocate_deallocate_states_and_counts(mr, streams):
    s = streams[0]
    before = mr.bytes_outstanding
    b = mr.allocate(1000, s, tag="weights")
    assert b.state is BlockState.LIVE and b.bytes >= 1000 and b.requested == 1000
    assert b.tag == "weights" and b.alloc_stream is s and b.device_ordinal == 0
    assert b.ptr % 256 == 0 and b.align >= 256
    assert mr.bytes_outstanding >= before + 1000
    bid = b.id
    assert bid == ig.BlockId.from_block(b) and bid.generation == b.generation
    with pytest.raises(AttributeError):
        bid.ptr = 0  # frozen
    mr.deallocate(b)
    assert b.state in (BlockState.RETIRED, BlockState.FREED)
    mr.reap_pending()
    assert mr.bytes_outstanding == before
    with pytest.raises(ig.DoubleFreeError) as ei:
        mr.deallocate(b)
    assert ei.value.generation == b.generation


def test_bytes_round_trip(mr, streams):
    s = streams[0]
    b = mr.allocate(3000, s)
    data = np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)
    keep = write(b.ptr, data, s)
    assert read(b.ptr, 3000, s) == data.tobytes()
    del keep
    mr.deallocate(b)


@pytest.mark.parametrize("bad,exc,msg", [(0, ValueError, "zero-byte"), (-5, ValueError, "positive"),
                                         (1.5, TypeError, "int"), (True, TypeError, "int")])
def test_bad_sizes_are_clear_errors(mr, streams, bad, exc, msg):
    before = mr.bytes_outstanding
    with pytest.raises(exc, match=msg):
        mr.allocate(bad, streams[0])
    assert mr.bytes_outstanding == before


def test_stream_must_be_a_stream(mr):
    with pytest.raises(TypeError, match="Stream"):
        mr.allocate(64, "stream0")


@pytest.mark.parametrize("bad", [None, 42, "a block"])
def test_deallocate_of_anything_but_a_block_is_a_type_error(mr, bad):
    with pytest.raises(TypeError, match="DeviceBlock"):
        mr.deallocate(bad)


@pytest.mark.parametrize("kind", ["vmm", "guard"])
def test_deallocate_of_anything_but_a_block_is_a_type_error_in_the_other_resources(dev, kind):
    mr = ig.VmmResource(dev) if kind == "vmm" else ig.DebugGuardResource(ig.PoolResource(device=dev))
    blk = mr.allocate(512)
    for bad in (None, 42):
        with pytest.raises(TypeError, match="DeviceBlock"):
            mr.deallocate(bad)
    mr.deallocate(blk)  # the resource was left as it was


# -- closed adaptors ---------------------------------------------------------------
ADAPTOR_FACTORIES = {
    ig.ResourceAdaptor: lambda up, tmp: ig.ResourceAdaptor(up),
    ig.BudgetResource: lambda up, tmp: ig.BudgetResource(up, 1 << 30),
    ig.LoggingResource: lambda up, tmp: ig.LoggingResource(up, tmp / "log.csv"),
    ig.StatisticsResource: lambda up, tmp: ig.StatisticsResource(up),
    ig.TrackingResource: lambda up, tmp: ig.TrackingResource(up, capture_stacks=True),
    ig.DebugGuardResource: lambda up, tmp: ig.DebugGuardResource(up),
    ig.DeferredGuardResource: lambda up, tmp: ig.DeferredGuardResource(up),
}
# Every adaptor Ignis exports (a new one without a factory above fails the test below).
ADAPTOR_CLASSES = [c for c in (getattr(ig.memory, n) for n in ig.memory.__all__)
                   if isinstance(c, type) and issubclass(c, ig.ResourceAdaptor)]


@pytest.mark.parametrize("cls", ADAPTOR_CLASSES, ids=lambda c: c.__name__)
def test_a_closed_adaptor_refuses_before_asking_its_upstream(dev, tmp_path, cls):
    """``close()`` documents ClosedError: an adaptor must refuse before its upstream hands it a
    block (a LoggingResource used to take one, then fail on its closed log and lose it)."""
    assert cls in ADAPTOR_FACTORIES, f"{cls.__name__}: add a factory to ADAPTOR_FACTORIES"
    up = ig.StatisticsResource(ig.PoolResource(device=dev))
    mr = ADAPTOR_FACTORIES[cls](up, tmp_path)
    kept = mr.allocate(4096)
    mr.close()
    asked = up.statistics.count.total
    with pytest.raises(ig.ClosedError):
        mr.allocate(10 << 20)
    assert up.statistics.count.total == asked, "the closed adaptor asked its upstream for memory"
    mr.deallocate(kept)  # live blocks can still be given back
    assert up.statistics.bytes.value == 0 and up.statistics.count.value == 0


def test_logging_gives_the_block_back_when_its_log_closes_during_the_allocation(dev, tmp_path):
    """The log closed between the upstream's allocation and the log line: the block goes back
    upstream and ClosedError is raised, nothing leaks."""
    class ClosesTheLog(ig.ResourceAdaptor):  # an upstream whose allocation the log's close() overtakes
        log = None

        def _allocate_open(self, nbytes, stream, tag):
            block = super()._allocate_open(nbytes, stream, tag)
            self.log.close()
            return block

    stats = ig.StatisticsResource(ig.PoolResource(device=dev))
    up = ClosesTheLog(stats)
    up.log = log = ig.LoggingResource(up, tmp_path / "log.csv")
    with pytest.raises(ig.ClosedError):
        log.allocate(10 << 20)
    assert stats.statistics.count.total == 1 and stats.statistics.bytes.value == 0  # taken, and given back
    assert (tmp_path / "log.csv").read_text().splitlines() == [",".join(ig.memory.adaptors.LOG_HEADER)]


def test_foreign_block_is_refused(dev, streams):
    a, b = make(dev, "pool_direct"), make(dev, "pool_direct")
    blk = a.allocate(64, streams[0])
    with pytest.raises(ValueError, match="not allocated by this"):
        b.deallocate(blk)
    a.deallocate(blk)


def test_generations_are_distinct_across_threads():
    got: list[int] = []
    lock = threading.Lock()

    def work():
        mine = [ig.Generation.next() for _ in range(2000)]
        with lock:
            got.extend(mine)

    ts = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(set(got)) == len(got)
    assert ig.Generation.next() > max(got)


def test_transition_table_refuses_illegal_moves(mr, streams):
    b = mr.allocate(64, streams[0])
    mr.deallocate(b)
    mr.reap_pending()
    with pytest.raises(ig.InvalidTransitionError) as ei:
        b.transition(BlockState.LIVE)
    assert ei.value.state in ("RETIRED", "FREED") and ei.value.attempted == "LIVE"
    assert f"{b.ptr:#x}" in str(ei.value)


# -- tracking ---------------------------------------------------------------------

def test_tracking_support_is_explicit(mr, streams):
    b = mr.allocate(64, streams[0])
    try:
        if tracks(mr):
            mr.prepare_block_use(b.id, streams[1], R)
            mr.finish_block_use(b.id, streams[1], R)
            mr.record_block_use(b, streams[2])
        else:
            for call in (lambda: mr.prepare_block_use(b.id, streams[1], R),
                         lambda: mr.finish_block_use(b.id, streams[1], R),
                         lambda: mr.record_block_use(b, streams[1])):
                with pytest.raises(ig.StreamMisuseError, match="does not track"):
                    call()
    finally:
        mr.deallocate(b)


def test_stale_block_id_is_use_after_free(mr, streams):
    if not tracks(mr):
        pytest.skip("resource does not track")
    b = mr.allocate(64, streams[0])
    bid = b.id
    mr.deallocate(b)
    b2 = mr.allocate(64, streams[0])  # likely the same address, new generation
    with pytest.raises(ig.UseAfterFreeError) as ei:
        mr.prepare_block_use(bid, streams[1], R)
    assert ei.value.generation == bid.generation
    with pytest.raises(ig.UseAfterFreeError):
        mr.finish_block_use(bid, streams[1], W)
    mr.deallocate(b2)


def test_same_stream_use_makes_no_driver_call(dev, streams, monkeypatch):
    mr = make(dev, "pool_direct")
    s = streams[0]
    b = mr.allocate(256, s)
    calls = []
    backend = dev.backend
    for name in ("event_record", "stream_wait_event", "event_create", "stream_synchronize"):
        orig = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *a, _n=name, _o=orig: (calls.append(_n), _o(*a))[1])
    for acc in (R, W, RW, R):
        mr.prepare_block_use(b, s, acc)
        mr.finish_block_use(b, s, acc)
    mr.deallocate(b)
    b = mr.allocate(256, s)
    mr.deallocate(b)
    assert calls == []


def test_read_on_other_stream_waits_for_write(dev, streams):
    mr = make(dev, "pool_async") if dev.capabilities["memory_pools"] else make(dev, "pool_direct")
    a, b = streams[0], streams[1]
    blk = mr.allocate(4096, a)
    out, keep = read_after_slow_write(mr, blk, a, b)
    assert (out == 7).all(), "the read on stream B ran before the write on stream A"
    a.synchronize()
    del keep
    mr.deallocate(blk)


def _free_while_read_elsewhere(mr, a, b, tracked: bool) -> np.ndarray:
    """Stream B reads a block late; A frees it and reuses the memory at once."""
    blk = mr.allocate(4096, a)
    k1 = write(blk.ptr, b"\x01" * 4096, a)
    if tracked:
        mr.finish_block_use(blk, a, W)
        mr.prepare_block_use(blk, b, R)
    else:
        b.wait(a)  # the read itself is ordered after the write
    out = pinned(4096)
    sleep_on(b, 0.25)
    read_into(out, blk.ptr, b)
    if tracked:
        mr.finish_block_use(blk, b, R)
    mr.deallocate(blk)
    blk2 = mr.allocate(4096, a)
    assert blk2.ptr == blk.ptr, "the pool should reuse the freed block on the same stream"
    k2 = write(blk2.ptr, b"\x02" * 4096, a)
    a.synchronize()
    b.synchronize()
    mr.deallocate(blk2)
    del k1, k2
    return out


def test_free_while_other_stream_reads_is_ordered(dev, streams):
    mr = make(dev, "pool_direct")
    out = _free_while_read_elsewhere(mr, streams[0], streams[1], tracked=True)
    assert (out == 1).all(), "the block was reused before stream B's read finished"


def test_untracked_free_while_read_shows_the_race(dev, streams):
    # The control: without tracking the same program reads the new owner's bytes,
    # which proves the test above can fail.
    mr = make(dev, "pool_direct")
    out = _free_while_read_elsewhere(mr, streams[0], streams[1], tracked=False)
    assert (out == 2).all()


def test_cross_stream_reuse_waits_for_the_freeing_stream(dev, streams):
    mr = make(dev, "pool_direct")
    a, b = streams[0], streams[1]
    blk = mr.allocate(4096, a)
    sleep_on(a, 0.2)
    k1 = write(blk.ptr, b"\x03" * 4096, a)  # late write on A
    mr.deallocate(blk)
    blk2 = mr.allocate(4096, b)  # steals A's block: must wait for A
    assert blk2.ptr == blk.ptr
    k2 = write(blk2.ptr, b"\x04" * 4096, b)
    b.synchronize()
    a.synchronize()
    assert read(blk2.ptr, 4096, b) == b"\x04" * 4096
    mr.deallocate(blk2)
    del k1, k2


def test_writer_waits_for_all_readers(dev, streams):
    mr = make(dev, "pool_direct")
    a, b, c = streams
    blk = mr.allocate(1024, a)
    k = write(blk.ptr, b"\x05" * 1024, a)
    mr.finish_block_use(blk, a, W)
    outs = []
    for s in (b, c):
        mr.prepare_block_use(blk, s, R)
        sleep_on(s, 0.15)
        o = pinned(1024)
        read_into(o, blk.ptr, s)
        outs.append(o)
        mr.finish_block_use(blk, s, R)
    mr.prepare_block_use(blk, a, W)
    k2 = write(blk.ptr, b"\x06" * 1024, a)
    mr.finish_block_use(blk, a, W)
    dev.synchronize()
    assert all((o == 5).all() for o in outs)
    assert read(blk.ptr, 1024, a) == b"\x06" * 1024
    mr.deallocate(blk)
    del k, k2


# -- pool behaviour -----------------------------------------------------------------

def test_pool_split_coalesce_and_trim(dev, streams):
    mr = ig.PoolResource(ig.DirectResource(dev))
    s = streams[0]
    blocks = [mr.allocate(100_000, s) for _ in range(10)]
    assert mr.bytes_reserved == 2 << 20  # one small segment holds them all
    ptrs = sorted(b.ptr for b in blocks)
    assert all(q - p >= 100_000 for p, q in zip(ptrs, ptrs[1:]))
    for b in blocks:
        mr.deallocate(b)
    big = mr.allocate(1 << 20, s)  # needs the freed neighbours merged
    assert mr.bytes_reserved == 2 << 20
    mr.deallocate(big)
    segs = mr.segments()
    assert len(segs) == 1
    assert mr.trim() == 2 << 20
    assert mr.bytes_reserved == 0 and mr.upstream.bytes_outstanding == 0


def test_pool_large_requests(dev, streams):
    mr = ig.PoolResource(ig.DirectResource(dev))
    s = streams[0]
    b = mr.allocate(12 << 20, s)
    assert b.bytes == 12 << 20 and mr.bytes_reserved == 12 << 20
    c = mr.allocate(3 << 20, s)
    assert mr.bytes_reserved == (12 << 20) + (20 << 20)
    mr.deallocate(b)
    mr.deallocate(c)
    assert mr.trim() == (32 << 20)


def test_pool_oom_frees_cache_and_retries(streams):
    be = ig.backends.emulated.EmulatedBackend(devices=1, memory="64MiB")
    prev = ig.get_backend()
    ig.set_backend(be)
    try:
        d = ig.Device(0)
        s = d.create_stream()
        mr = ig.PoolResource(ig.AsyncResource(d))
        a = mr.allocate(40 << 20, s)
        mr.deallocate(a)  # 40 MiB cached
        b = mr.allocate(50 << 20, s)  # does not fit next to the cache: trim and retry
        assert mr.num_alloc_retries == 1
        with pytest.raises(ig.OutOfMemoryError) as ei:
            mr.allocate(60 << 20, s)
        e = ei.value
        assert isinstance(e, MemoryError)
        assert e.requested == 60 << 20 and e.device_total == 64 << 20
        assert e.live_bytes == 50 << 20 and e.device_free is not None
        assert "trim" in str(e)
        mr.deallocate(b)
        s.close()
    finally:
        ig.set_backend(prev)


def test_failing_upstream_leaves_adaptor_counters_exact(dev, streams, backend):
    for base in ("pool_direct", "direct"):
        stats = ig.StatisticsResource(make(dev, base))
        budget = ig.BudgetResource(stats, 1 << 30)
        logbuf = io.StringIO()
        log = ig.LoggingResource(budget, logbuf)
        track = ig.TrackingResource(log)
        keep = track.allocate(64, streams[0])
        op = "mem_alloc"
        backend.inject_fault(op, nth=1, error="CUDA_ERROR_OUT_OF_MEMORY", times=2)  # the pool retries once
        with pytest.raises(MemoryError):
            track.allocate(8 << 20, streams[0])
        backend.clear_faults()
        assert budget.used_bytes == 64
        assert stats.statistics.bytes.value == 64 and stats.statistics.count.value == 1
        assert len(track.outstanding()) == 1
        rows = list(csv.reader(io.StringIO(logbuf.getvalue())))
        assert [r[2] for r in rows[1:]] == ["allocate", "allocate failure"]
        track.deallocate(keep)
        assert budget.used_bytes == 0 and stats.statistics.bytes.value == 0


def test_budget_refuses_deterministically(dev, streams):
    mr = ig.BudgetResource(make(dev, "pool_direct"), 10_000)
    a = mr.allocate(6000, streams[0])
    for _ in range(3):
        with pytest.raises(ig.OutOfBudgetError) as ei:
            mr.allocate(5000, streams[0])
        assert (ei.value.requested, ei.value.remaining) == (5000, 4000)
    b = mr.allocate(4000, streams[0])
    assert mr.remaining_bytes == 0
    mr.deallocate(a), mr.deallocate(b)
    assert mr.remaining_bytes == 10_000


def test_logging_csv_is_rmm_shaped(dev, streams, tmp_path):
    path = tmp_path / "log.csv"
    mr = ig.LoggingResource(make(dev, "pool_direct"), path, extra_columns=True)
    a = mr.allocate(100, streams[0], tag="kv")
    mr.deallocate(a)
    mr.close()
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["Thread", "Time", "Action", "Pointer", "Size", "Stream", "Tag", "Generation"]
    assert [r["Action"] for r in rows] == ["allocate", "free"]
    assert rows[0]["Pointer"] == f"{a.ptr:#x}" and rows[0]["Size"] == "100"
    assert rows[0]["Tag"] == "kv" and rows[0]["Generation"] == str(a.generation)
    assert rows[0]["Stream"] == f"{streams[0].handle:#x}"


def test_statistics_nested_and_by_tag(dev, streams):
    mr = ig.StatisticsResource(make(dev, "pool_direct"))
    s = streams[0]
    a = mr.allocate(100, s, tag="a")
    mr.push_counters()
    b = mr.allocate(300, s, tag="b")
    mr.deallocate(b)
    inner = mr.pop_counters()
    assert (inner.bytes.value, inner.bytes.peak, inner.bytes.total) == (0, 300, 300)
    outer = mr.statistics
    assert (outer.bytes.value, outer.bytes.peak, outer.bytes.total) == (100, 400, 400)
    assert outer.count.total == 2
    tags = mr.by_tag()
    assert tags["a"]["current_bytes"] == 100 and tags["b"]["peak_bytes"] == 300
    with pytest.raises(RuntimeError):
        mr.pop_counters()
    mr.deallocate(a)


def test_tracking_report_names_stacks(dev, streams):
    mr = ig.TrackingResource(make(dev, "pool_direct"), capture_stacks=True)
    a = mr.allocate(123, streams[0], tag="leaky")

    assert "leaky" in mr.report() and "test_tracking_report_names_stacks" in mr.report()
    assert "test_memory.py" in (mr.stack_of(a) or "")
    mr.deallocate(a)
    assert mr.report() == "no outstanding allocations"


def test_adaptor_keeps_upstream_and_forwards_tracking(dev):
    up = make(dev, "pool_direct")
    ad = ig.StatisticsResource(up)
    assert ad.upstream is up and ad.supports_block_use_tracking
    assert not ig.StatisticsResource(ig.DirectResource(dev)).supports_block_use_tracking


def test_pinned_host_pool(dev, streams):
    ph = ig.PinnedHostResource()
    buf = ph.allocate(10_000)
    assert buf.capacity == 16384 and buf.array.nbytes == 10_000
    buf.array[:] = 9
    ptr = buf.ptr
    buf.release(streams[0])
    again = ph.allocate(12_000)
    streams[0].synchronize()
    assert again.ptr == ptr or ph.bytes_cached == 16384
    again.release()
    with pytest.raises(ig.DoubleFreeError):
        again.release()
    assert ph.trim() >= 16384


def test_current_resource(dev):
    default = ig.get_current_resource(dev)
    assert isinstance(default, ig.PoolResource)
    assert ig.get_current_resource(0) is default
    mine = ig.StatisticsResource(default)
    prev = ig.set_current_resource(mine)
    try:
        assert prev is default and ig.get_current_resource(0) is mine
    finally:
        ig.set_current_resource(None, device=0)
    with pytest.raises(TypeError):
        ig.set_current_resource("pool")


def test_many_threads_end_with_nothing_outstanding(dev):
    mr = ig.StatisticsResource(ig.PoolResource(ig.DirectResource(dev)))
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        s = dev.create_stream()
        held = []
        try:
            for _ in range(300):
                if held and rng.random() < 0.5:
                    mr.deallocate(held.pop(rng.integers(len(held))))
                else:
                    held.append(mr.allocate(int(rng.integers(1, 3 << 20)), s))
            for b in held:
                mr.deallocate(b)
        except Exception as e:  # pragma: no cover
            errors.append(e)
        finally:
            s.synchronize()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors
    assert mr.bytes_outstanding == 0 and mr.statistics.bytes.value == 0
    mr.upstream.trim()
    assert mr.upstream.upstream.bytes_outstanding == 0


def test_reuse_is_ordered_under_jitter():
    """A block freed while another stream still reads it is never handed out before that
    read completes: verified by the bytes, over many seeds of the emulator's jitter."""
    prev = ig.get_backend()
    try:
        for seed in range(8):
            be = ig.backends.emulated.EmulatedBackend(devices=1, jitter=(seed, 400.0))
            ig.set_backend(be)
            d = ig.Device(0)
            a, b = d.create_stream(), d.create_stream()
            mr = ig.PoolResource(ig.DirectResource(d))
            for _ in range(5):
                blk = mr.allocate(4096, a)
                k1 = write(blk.ptr, b"\x01" * 4096, a)
                mr.finish_block_use(blk, a, W)
                mr.prepare_block_use(blk, b, R)
                out = pinned(4096)
                read_into(out, blk.ptr, b)
                mr.finish_block_use(blk, b, R)
                mr.deallocate(blk)
                blk2 = mr.allocate(4096, a)
                k2 = write(blk2.ptr, b"\x02" * 4096, a)
                d.synchronize()
                assert (out == 1).all(), f"seed {seed}: the reused block was overwritten before the read"
                mr.deallocate(blk2)
                del k1, k2
            a.close(), b.close()
    finally:
        ig.set_backend(prev)


def test_pinned_handles_never_alias_a_reused_buffer():
    ph = ig.PinnedHostResource()
    old = ph.allocate(4096)
    old.release()
    new = ph.allocate(4096)
    assert new.ptr == old.ptr and new is not old
    with pytest.raises(ig.UseAfterFreeError):
        old.array
    with pytest.raises(ig.DoubleFreeError):
        old.release()
    new.release()
    ph.trim()


@pytest.mark.parametrize("base,op", [("direct", "mem_free"), ("async", "mem_free_async")])
def test_a_refused_driver_free_leaves_the_block_live(dev, streams, backend, base, op):
    mr = make(dev, base)
    b = mr.allocate(4096, streams[0])
    backend.inject_fault(op, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        mr.deallocate(b)
    assert b.state is BlockState.LIVE and mr.bytes_outstanding >= 4096
    mr.deallocate(b)  # the retry works
    mr.reap_pending()
    assert mr.bytes_outstanding == 0


def test_a_failed_upload_returns_its_staging_buffer(dev, backend):
    from ignis.array import hostcopy
    pool = hostcopy.pinned_pool()
    a = ig.empty(256, "uint8")
    before = pool.bytes_outstanding
    backend.inject_fault("memcpy_htod_async", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        a.from_host(np.zeros(256, np.uint8))
    assert pool.bytes_outstanding == before
    a.free()


@pytest.mark.parametrize("base", ["direct", "async"])
def test_streams_of_another_device_are_refused(dev, base):
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    mr = make(dev, base)
    with closing(ig.Device(1).create_stream()) as other:
        with pytest.raises(ValueError, match="belongs to device 1"):
            mr.allocate(64, other)


# -- a refused driver free loses nothing (issue #14, item 13) ---------------------------------

def _device_free(backend) -> int | None:
    """Free device bytes as the emulator counts them (None on a GPU: others share it)."""
    return backend.mem_get_info(0)[0] if backend.name == "emulated" else None


def _adaptor_counts(mr) -> dict:
    """Every counter an adaptor stack keeps, outermost first."""
    out, r = {}, mr
    while r is not None:
        name = type(r).__name__
        if isinstance(r, ig.BudgetResource):
            out[name + ".used"] = r.used_bytes
        if isinstance(r, ig.StatisticsResource):
            out[name + ".bytes"] = r.statistics.bytes.value
            out[name + ".count"] = r.statistics.count.value
        if isinstance(r, ig.TrackingResource):
            out[name + ".outstanding"] = len(r.outstanding())
        out[name + ".bytes_outstanding"] = r.bytes_outstanding
        r = getattr(r, "upstream", None)
    return out


# (base, the backend op made to fail, which uses the block has before its free)
REFUSED = [
    ("direct", "mem_free", "none"),
    ("async", "mem_free_async", "none"),
    ("async", "mem_free_async", "other_stream"),
    ("async", "stream_wait_event", "other_stream"),
    ("async", "stream_wait_event", "two_streams"),
    ("async", "mem_free", "closed_stream"),
    ("async", "device_synchronize", "closed_stream"),
    ("pool_direct", "stream_wait_event", "other_stream"),
    ("pool_direct", "stream_wait_event", "two_streams"),
    ("pool_async", "stream_wait_event", "two_streams"),
]


@pytest.mark.parametrize("adaptor", ["plain", "stack"])
@pytest.mark.parametrize("base,op,uses", REFUSED, ids=["-".join(c) for c in REFUSED])
def test_a_refused_free_leaves_the_block_live_and_the_counters_true(dev, backend, base, op, uses, adaptor):
    mr = make(dev, base, adaptor)
    a, s1, s2 = dev.create_stream(), dev.create_stream(), dev.create_stream()
    try:
        free0 = _device_free(backend)
        counts0 = _adaptor_counts(mr)
        blk = mr.allocate(4096, a, tag="refused")
        keep = write(blk.ptr, b"\x2a" * 4096, a)
        if uses in ("other_stream", "two_streams"):
            mr.finish_block_use(blk, a, W)
            mr.prepare_block_use(blk, s1, RW)
            mr.finish_block_use(blk, s1, RW)  # s1 wrote it (an event on s1)
        if uses == "two_streams":
            mr.prepare_block_use(blk, s2, R)
            mr.finish_block_use(blk, s2, R)  # s2 read it: the free's second wait fails
        if uses == "closed_stream":
            a.synchronize()
            a.close()
        counts1 = _adaptor_counts(mr)
        backend.inject_fault(op, nth=2 if uses == "two_streams" else 1, error="CUDA_ERROR_INVALID_VALUE")
        with pytest.raises(ig.DriverError, match="injected fault"):
            mr.deallocate(blk)
        backend.clear_faults()
        assert blk.state is BlockState.LIVE
        assert _adaptor_counts(mr) == counts1, "a refused free changed a counter"
        if uses != "closed_stream":  # still the caller's memory: usable, bytes intact
            if tracks(mr):
                mr.prepare_block_use(blk, a, R)
            assert read(blk.ptr, 4096, a) == b"\x2a" * 4096
            if tracks(mr):
                mr.finish_block_use(blk, a, R)
        mr.deallocate(blk)  # the retry frees it
        with pytest.raises(ig.DoubleFreeError):
            mr.deallocate(blk)
        dev.synchronize()
        mr.reap_pending()
        trim = getattr(mr, "trim", None)
        if trim is not None:
            trim()
        mr.reap_pending()
        assert _adaptor_counts(mr) == counts0
        if free0 is not None:
            assert _device_free(backend) == free0, "device memory leaked"
        del keep
    finally:
        backend.clear_faults()
        for s in (a, s1, s2):
            s.close()


def test_a_refused_free_keeps_the_block_ordered_after_its_uses(dev, backend, streams):
    """The release ordering was queued, then the driver refused the free: a later use on
    a third stream must still wait for the write it ordered (the hazard record is sound)."""
    mr = make(dev, "async")
    a, s1, s2 = streams
    blk = mr.allocate(4096, a)
    mr.prepare_block_use(blk, s1, W)
    sleep_on(s1, 0.25)
    keep = write(blk.ptr, b"\x07" * 4096, s1)  # a late write on s1
    mr.finish_block_use(blk, s1, W)
    backend.inject_fault("mem_free_async", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        mr.deallocate(blk)  # made a wait for s1, then failed
    mr.prepare_block_use(blk, s2, R)
    out = pinned(4096)
    read_into(out, blk.ptr, s2)
    mr.finish_block_use(blk, s2, R)
    dev.synchronize()
    assert (out == 7).all(), "the read on s2 ran before s1's write: the failed free lost the ordering"
    mr.deallocate(blk)
    mr.reap_pending()
    assert mr.bytes_outstanding == 0
    del keep


@pytest.mark.parametrize("base,op", [("pool_direct", "mem_free"), ("pool_async", "mem_free_async"),
                                     ("pool_direct", "stream_synchronize")])
def test_a_pool_whose_upstream_refuses_a_segment_free_keeps_it(dev, backend, streams, base, op):
    pool = make(dev, base)
    a, b = streams[0], streams[1]
    free0 = _device_free(backend)
    blocks = [pool.allocate(1000, a), pool.allocate(3 << 20, a)]  # a small and a large segment
    for blk in blocks:
        pool.deallocate(blk)
    if op == "stream_synchronize":  # a piece now on stream b: its release waits for b (on the host)
        pool.deallocate(pool.allocate(1000, b))
    reserved = pool.bytes_reserved
    assert reserved == (2 << 20) + (20 << 20) and pool.bytes_cached == reserved
    backend.inject_fault(op, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError, match="injected fault"):
        pool.trim()
    backend.clear_faults()
    released_first = reserved - pool.bytes_reserved  # segments released before the refused one
    assert pool.bytes_cached == pool.bytes_reserved == pool.upstream.bytes_outstanding
    again = pool.allocate(1000, a)  # the cache is still whole and usable
    pool.deallocate(again)
    assert pool.trim() == reserved - released_first  # and a later trim releases the rest
    pool.upstream.reap_pending()
    assert pool.bytes_reserved == 0 and pool.upstream.bytes_outstanding == 0
    if free0 is not None:
        assert _device_free(backend) == free0


def test_pinned_release_and_trim_survive_refused_driver_calls(dev, backend, streams):
    ph = ig.PinnedHostResource()
    buf = ph.allocate(5000)
    buf.array[:] = 3
    backend.inject_fault("event_record", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        buf.release(streams[0])
    assert ph.bytes_outstanding == 8192 and ph.bytes_cached == 0
    assert (buf.array == 3).all()  # still the caller's
    buf.release(streams[0])
    assert ph.bytes_outstanding == 0 and ph.bytes_cached == 8192
    other = ph.allocate(100_000)
    other.release()
    backend.inject_fault("host_free", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        ph.trim()
    assert ph.bytes_cached == 8192 + 131072, "a refused host free lost the cached buffers"
    assert ph.trim() == 8192 + 131072
    assert ph.bytes_cached == 0


@pytest.mark.parametrize("op", ["stream_synchronize", "vmm_release", "vmm_unmap", "vmm_free_address"])
def test_vmm_free_refused_at_each_step_can_be_finished(dev, backend, op):
    mr = ig.VmmResource(dev)
    s = dev.create_stream()
    free0 = _device_free(backend)
    blk = mr.allocate(100, s)
    keep = write(blk.ptr, b"\x11" * 100, s)
    fd = mr.export_fd(blk)
    os_close = __import__("os").close
    os_close(fd)
    n = mr.bytes_outstanding
    backend.inject_fault(op, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError, match="injected fault"):
        mr.deallocate(blk)
    backend.clear_faults()
    assert blk.state is BlockState.LIVE and mr.bytes_outstanding == n
    if op == "vmm_free_address":  # unmapped already: no longer usable, but still this resource's
        with pytest.raises(ig.UseAfterFreeError):
            mr.export_fd(blk)
        with pytest.raises(ig.UseAfterFreeError):
            mr.prepare_block_use(blk, s, R)
    else:  # still mapped: usable, exportable, bytes intact
        assert read(blk.ptr, 100, s) == b"\x11" * 100
        os_close(mr.export_fd(blk))
    mr.deallocate(blk)
    assert blk.state is BlockState.FREED and mr.bytes_outstanding == 0
    with pytest.raises(ig.DoubleFreeError):
        mr.deallocate(blk)
    if free0 is not None:
        assert _device_free(backend) == free0
    del keep
    s.close()


def test_guard_keeps_what_its_upstream_refuses(dev, backend, streams):
    s = streams[0]
    free0 = _device_free(backend)
    g = ig.DebugGuardResource(ig.DirectResource(dev), quarantine_count=0)  # frees go straight upstream
    blk = g.allocate(1000, s)
    backend.inject_fault("mem_free", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        g.deallocate(blk)
    assert blk.state is BlockState.LIVE and g.bytes_outstanding == 1000
    g.deallocate(blk)
    assert g.bytes_outstanding == 0 and g.upstream.bytes_outstanding == 0
    q = ig.DebugGuardResource(ig.DirectResource(dev))  # with a quarantine: the flush is refused
    blk = q.allocate(1000, s)
    q.deallocate(blk)
    held = q.quarantined_bytes
    backend.inject_fault("mem_free", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        q.flush()
    assert q.quarantined_bytes == held and q.quarantined_count == 1 and blk.state is BlockState.QUARANTINED
    q.flush()
    assert q.quarantined_count == 0 and blk.state is BlockState.FREED and q.upstream.bytes_outstanding == 0
    if free0 is not None:
        assert _device_free(backend) == free0


# -- AsyncResource reports true figures (issue #14, item 14) ------------------------------------

def _gate(stream):
    """Hold ``stream`` until the returned event is set (set it within 10 s, or it opens itself)."""
    gate = threading.Event()
    stream.launch_host_func(lambda: gate.wait(10))
    return gate


def test_async_reaps_completed_frees_without_a_host_sync(dev, streams):
    mr = make(dev, "async")
    s = streams[0]
    blocks = [mr.allocate(1 << 20, s) for _ in range(4)]
    gate = _gate(s)
    for b in blocks:
        mr.deallocate(b)
    t0 = time.perf_counter()
    assert mr.bytes_outstanding == 4 << 20  # the frees are queued behind the gate: still held
    assert mr.memory_numbers()["cached_bytes"] == 4 << 20
    assert time.perf_counter() - t0 < 2, "reporting waited for the stream"
    gate.set()
    s.synchronize()  # the test waits; the resource never did
    assert mr.bytes_outstanding == 0, "frees the stream already reached are still counted"
    assert all(b.state is BlockState.FREED for b in blocks)
    assert mr.memory_numbers() == {"live_bytes": 0, "cached_bytes": 0, "largest_free_block": 0}


def test_async_figures_stay_true_in_a_loop_that_never_reports(dev, streams):
    mr = make(dev, "async")
    s = streams[0]
    from ignis.memory.async_resource import REAP_BATCH
    first = []
    for i in range(3 * REAP_BATCH):
        b = mr.allocate(4096, s)
        mr.deallocate(b)
        if i < REAP_BATCH:
            first.append(b)
        if i == REAP_BATCH:
            s.synchronize()
    # deallocate covered its batches with events and reaped the reached ones by itself
    assert all(b.state is BlockState.FREED for b in first)
    s.synchronize()
    assert mr.bytes_outstanding == 0


def test_async_out_of_memory_message_counts_only_queued_frees(streams):
    be = ig.backends.emulated.EmulatedBackend(devices=1, memory="64MiB")
    prev = ig.get_backend()
    ig.set_backend(be)
    try:
        d = ig.Device(0)
        s = d.create_stream()
        mr = ig.AsyncResource(d)
        a = mr.allocate(40 << 20, s)
        mr.deallocate(a)
        s.synchronize()  # the free has happened on the device
        b = mr.allocate(30 << 20, s)
        with pytest.raises(ig.OutOfMemoryError) as ei:
            mr.allocate(50 << 20, s)
        assert ei.value.cached_bytes == 0 and ei.value.live_bytes == 30 << 20, str(ei.value)
        assert "0 B cached" in str(ei.value)
        assert mr.bytes_outstanding == 30 << 20
        mr.deallocate(b)
        s.synchronize()
        assert mr.bytes_outstanding == 0
        s.close()
    finally:
        ig.set_backend(prev)


def test_async_frees_of_a_closed_stream_are_reaped(dev):
    mr = make(dev, "async")
    s = dev.create_stream()
    blk = mr.allocate(1 << 20, s)
    gate = _gate(s)
    mr.deallocate(blk)
    s.close()  # the close hook covers the queued free with a last event
    assert mr.bytes_outstanding == 1 << 20
    gate.set()
    dev.synchronize()
    assert mr.bytes_outstanding == 0 and blk.state is BlockState.FREED


def test_async_reap_pending_failure_keeps_the_frees_counted(dev, backend, streams):
    mr = make(dev, "async")
    s = streams[0]
    gate = _gate(s)
    blk = mr.allocate(1 << 20, s)
    mr.deallocate(blk)
    backend.inject_fault("stream_synchronize", error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        mr.reap_pending()
    assert mr.bytes_outstanding == 1 << 20 and blk.state is BlockState.RETIRED
    gate.set()
    mr.reap_pending()
    assert mr.bytes_outstanding == 0 and blk.state is BlockState.FREED


# -- the tracking resources' lock (ResourceLock, compiled) ----------------------------
def test_resource_lock_behaves_like_threading_lock(dev):
    from ignis.memory.resource import ResourceLock
    pool = ig.PoolResource(ig.DirectResource(dev))
    lock = pool._lock
    assert isinstance(lock, ResourceLock) and not lock.locked()
    assert lock.acquire() is True and lock.locked()
    assert lock.acquire(blocking=False) is False  # not reentrant
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.05) is False
    assert time.monotonic() - t0 >= 0.04
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(timeout=-2)
    with lock:
        assert lock.locked()
    assert not lock.locked()


class _Alarm(Exception):
    pass


def _interrupted_by_alarm(wait) -> None:
    """``wait()`` blocks; a SIGALRM handler's exception, 0.1 s later, must end it."""
    import signal

    def handler(signum, frame):
        raise _Alarm

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(_Alarm):
            wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_resource_lock_wait_runs_signal_handlers_and_takes_a_release_from_another_thread(dev):
    from ignis.memory.resource import ResourceLock
    lock = ResourceLock()
    lock.acquire()
    _interrupted_by_alarm(lock.acquire)  # blocks: the handler runs and its exception ends the wait
    assert lock.locked()
    t = threading.Timer(0.05, lock.release)  # a release from another thread lets the waiter in
    t.start()
    assert lock.acquire(timeout=5) is True
    t.join()
    lock.release()


def test_reentrant_lock_is_reentrant_per_thread_and_excludes_other_threads():
    from ignis.memory.resource import ReentrantLock
    from ignis.safety.sanitizer import sanitizer
    assert isinstance(sanitizer._lock, ReentrantLock)  # the sanitizer's callbacks take it
    lock = ReentrantLock()
    assert not lock.held()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.give()
    lock.take()
    lock.take()  # again, by its holder: no wait
    assert lock.held()
    entered = threading.Event()

    def other() -> None:
        with pytest.raises(RuntimeError, match="does not hold"):
            lock.give()  # not its lock to give
        with lock:  # waits, the GIL released, for both gives
            entered.set()

    t = threading.Thread(target=other)
    t.start()
    lock.give()
    assert not entered.wait(0.1) and lock.held()  # one take still held
    lock.give()
    assert not lock.held()
    t.join(10)
    assert entered.is_set() and not lock.held()
    with lock:
        with lock:
            assert lock.held()
        assert lock.held()
    assert not lock.held()
    with pytest.raises(TypeError, match="pickle"):
        import pickle
        pickle.dumps(lock)


def test_reentrant_lock_wait_runs_signal_handlers():
    from ignis.memory.resource import ReentrantLock
    lock = ReentrantLock()
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        _interrupted_by_alarm(lock.take)  # the handler's exception ends the wait, the lock not taken
    finally:
        done.set()
        t.join(10)
    assert not lock.held()
    lock.take()
    lock.give()


def test_resource_lock_held_elsewhere_makes_the_pool_wait(dev):
    pool = ig.PoolResource(ig.DirectResource(dev))
    s = dev.default_stream
    blk = pool.allocate(4096, s)
    done = threading.Event()

    def free() -> None:
        pool.deallocate(blk)  # waits (GIL released) until the main thread lets go
        done.set()

    with pool._lock:
        t = threading.Thread(target=free)
        t.start()
        assert not done.wait(0.1)  # the compiled deallocate waits for the lock
        assert blk.state is BlockState.LIVE
    t.join(10)
    assert done.is_set() and blk.state is BlockState.RETIRED
    pool.close()


def test_same_stream_tracked_uses_make_no_direct_driver_call(dev):
    from ignis.memory.resource import driver_calls
    pool = ig.PoolResource(ig.DirectResource(dev))
    s = dev.default_stream
    blk = pool.allocate(4096, s)
    before = driver_calls()
    assert set(before) == {"event_record", "stream_wait_event"}
    for acc in (R, W, RW):
        pool.prepare_block_use(blk, s, acc)
        pool.finish_block_use(blk, s, acc)
    assert driver_calls() == before
    pool.deallocate(blk)
    pool.close()


# -- the direct driver path of compiled tracking: when it must stay off ----------------
# On cuda, tracking queues its event records and stream waits straight to the driver
# (ignis.memory.resource.driver_calls counts them) without calling the backend's methods.
# That is only right while those methods have nothing to add: no fault of the
# fault-injecting wrapper is armed (the armed call must fail), and no trace listener is
# subscribed (the sanitizer, or any listener, must hear every record and wait). The
# emulator offers no direct path, so these tests give it one, as the cuda backend does:
# handle tables, a current-context record and two C entry points (ctypes callbacks that
# do what the emulator's own methods do, and count).

_RECORD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_WAIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)


class _DirectEmulated(ignis.backends.emulated.EmulatedBackend):
    """An emulated backend whose ``direct_calls`` offers the direct driver path."""

    def __init__(self) -> None:
        super().__init__(devices=1, memory="64MiB", jitter=False)
        self.ctx_dev = types.SimpleNamespace(ctx=object())  # the "device" whose context is current
        self.current = types.SimpleNamespace(ctx=self.ctx_dev.ctx)
        self.ctx_epoch = [0]  # bumped, as the cuda backend's, whenever ``current.ctx`` changes
        self.direct = {"event_record": 0, "stream_wait_event": 0}
        self.stream_table: dict[int, tuple] = {}
        self.event_table: dict[int, tuple] = {}
        base = ignis.backends.emulated.EmulatedBackend

        def record(event: int | None, stream: int | None) -> int:
            try:
                base.event_record(self, event or 0, stream or 0)
            except Exception:  # noqa: BLE001 - a refused call: tracking makes it again through the method
                return 1
            self.direct["event_record"] += 1
            return 0

        def wait(stream: int | None, event: int | None, flags: int) -> int:
            try:
                base.stream_wait_event(self, stream or 0, event or 0)
            except Exception:  # noqa: BLE001
                return 1
            self.direct["stream_wait_event"] += 1
            return 0

        self._raw = (_RECORD_FN(record), _WAIT_FN(wait))  # kept alive with the backend

    def stream_create(self, ordinal: int, priority: int = 0) -> int:
        h = super().stream_create(ordinal, priority)
        self.stream_table[h] = (self.ctx_dev, None)
        return h

    def event_create(self, ordinal: int, timing: bool = False) -> int:
        h = super().event_create(ordinal, timing)
        self.event_table[h] = (self.ctx_dev, None)
        return h

    def direct_calls(self):
        raw = (*(ctypes.cast(f, ctypes.c_void_p).value for f in self._raw), 0)  # no direct launch
        return self._direct_calls(self.stream_table, self.event_table, self.current, self.ctx_epoch, raw)


class _Heard(ig.backends.trace.TraceListener):
    def __init__(self) -> None:
        self.heard = {"event_record": 0, "stream_wait_event": 0}

    def on_event_record(self, event: int, stream: int) -> None:
        self.heard["event_record"] += 1

    def on_stream_wait_event(self, stream: int, event: int) -> None:
        self.heard["stream_wait_event"] += 1


@pytest.fixture
def direct():
    """The process's backend, for the test: a fault-injecting wrapper over ``_DirectEmulated``;
    yields ``(wrapper, inner, pool, s1, s2)``."""
    from ignis.backends.faults import FaultInjectingBackend
    inner = _DirectEmulated()
    wrapper = FaultInjectingBackend(inner)
    prev = ig.get_backend()
    ig.set_backend(wrapper)
    try:
        d = ig.Device(0)
        pool = ig.PoolResource(ig.DirectResource(d))
        s1, s2 = d.create_stream(), d.create_stream()
        yield wrapper, inner, pool, s1, s2
        wrapper.clear_faults()
        d.synchronize()
        pool.close()
        s1.close(), s2.close()
    finally:
        ig.set_backend(prev)
        inner.rebuild_context(0)  # stops its worker threads


def _cross_stream_uses(pool, s1, s2) -> None:
    """A block written on s1, read on s2, written on s1 again: records and waits either way."""
    blk = pool.allocate(4096, s1)
    for s, acc in ((s1, W), (s2, R), (s1, W)):
        pool.prepare_block_use(blk, s, acc)
        pool.finish_block_use(blk, s, acc)
    pool.deallocate(blk)


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def test_the_direct_driver_path_runs_with_nothing_to_observe(direct):
    from ignis.memory.resource import driver_calls
    wrapper, inner, pool, s1, s2 = direct
    assert ig.memory.ordering.checker is None
    before, direct_before = driver_calls(), dict(inner.direct)
    _cross_stream_uses(pool, s1, s2)
    made = _delta(driver_calls(), before)
    assert made["event_record"] >= 1 and made["stream_wait_event"] >= 1
    assert _delta(inner.direct, direct_before) == made  # each one reached the (stand-in) driver


def test_the_direct_driver_path_follows_the_threads_current_context(direct):
    """The direct path answers "is this device's context current here" from a cache of the
    last (thread, epoch, device) that passed; a change of the current context (which bumps
    the epoch) or another thread asks again, and the calls then go through the methods."""
    from ignis.memory.resource import driver_calls
    wrapper, inner, pool, s1, s2 = direct
    _cross_stream_uses(pool, s1, s2)  # warms the cache
    before = driver_calls()
    inner.current.ctx = object()  # another context made current on this thread
    inner.ctx_epoch[0] += 1
    _cross_stream_uses(pool, s1, s2)
    assert driver_calls() == before  # not current: the backend's methods made every call
    inner.current.ctx = inner.ctx_dev.ctx
    inner.ctx_epoch[0] += 1
    _cross_stream_uses(pool, s1, s2)
    assert driver_calls()["event_record"] > before["event_record"]
    seen: list = []

    def other_thread() -> None:
        # A thread with no context current (the record reads None, as a fresh thread's
        # threading.local would) and the epoch unmoved: the cache, keyed by thread, misses.
        inner.current.ctx = None
        b = driver_calls()
        _cross_stream_uses(pool, s1, s2)
        seen.append(driver_calls() == b)
        inner.current.ctx = inner.ctx_dev.ctx

    _cross_stream_uses(pool, s1, s2)  # the cache holds this thread
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == [True]


def test_an_armed_fault_keeps_the_direct_driver_path_off(direct):
    """An armed fault of the wrapper, due or not, sends every record and wait through the
    wrapper's methods: the armed call fails as the driver would, the others still work."""
    from ignis.errors import DriverError
    from ignis.memory.resource import driver_calls
    wrapper, inner, pool, s1, s2 = direct
    before, direct_before = driver_calls(), dict(inner.direct)
    wrapper.inject_fault("mem_free", nth=1000)  # armed, never due here
    _cross_stream_uses(pool, s1, s2)
    assert driver_calls() == before and inner.direct == direct_before
    wrapper.clear_faults()
    blk = pool.allocate(4096, s1)
    pool.prepare_block_use(blk, s1, W)
    pool.finish_block_use(blk, s1, W)
    wrapper.inject_fault("stream_wait_event", error="CUDA_ERROR_LAUNCH_FAILED")
    with pytest.raises(DriverError, match="injected fault") as ei:
        pool.prepare_block_use(blk, s2, R)
    assert ei.value.name == "CUDA_ERROR_LAUNCH_FAILED" and ei.value.call == "cuStreamWaitEvent"
    assert driver_calls() == before and inner.direct == direct_before
    assert not wrapper.armed_faults()
    pool.prepare_block_use(blk, s2, R)  # disarmed: the direct path again
    pool.finish_block_use(blk, s2, R)
    assert driver_calls()["stream_wait_event"] > before["stream_wait_event"]
    pool.deallocate(blk)


def test_a_trace_listener_keeps_the_direct_driver_path_off_and_hears_every_call(direct):
    from ignis.backends import trace
    from ignis.memory.resource import driver_calls
    wrapper, inner, pool, s1, s2 = direct
    before = driver_calls()
    _cross_stream_uses(pool, s1, s2)
    unobserved = _delta(driver_calls(), before)
    listener = _Heard()
    trace.subscribe(listener, wrapper)  # through the wrapper: the inner backend's list
    try:
        before, direct_before = driver_calls(), dict(inner.direct)
        _cross_stream_uses(pool, s1, s2)
        assert driver_calls() == before and inner.direct == direct_before
        assert listener.heard == unobserved  # every record and wait the direct path would have made
    finally:
        trace.unsubscribe(listener, wrapper)
    before = driver_calls()
    _cross_stream_uses(pool, s1, s2)
    assert _delta(driver_calls(), before) == unobserved
