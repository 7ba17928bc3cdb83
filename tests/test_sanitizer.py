"""Kernels, ordering policies and the sanitizer: the bug zoo and the correct programs.

Each bug class is a small program that must be caught with the right error
and fields; each correct program must raise nothing, run many times (under
the emulator's jitter where the backend is emulated).
"""

from __future__ import annotations

from contextlib import closing
import gc

import numpy as np
import pytest

import ignis as ig
import ignis.backends.emulated  # noqa: F401 - tests build emulated backends
from ignis.memory import Access

K = ig.kernels


def two(dev, a, b, n=4096, dtype="float32"):
    """Arrays made before the test's work, so allocation itself orders nothing."""
    x = ig.empty(n, dtype, stream=a)
    y = ig.empty(n, dtype, stream=b)
    dev.synchronize()
    return x, y


# -- kernels ---------------------------------------------------------------------------

def test_builtin_kernels_compute(dev):
    x = ig.from_numpy(np.arange(1000, dtype=np.float32))
    y = ig.full(1000, 1.0)
    K.axpy(y, x, 2.0)
    np.testing.assert_allclose(y.to_numpy(), 2 * np.arange(1000) + 1)
    z = ig.empty(10, "float32")
    K.gather(z, x, 100, 3)
    assert z.to_numpy().tolist() == [3 + 100 * i for i in range(10)]
    c = ig.empty(1000, "float32")
    K.copy(c, x)
    assert (c.to_numpy() == x.to_numpy()).all()
    for dt, v in (("int64", -7), ("bfloat16", 1.5), ("uint8", 9), ("float64", 0.25)):
        a = ig.empty(333, dt)
        K.fill(a, v)
        assert (a.to_numpy() == np.array(v, a.dtype.numpy)).all()
    z = ig.empty(8, "float32")
    for v in (0.0, -0.0, 0, -0.0, 0.0):  # equal values with different bits
        K.fill(z, v)
        assert z.to_numpy().view(np.uint32).tolist() == [np.array(v, np.float32).view(np.uint32)] * 8


def test_custom_kernel_and_declared_ranges(dev):
    src = r'''extern "C" __global__ void twice(float* out, const float* inp, long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) out[i] = 2.0f * inp[i]; }'''

    def host(out, inp, n):
        out[0:int(n)] = 2 * inp[0:int(n)]

    k = ig.Kernel(src, "twice", (ig.Access.WRITE, "read", "int64"), host)
    a = ig.from_numpy(np.arange(64, dtype=np.float32))
    b = ig.zeros(64)
    ig.launch(k, 1, 64, b, a, 64)
    assert (b.to_numpy() == 2 * np.arange(64)).all()
    with pytest.raises(TypeError, match="declares 3 argument"):
        ig.launch(k, 1, 64, b, a)
    with pytest.raises(TypeError, match="an array"):
        ig.launch(k, 1, 64, 5, a, 64)
    bad = ig.Kernel(src, "twice", ((ig.Access.WRITE, lambda o, i, n: (0, 8 * n)), "read", "int64"), host)
    with pytest.raises(ig.OutOfBoundsError, match="declares bytes"):
        ig.launch(bad, 1, 64, b, a, 64)
    with pytest.raises(ValueError, match="neither an access"):
        ig.Kernel(src, "twice", ("sideways",), host)


def test_launch_preflight_refuses_untracked_resource(dev):
    direct = ig.DirectResource(dev)
    a = ig.zeros(16, mr=direct)
    a.stream.synchronize()
    calls = []
    orig = dev.backend.kernel_launch
    dev.backend.kernel_launch = lambda *x: calls.append(x)
    try:
        with pytest.raises(ig.StreamMisuseError, match="refused before launch"):
            K.fill(a, 1.0)
    finally:
        del dev.backend.kernel_launch
    assert calls == [] and orig is not None  # nothing was queued
    a.free()


def test_faulting_kernel_fails_the_stream(on_emulated):
    def boom(p, n):
        p[-10**9] = 1  # far outside the allocation: the emulator's illegal address

    d = ig.Device(ig.device_count() - 1)  # a fault poisons the context: use a device we can rebuild
    k = ig.Kernel(None, "boom", ("write", "int64"), boom)
    s = d.create_stream()
    a = ig.zeros(8, stream=s)
    ig.launch(k, 1, 1, a, 8, stream=s)
    try:
        with pytest.raises(ig.DriverError, match="illegal address") as ei:
            s.synchronize()
        assert ei.value.name == "CUDA_ERROR_LAUNCH_FAILED"
    finally:
        d.rebuild()


# -- ordering: auto makes the racy programs correct -----------------------------------------

def test_auto_ordering_orders_racy_program(dev, streams):
    a, b, _ = streams
    for _ in range(5):
        x, y = two(dev, a, b, 1 << 16)
        a.launch_host_func(lambda: __import__("time").sleep(0.02))
        K.fill(x, 3.0, stream=a)
        K.copy(y, x, stream=b)  # auto: waits for the fill
        assert (y.to_numpy(stream=b) == 3.0).all()


def test_a_same_stream_read_still_orders_a_later_write_elsewhere(dev, streams):
    # A read on the block's own stream records nothing (the block stays "clean"),
    # yet a write on another stream afterwards waits for it.
    a, b, _ = streams
    for _ in range(5):
        x, _ = two(dev, a, b, 1 << 16)
        y = ig.empty(1 << 16, "float32", stream=a)
        K.fill(x, 3.0, stream=a)
        a.launch_host_func(lambda: __import__("time").sleep(0.02))
        K.copy(y, x, stream=a)
        K.fill(x, 5.0, stream=b)  # auto: waits for the copy's read on a
        assert (y.to_numpy(stream=a) == 3.0).all()
        assert (x.to_numpy(stream=b) == 5.0).all()


def test_ordering_scopes(dev, streams):
    a = streams[0]
    assert ig.get_ordering() == "auto"
    with ig.ordering("manual"):
        assert ig.get_ordering() == "manual" and ig.get_ordering(a) == "manual"
        ig.set_ordering("auto", stream=a)
        assert ig.get_ordering(a) == "auto"
        ig.set_ordering(None, stream=a)
    assert ig.get_ordering() == "auto"
    with pytest.raises(ValueError, match="auto.*manual"):
        ig.set_ordering("sometimes")


# -- the bug zoo ----------------------------------------------------------------------------

def test_read_after_write_race(dev, streams, san, manual):
    a, b, _ = streams
    x, y = two(dev, a, b)
    K.fill(x, 1.0, stream=a)
    with pytest.raises(ig.RaceError) as ei:
        K.copy(y, x, stream=b)
    e = ei.value
    assert e.kind == "read-after-write race"
    assert e.first["stream"] == a.id and e.first["kind"] == "write" and e.first["op"] == "ignis_fill_float32"
    assert e.second["stream"] == b.id and e.second["kind"] == "read" and e.second["range"] == (0, 4 * 4096)
    assert "test_sanitizer.py" in e.first["stack"] and "test_sanitizer.py" in e.second["stack"]


def test_both_stacks_start_at_the_users_own_line(dev, streams, san, manual):
    # The tracked use, the tracking and the sanitizer are compiled (no Python frames of
    # their own): each stack must still start at the line of the program that made the use.
    a, b, _ = streams
    x, _y = two(dev, a, b)
    with x.use(a, "write"):
        pass  # the write's site
    with pytest.raises(ig.RaceError) as ei:
        with x.use(b, "read"):
            pass  # the read's site
    e = ei.value
    first = e.first["stack"].strip().splitlines()
    second = e.second["stack"].strip().splitlines()
    assert first[-1].strip() == 'with x.use(a, "write"):', e.first["stack"]
    assert second[-1].strip() == 'with x.use(b, "read"):', e.second["stack"]


def test_write_after_read_race(dev, streams, san, manual):
    a, b, _ = streams
    x, y = two(dev, a, b)
    K.fill(x, 1.0, stream=a)
    a.synchronize()
    K.copy(y, x, stream=b)  # reads x on b
    with pytest.raises(ig.RaceError) as ei:
        K.fill(x, 2.0, stream=a)  # overwrites x on a without waiting for b's read
    assert ei.value.kind == "write-after-read race"


def test_write_after_write_race(dev, streams, san, manual):
    a, b, _ = streams
    x, _ = two(dev, a, b)
    K.fill(x, 1.0, stream=a)
    with pytest.raises(ig.RaceError) as ei:
        K.fill(x, 2.0, stream=b)
    assert ei.value.kind == "write-after-write race"


def test_byte_ranges_are_precise(dev, streams, san, manual):
    # Two streams writing disjoint halves of one block do not race.
    a, b, _ = streams
    x, _ = two(dev, a, b, 1024)
    K.fill(x[:512], 1.0, stream=a)
    K.fill(x[512:], 2.0, stream=b)
    with pytest.raises(ig.RaceError):
        K.fill(x[256:768], 3.0, stream=b)  # overlaps a's half


def test_free_while_other_stream_reads(dev, streams, san, manual):
    a, b, _ = streams
    x, y = two(dev, a, b)
    K.fill(x, 1.0, stream=a)
    a.synchronize()
    K.copy(y, x, stream=b)  # b still reading x
    with pytest.raises(ig.RaceError) as ei:
        x.free()  # freed on a with no wait on b
    assert ei.value.kind == "use-after-free race"
    assert ei.value.first["kind"] == "read" and ei.value.second["kind"] == "free"


def test_reuse_race_is_reported(dev, streams, manual):
    ig.sanitizer.disable()
    ig.sanitizer.enable("collect")
    try:
        a, b, _ = streams
        mr = ig.PoolResource(ig.DirectResource(dev))
        x = ig.empty(4096, "float32", stream=a, mr=mr)
        y = ig.empty(4096, "float32", stream=b, mr=mr)
        dev.synchronize()
        K.fill(x, 1.0, stream=a)
        a.synchronize()
        K.copy(y, x, stream=b)
        ptr = x.device_ptr
        x.free()  # reported (collect mode goes on)
        z = ig.empty(4096, "float32", stream=a, mr=mr)  # reuses the memory
        assert z.device_ptr == ptr
        K.fill(z, 5.0, stream=a)  # new owner writes while b may still read the old bytes
        kinds = [r.kind for r in ig.sanitizer.reports()]
        assert "use-after-free race" in kinds and "reuse race" in kinds
        reuse = next(r for r in ig.sanitizer.reports() if r.kind == "reuse race")
        assert reuse.first["generation"] != reuse.second["generation"]
        assert "problem(s) found" in ig.sanitizer.sanitizer.summary()
    finally:
        dev.synchronize()
        ig.sanitizer.sanitizer.clear()
        ig.sanitizer.disable()


def test_use_after_free_on_the_host(dev):
    x = ig.zeros(8)
    gen = x.generation
    x.free()
    with pytest.raises(ig.UseAfterFreeError) as ei:
        K.fill(x, 1.0)
    assert ei.value.array_id == x.id and ei.value.generation == gen


def test_double_free(dev):
    x = ig.zeros(8)
    x.free()
    with pytest.raises(ig.DoubleFreeError) as ei:
        x.free()
    assert ei.value.array_id == x.id


def test_stale_handle_after_rebuild():
    d = ig.Device(ig.device_count() - 1)
    x = ig.zeros(8, device=d)
    r = x.ref()
    d.rebuild()
    with pytest.raises(ig.StaleHandleError) as ei:
        r.access()
    assert ei.value.reason == "context rebuilt" and ei.value.current_generation == ei.value.generation + 1


def test_declared_access_outside_the_block(dev, san):
    x = ig.zeros(16)
    with pytest.raises(ig.OutOfBoundsError) as ei:
        x._mr.prepare_block_use(x._block, x.stream, Access.WRITE, (x._block.bytes - 4, 64, "overrun"))
    assert ei.value.side == "after" and ei.value.ptr == x._block.ptr


def test_ownership_violation(dev):
    x = ig.zeros(8)
    ig.contract.acquire(x, by="io")
    try:
        with pytest.raises(ig.MemoryContractViolation) as ei:
            x.free()
        assert ei.value.owner == "io" and ei.value.caller == "compute"
    finally:
        ig.contract.release(x, by="io")


def test_leak_is_reported_by_the_audit(dev):
    c = ig.MemoryContract()
    c.track_all = True
    prev = ig.contract.track_all
    ig.contract.track_all = True
    try:
        leaked = ig.zeros(4, tag="leaky-cache")
        rows = [r for r in ig.contract.audit(older_than=0.0) if r["array_id"] == leaked.id]
        assert rows and rows[0]["tag"] == "leaky-cache" and rows[0]["owner"] == "compute"
    finally:
        ig.contract.track_all = prev


# -- correct programs: nothing is reported -------------------------------------------------------

def _correct_programs(dev, a, b):
    x, y = two(dev, a, b, 2048)
    # events
    K.fill(x, 1.0, stream=a)
    ev = a.record()
    b.wait(ev)
    K.copy(y, x, stream=b)
    # stream wait on a stream
    K.fill(x, 2.0, stream=b)  # b already ordered after a's fill and after its own read
    a.wait(b)
    K.axpy(x, y, 1.0, stream=a)
    # host synchronization
    a.synchronize()
    K.fill(y, 4.0, stream=b)
    a.wait(b)
    # same-stream chain
    for v in (5.0, 6.0):
        K.fill(x, v, stream=a)
        K.copy(y, x, stream=a)
    b.wait(a)
    got = y.to_numpy(stream=b)
    assert (got == 6.0).all()
    b.synchronize()
    x.free()
    y.free()


def test_correct_programs_raise_nothing(dev, streams, san, manual):
    a, b, _ = streams
    for _ in range(3):
        _correct_programs(dev, a, b)
    assert ig.sanitizer.sanitizer.checked > 0


def test_correct_programs_under_jitter(manual):
    be = ig.backends.emulated.EmulatedBackend(devices=1, jitter=(1234, 300.0))
    prev = ig.get_backend()
    ig.set_backend(be)
    ig.sanitizer.disable()
    ig.sanitizer.enable("raise")
    try:
        d = ig.Device(0)
        a, b = d.create_stream(), d.create_stream()
        for _ in range(10):
            _correct_programs(d, a, b)
        a.close(), b.close()
    finally:
        ig.sanitizer.disable()
        ig.set_backend(prev)


TRACED = ("event_record", "stream_wait_event", "stream_synchronize", "event_synchronize", "device_synchronize",
          "stream_query", "event_query", "stream_destroy", "event_destroy")


def test_sanitizer_observes_through_the_trace_registry_and_patches_nothing(dev, streams, manual):
    from ignis.backends import trace
    ig.sanitizer.disable()
    b = dev.backend
    funcs = {name: getattr(b, name).__func__ for name in TRACED}
    cls = type(b)
    assert not any(name in vars(b) for name in TRACED)
    assert ig.memory.ordering.checker is None and ig.sanitizer.sanitizer not in trace.listeners(b)
    with ig.sanitizer.enabled():
        assert ig.sanitizer.is_enabled() and ig.sanitizer.sanitizer in trace.listeners(b)
        assert type(b) is cls and {name: getattr(b, name).__func__ for name in TRACED} == funcs
        assert not any(name in vars(b) for name in TRACED)
        # The observation is real: the event record and the stream wait reach the sanitizer
        # (through the backend's trace), so the ordered write passes and the unordered one fails.
        s1, s2, s3 = streams
        x, _ = two(dev, s1, s2)
        K.fill(x, 1.0, stream=s1)
        s2.wait(s1.record())
        K.fill(x, 2.0, stream=s2)
        with pytest.raises(ig.RaceError):
            K.fill(x, 3.0, stream=s3)
        dev.synchronize()
    assert not ig.sanitizer.is_enabled() and ig.sanitizer.sanitizer not in trace.listeners(b)
    assert {name: getattr(b, name).__func__ for name in TRACED} == funcs
    gc.collect()


# -- out of bounds and uninitialized reads: the debug guard ------------------------------------

SHIFTED = r'''extern "C" __global__ void shifted_fill(float* dst, float v, long long start, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) dst[start + i] = v; }'''


def _shifted(dst, v, start, n):
    dst[int(start):int(start) + int(n)] = v


SHIFTED_FILL = ig.Kernel(SHIFTED, "shifted_fill", ("write", "float32", "int64", "int64"), _shifted)


@pytest.fixture
def guard(dev):
    g = ig.DebugGuardResource(ig.PoolResource(ig.memory.current.default_upstream(dev)))
    yield g
    g.flush()


def test_guarded_arrays_are_ordered_across_streams(dev, streams, guard):
    # The guard hands out its own blocks and tracks through the upstream's: a use
    # back on the array's own stream must still wait for a write made elsewhere.
    a, b, _ = streams
    for _ in range(3):
        x = ig.empty(1 << 16, "float32", stream=a, mr=guard)
        y = ig.empty(1 << 16, "float32", stream=a, mr=guard)
        K.fill(x, 1.0, stream=a)
        b.launch_host_func(lambda: __import__("time").sleep(0.02))
        K.fill(x, 3.0, stream=b)
        K.copy(y, x, stream=a)  # must wait for the fill on b
        assert (y.to_numpy(stream=a) == 3.0).all()
        x.free()
        y.free()


@pytest.mark.parametrize("start,side", [(60, "after"), (-3, "before")])
def test_out_of_bounds_write_is_caught(dev, guard, start, side):
    x = ig.empty(64, "float32", mr=guard, tag="weights")
    ig.launch(SHIFTED_FILL, 1, 64, x, 1.0, start, 8)  # writes 4 elements past one end
    with pytest.raises(ig.OutOfBoundsError) as ei:
        x.free()
    e = ei.value
    assert e.side == side and e.tag == "weights"
    assert (e.offset >= 256) if side == "after" else (e.offset < 0)
    assert "test_sanitizer.py" in (e.stack or "")


def test_uninitialized_read_shows_poison(dev, guard):
    x = ig.empty(256, "uint8", mr=guard)
    assert ig.holds_poison(x)
    x[:128].fill_(0)
    assert not ig.holds_poison(x) and ig.first_poisoned_offset(x) == 128
    x.free()


def test_auto_ordered_cross_stream_free_is_not_a_race(dev, streams, san):
    a = ig.zeros(1024)  # on the default stream
    a.zero_(stream=streams[1])  # tracked write elsewhere: the free waits for it
    a.free()


def test_a_closed_stream_keeps_its_identity(dev, san):
    with closing(dev.create_stream()) as s:
        x = ig.zeros(1024, stream=s)
    dev.synchronize()
    x.free()  # freed after its stream closed: its own earlier work is not a race


def test_closed_streams_are_refused_before_the_driver(dev):
    s = dev.create_stream()
    x = ig.zeros(16)
    s.close()
    for op in (lambda: x.zero_(stream=s), lambda: x.to_numpy(stream=s), lambda: K.fill(x, 1.0, stream=s)):
        with pytest.raises(ig.ClosedError):
            op()


def test_kernel_parameters_are_marshalled_per_signature(dev):
    k = ig.Kernel("extern \"C\" __global__ void k(float* y, float a, long long n, unsigned char f) {}", "k",
                  ("read_write", "float32", "int64", "uint8"), lambda *a: None)
    x = ig.empty(16, "float32")
    p = k.marshal(x, 2.5, 1 << 40, 7)
    assert [type(v).__name__ for v in p] == ["c_void_p", "c_float", "c_long", "c_ubyte"] or \
        [type(v).__name__ for v in p] == ["c_void_p", "c_float", "c_longlong", "c_ubyte"]
    assert [p[0].value, p[1].value, p[2].value, p[3].value] == [x.device_ptr, 2.5, 1 << 40, 7]
    x.free()


def test_a_span_beyond_the_address_range_is_refused_before_anything_changes():
    from ignis.safety.sanitizer import WRITE, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    big = 1 << 63
    with pytest.raises(ValueError, match="below 2\\*\\*63"):
        san.foreign_access(0x10, "aten::fill_", None, [(big, 256, big, big + 256, 0, 0, WRITE)])
    with pytest.raises(ValueError, match="not an address range"):
        san.foreign_access(0x10, "aten::fill_", None, [(4096, 256, 4096 + 64, 4096, 0, 0, WRITE)])
    assert not san._live and not san._clock and san.checked_foreign == 0  # nothing was recorded
    san.foreign_access(0x10, "aten::fill_", None, [(4096, 256, 4096, 4096 + 256, 0, 0, WRITE)])
    assert san._live[4096].end == 4096 + 256 and san.checked_foreign == 1


def test_records_and_extents_stay_out_of_the_cyclic_collector():
    """Each first sight makes an extent, each checked access a record in its record list (a C
    struct): neither the extent nor the list (nor the graveyard) is tracked by the cyclic
    collector (whose runs records as objects triggered, about one a training step), and an
    extent made by the checks holds what one made through its class holds."""
    from ignis.safety import sanitizer as mod
    from ignis.safety.sanitizer import READ, WRITE, OUTPUT, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    san.foreign_access(0x10, "aten::fill_", None, [(4096, 256, 4096, 4096 + 256, 0, 0, WRITE | OUTPUT)])
    san.foreign_access(0x10, "aten::sum", None, [(4096, 256, 4096, 4096 + 64, 0, 0, READ)])
    ext = san._live[4096]
    assert [r.kind for r in ext.recs] == ["write", "read"] and not san.reports
    made = mod._Extent(8192, None, 3, 1)
    fields = ("base", "end", "gen", "sid", "recs", "written", "frames", "op", "rs", "held", "pinned", "hv", "lib")
    san.extent_allocated(8192, 0x10)
    fresh = san._live[8192]
    def held(e):  # (a record list compares by its length)
        return {f: len(e.recs) if f == "recs" else getattr(e, f) for f in fields if f not in ("gen", "sid")}
    assert held(fresh) == held(made)
    if not mod._COMPILED:
        pytest.skip("plain Python: extents are ordinary objects")
    assert not gc.is_tracked(ext) and not gc.is_tracked(fresh)
    assert not gc.is_tracked(ext.recs) and not gc.is_tracked(san._grave)


def test_a_synchronization_prunes_only_the_graveyard_entries_the_host_passed():
    """Freed extents wait in the graveyard until the host has waited for their uses: a
    synchronization of one stream drops the entries only it used, keeps (in address order)
    those another stream still uses, and a reuse there still races that use."""
    from ignis.safety.sanitizer import OUTPUT, READ, WRITE, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    A, B = 0x10, 0x20
    bases = [4096 * k for k in range(1, 9)]
    for base in bases:  # each written on A; every other one also read on B (ordered after A's write)
        san.extent_allocated(base, A)
        san.foreign_access(A, "aten::fill_", None, [(base, 256, base, base + 256, 0, 0, WRITE | OUTPUT)])
    san.on_stream_synchronize(A)  # B may now read what A wrote
    for base in bases[::2]:
        san.foreign_access(B, "aten::sum", None, [(base, 256, base, base + 256, 0, 0, READ)])
    for base in bases:
        san.extent_freed(base)
    # Each freed on A while B's read may still run (reported once: the same sites each time).
    assert san.reports and all("use-after-free race" in str(e) for e in san.reports)
    san.reports.clear()
    assert len(san._grave) == 8 and list(san._grave) == sorted(san._grave)  # (base, end), in address order
    san.on_stream_synchronize(A)
    kept = list(san._grave)
    assert [k[0] for k in kept] == bases[::2] and kept == sorted(kept)
    san.foreign_access(A, "aten::fill_", None, [(bases[2], 256, bases[2], bases[2] + 256, 0, 0, WRITE | OUTPUT)])
    assert [type(e).__name__ for e in san.reports] == ["RaceError"] and "reuse race" in str(san.reports[0])
    san.on_stream_synchronize(B)
    assert not san._grave and list(san._grave) == []


def test_packed_items_are_checked_as_the_tuples_they_pack():
    """The op observer hands items over packed (bytes): the same reports, the same state."""
    from ignis.safety.sanitizer import OUTPUT, READ, WRITE, Sanitizer, pack_items, unpack_items

    ops = [  # (stream, op, items): a write on one stream, a read on another without a wait, ...
        (0x10, "aten::fill_", [(4096, 256, 4096, 4096 + 256, 0, 0, WRITE | OUTPUT)]),
        (0x20, "aten::sum", [(4096, 256, 4096, 4096 + 128, 0, 0, READ), (8192, 64, 8192, 8192 + 4, 0, 0, WRITE)]),
        (0x20, "aten::copy_", [(4096, 256, 4096 + 16, 4096 + 256, 32, 16, READ)]),  # a strided view
        (0x10, "aten::zero_", [(8192, 64, 8192, 8192 + 64, 0, 0, WRITE)]),
    ]
    sans = []
    for packed in (False, True):
        san = Sanitizer()
        san.mode = "collect"
        for stream, op, items in ops:
            if packed:
                assert unpack_items(pack_items(items)) == items
            san.foreign_access(stream, op, None, pack_items(items) if packed else items)
        sans.append(san)
    plain, packed = sans
    assert [type(e).__name__ for e in plain.reports] == [type(e).__name__ for e in packed.reports]
    assert [str(e) for e in plain.reports] == [str(e) for e in packed.reports] and plain.reports
    assert plain.checked_foreign == packed.checked_foreign == 5
    assert sorted(plain._live) == sorted(packed._live)
    for base, ext in plain._live.items():
        assert [(r.kind, r.lo, r.hi, r.per, r.ch, r.sid) for r in ext.recs] == \
            [(r.kind, r.lo, r.hi, r.per, r.ch, r.sid) for r in packed._live[base].recs]


def test_bad_packed_items_are_refused_before_anything_changes():
    from ignis.safety.sanitizer import WRITE, Sanitizer, pack_items, unpack_items
    san = Sanitizer()
    san.mode = "collect"
    with pytest.raises(ValueError, match="56 bytes each"):
        san.foreign_access(0x10, "aten::fill_", None, pack_items([(4096, 256, 4096, 4352, 0, 0, WRITE)])[:-1])
    with pytest.raises(ValueError, match="56 bytes each"):
        unpack_items(b"\0" * 55)
    with pytest.raises(ValueError, match="not an address range"):  # an address at or past 2**63 packs negative
        san.foreign_access(0x10, "aten::fill_", None, pack_items([(4096, 256, -256, -1, 0, 0, WRITE)]))
    with pytest.raises(ValueError, match="not an address range"):
        san.foreign_access(0x10, "aten::fill_", None, pack_items([(4096, 256, 4096 + 64, 4096, 0, 0, WRITE)]))
    for base, size in ((-4096, 256), (4096, (1 << 63) - 2048), (4096, -1)):  # an extent past 2**63, in both forms
        with pytest.raises(ValueError, match="not an address range"):
            san.foreign_access(0x10, "aten::fill_", None, pack_items([(base, size, 4096, 4352, 0, 0, WRITE)]))
        with pytest.raises(ValueError, match="not an address range"):
            san.foreign_access(0x10, "aten::fill_", None, [(base, size, 4096, 4352, 0, 0, WRITE)])
    # A stride pattern is (0, 0), or a chunk of at most its period, at most the span: anything else
    # (a chunk past its period could overflow the disjointness test) is refused in both forms.
    for per, ch in ((64, 128), (0, 8), (-64, 8), (1024, 8), (128, (1 << 63) - 10), (-1, -1)):
        with pytest.raises(ValueError, match="stride pattern"):
            san.foreign_access(0x10, "aten::fill_", None, [(4096, 256, 4096, 4352, per, ch, WRITE)])
        if per >= -1 and ch >= -1:
            with pytest.raises(ValueError, match="stride pattern"):
                san.foreign_access(0x10, "aten::fill_", None, pack_items([(4096, 256, 4096, 4352, per, ch, WRITE)]))
    assert not san._live and not san._clock and san.checked_foreign == 0


def test_another_checker_adds_its_reports_to_the_list():
    # The guard's front hands the problems it finds to the sanitizer through the memory layer's
    # checker slot: grouped by key with the sanitizer's own while it collects, raised in raise mode.
    from ignis.memory.hooks import HOOKS
    from ignis.safety.sanitizer import Sanitizer
    san = Sanitizer()
    san.enable("collect")
    try:
        assert HOOKS.checker is san
        for _ in range(2):
            san.add_report(ig.OutOfBoundsError("written past the end"), ("guard", "OutOfBoundsError", "after"))
        san.add_report(ig.UseAfterFreeError("written after free"), ("guard", "UseAfterFreeError", None))
        assert [type(e).__name__ for e in san.reports] == ["OutOfBoundsError", "UseAfterFreeError"]
        assert san.reports[0].count == 2
        with pytest.raises(TypeError, match="key must be a tuple"):
            san.add_report(ig.OutOfBoundsError("x"), ["guard"])
        assert len(san.reports) == 2
        san.mode = "raise"
        with pytest.raises(ig.OutOfBoundsError, match="past the end"):
            san.add_report(ig.OutOfBoundsError("past the end"), ("guard", "again"))
    finally:
        san.disable()
    assert HOOKS.checker is None


def test_a_record_whose_stack_runs_code_when_freed_never_sees_a_half_compacted_list():
    """Records hold references (the op, the stack): when a superseded or passed record lets its
    stack go, that object's deallocation may run Python code that comes back into the
    sanitizer on the same thread. It must find every list whole (the records dropped are freed
    only after), so the nested check works and nothing is freed twice."""
    from ignis.safety.sanitizer import READ, WRITE, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    A, B, base = 0x10, 0x20, 4096
    nested = []

    class Stack:  # a stack object whose end calls back into the sanitizer
        def __del__(self):
            san.foreign_access(B, "aten::sum", None, [(base, 256, base + 128, base + 256, 0, 0, READ)])
            nested.append(len(san._live[base].recs))

    for _ in range(3):  # each write supersedes the last (same stream, same span): its stack goes
        san.foreign_access(A, "aten::fill_", Stack(), [(base, 256, base, base + 128, 0, 0, WRITE)])
    assert len(nested) == 2  # the first two stacks went while the next write was being checked
    san.on_stream_synchronize(A)
    san.on_stream_synchronize(B)  # the host passed every record: the next check drops them, the last stack too
    san.foreign_access(A, "aten::fill_", None, [(base, 256, base, base + 128, 0, 0, WRITE)])
    assert len(nested) == 3 and not san.reports
    recs = san._live[base].recs
    assert all(r.op in ("aten::fill_", "aten::sum") for r in recs)


def test_many_records_dropped_at_once_are_each_released_once():
    """A write that supersedes many records, and a synchronization that retires many, drop
    them in one compaction (past the few a compaction holds without allocating): each dropped
    record lets its stack go exactly once, and the records kept stay whole."""
    from ignis.safety.sanitizer import READ, WRITE, OUTPUT, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    A, B, base, n = 0x10, 0x20, 4096, 20
    gone = []

    class Stack:
        def __init__(self, tag):
            self.tag = tag

        def __del__(self):
            gone.append(self.tag)

    san.foreign_access(A, "aten::fill_", None, [(base, 16 * n, base, base + 16 * n, 0, 0, WRITE | OUTPUT)])
    for i in range(n):  # reads of disjoint spans on the writer's stream
        san.foreign_access(A, "aten::sum", Stack(("a", i)), [(base, 0, base + 16 * i, base + 16 * i + 16, 0, 0, READ)])
    assert len(san._live[base].recs) == n + 1 and not gone
    san.foreign_access(A, "aten::fill_", None, [(base, 0, base, base + 16 * n, 0, 0, WRITE)])  # over all of them
    assert sorted(gone) == [("a", i) for i in range(n)]
    assert [r.kind for r in san._live[base].recs] == ["write"]
    ev = 0xE1
    san.on_event_record(ev, A)
    san.on_stream_wait_event(B, ev)
    for i in range(n):  # reads on another stream, ordered after the write
        san.foreign_access(B, "aten::sum", Stack(("b", i)), [(base, 0, base + 16 * i, base + 16 * i + 16, 0, 0, READ)])
    assert len(san._live[base].recs) == n + 1
    san.on_stream_synchronize(B)  # the host passed them all: the next check retires them
    san.foreign_access(A, "aten::sum", None, [(base, 0, base, base + 16, 0, 0, READ)])
    assert sorted(gone) == sorted([("a", i) for i in range(n)] + [("b", i) for i in range(n)])
    assert not san.reports and [r.kind for r in san._live[base].recs] == ["read"]  # (the write too: B waited for it)


def test_extents_at_many_addresses_keep_their_lifetimes_and_generations():
    """The extents by address (a table that grows as addresses come): thousands of them, each
    found again with its generation; a free and a reuse move an address to its next
    generation; what was never seen has none. From Python the table reads as a mapping."""
    from ignis.safety.sanitizer import WRITE, OUTPUT, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    bases = [0x7F00_0000_0000 + 512 * k for k in range(3000)]
    for b in bases:
        san.extent_allocated(b, 0x10)
        san.foreign_access(0x10, "aten::fill_", None, [(b, 512, b, b + 512, 0, 0, WRITE | OUTPUT)])
    for b in bases[::2]:
        san.extent_freed(b)
    for b in bases[::4]:  # a quarter of the addresses reused
        san.extent_allocated(b, 0x10)
    live = san._live
    assert len(live) == len(bases) - len(bases[::2]) + len(bases[::4])
    assert sorted(live) == sorted(set(bases[1::2]) | set(bases[::4]))
    for k, b in enumerate(bases):
        assert live.gen_at(b) == (2 if k % 4 == 0 else 1)
        if k % 2:
            assert live[b].gen == 1 and live[b].end == b + 512 and b in live
        elif k % 4 == 0:
            assert live.get(b).gen == 2 and live[b].end is None  # its size comes with its first access
        else:
            assert b not in live and live.get(b) is None
    assert live.gen_at(12345) == 0 and live.get(12345, "none") == "none" and 12345 not in live
    assert "x" not in live and -1 not in live and (1 << 64) not in live
    with pytest.raises(KeyError):
        live[12345]
    assert not san.reports
    far = [(k << 40) + 0x40 for k in range(1, 600)]  # addresses that differ only in their high bits
    for b in far:
        san.extent_allocated(b, 0x10)
    assert all(live.gen_at(b) == 1 and live[b].gen == 1 for b in far)


def test_an_address_given_as_any_integer_is_the_same_address():
    """NumPy's integers and int subclasses name the same extent as the plain int does, through
    every entry point (the record_stream here is what keeps a free from racing)."""
    from ignis.safety.sanitizer import READ, WRITE, OUTPUT, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    A, B, base = 0x10, 0x20, np.int64(4096)
    san.extent_allocated(base, A)
    san.foreign_access(A, "aten::fill_", None, [(4096, 256, 4096, 4096 + 256, 0, 0, WRITE | OUTPUT)])
    san.on_event_record(0xE1, A)
    san.on_stream_wait_event(B, 0xE1)
    san.foreign_access(B, "aten::sum", None, [(4096, 256, 4096, 4096 + 256, 0, 0, READ)])
    san.extent_record_stream(base, B)  # the free waits for B now
    assert san.knows(base) and san.knows(4096) and base in san._live and san._live.gen_at(base) == 1
    san.extent_freed(np.uint64(4096))
    assert not san.reports and 4096 not in san._live


def test_an_allocation_at_no_address_is_refused_and_a_free_there_does_nothing():
    from ignis.safety.sanitizer import Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    for bad in (-4096, 1 << 63, None, 4096.0):
        with pytest.raises(ValueError, match="is not at an address: an address is an integer in \\[0, 2\\*\\*63\\)"):
            san.extent_allocated(bad, 0x10)
    san.extent_freed(1 << 64)
    san.extent_freed(-1)
    san.extent_freed(None)
    san.extent_record_stream(1 << 64, 0x20)
    san.extent_release(-1)
    san.extent_dropped(1 << 70)
    assert not san.knows(-5) and not san.knows(1 << 64)
    assert not san._live and not san.reports


def test_clocks_of_many_streams_order_a_chain_and_still_find_the_race():
    """Stream identities past the few a clock first holds: a chain of 40 streams, each
    waiting for the one before, orders the first stream's write before the last one's read;
    a stream outside the chain races it."""
    from ignis.safety.sanitizer import READ, WRITE, OUTPUT, Sanitizer
    san = Sanitizer()
    san.mode = "collect"
    streams = [0x1000 + 16 * k for k in range(40)]
    base = 4096
    san.foreign_access(streams[0], "aten::fill_", None, [(base, 256, base, base + 256, 0, 0, WRITE | OUTPUT)])
    own = [8192 * (k + 1) for k in range(len(streams))]  # each stream's own extent, written on it
    for k in range(1, len(streams)):
        san.foreign_access(streams[k - 1], "aten::fill_", None, [(own[k], 64, own[k], own[k] + 64, 0, 0,
                                                                   WRITE | OUTPUT)])
        san.on_event_record(0xE000 + k, streams[k - 1])
        san.on_stream_wait_event(streams[k], 0xE000 + k)
    san.foreign_access(streams[-1], "aten::sum", None,
                       [(base, 256, base, base + 256, 0, 0, READ)] + [(b, 64, b, b + 64, 0, 0, READ) for b in own[1:]])
    assert not san.reports
    assert not san._host.items()  # the host has waited for nothing yet
    san.foreign_access(0x9990, "aten::sum", None, [(base, 256, base, base + 64, 0, 0, READ)])
    assert len(san.reports) == 1 and "race" in str(san.reports[0])
    san.on_device_synchronize()
    assert len(san._host.items()) == len(streams) + 1  # every stream's work, waited for
    san.foreign_access(0x9990, "aten::fill_", None, [(base, 256, base, base + 256, 0, 0, WRITE)])
    assert len(san.reports) == 1
