"""NvArray, MemoryContract and GpuRef (layers 3 and 4) on the active backend."""

from __future__ import annotations

import gc
import time
import threading

import ml_dtypes
import numpy as np
import pytest

import ignis as ig
from ignis import dtypes as D


ALL_DTYPES = [D.bool_, D.uint8, D.int8, D.int16, D.uint16, D.float16, D.bfloat16, D.int32, D.uint32,
              D.float32, D.float64, D.int64, D.uint64, D.float8_e4m3fn, D.float8_e5m2, D.complex64]


def sample(dt: ig.DType, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    if dt is D.bool_:
        raw = raw & 1
    return raw.view(dt.numpy)


# -- construction and attributes -----------------------------------------------------

def test_attributes(dev):
    a = ig.empty((2, 3, 4), "float16")
    assert a.shape == (2, 3, 4) and a.dtype is D.float16 and a.ndim == 3
    assert a.numel == 24 and a.nbytes == 48 and a.device_id == 0 and a.owner == "compute"
    assert a.ref_count == 0 and not a.freed and not a.is_view and a.base is None
    assert a.device_ptr % 256 == 0 and a.created_at > 0 and isinstance(a.id, int)
    assert a.stream is dev.default_stream and a.generation is not None
    b = ig.empty(4)
    assert b.id != a.id
    assert a.size == 24 and a.itemsize == 2 and a.strides == (24, 8, 2)
    c = ig.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert repr(c) == (f"ignis.NvArray#{c.id}([[0, 1, 2],\n{' ' * (len(str(c.id)) + 15)} [3, 4, 5]], "
                       "shape=(2, 3), dtype=int32, device=0, stream=#%d)" % c.stream.id)
    c.free()
    assert repr(c).startswith(f"<ignis.NvArray#{c.id}(shape=(2, 3), dtype=int32") and "it was freed" in repr(c)


@pytest.mark.parametrize("shape", [(-1,), (2, -3), "abc", (1.5,), [None]])
def test_bad_shapes_are_clear(shape):
    with pytest.raises(ValueError, match="shape|dimension"):
        ig.empty(shape)


@pytest.mark.parametrize("shape,dtype", [
    ((0, 2**63), "float32"), ((2**63, 0), "uint8"), ((0, 2**64 + 5), "int8"),
    ((0, 2**62, 4), "float32"),       # each dimension fits int64, the first stride does not
    ((0, 2**61), "float32"),          # 2**63 bytes: one past the extent every format can describe
    ((1,) * 64 + (0,), "float32"),    # more dimensions than NumPy (and a safetensors reader) takes
    (2**63, "uint8"),
])
def test_shapes_the_export_formats_cannot_describe_are_refused(shape, dtype):
    """A zero dimension used to let any other through: DLPack export then wrapped the shape and
    the safetensors reader refused the file the saver wrote. Every dimension must fit the
    formats arrays are exported to, also where the array holds no bytes."""
    with pytest.raises(ValueError, match="cannot be an array"):
        ig.empty(shape, dtype)
    a = ig.empty((0,), dtype)
    with pytest.raises(ValueError, match="cannot be an array"):
        a.reshape(*shape) if isinstance(shape, tuple) else a.reshape(shape, 0)


def test_the_largest_accepted_empty_shape_round_trips(tmp_path):
    """At the limit: every dimension and stride fits int64, DLPack consumers and the loader agree."""
    from ignis._types import MAX_EXTENT, MAX_NDIM
    shape = (0, MAX_EXTENT // 4)
    a = ig.empty(shape, "float32")
    if a.device.backend.host_memory:  # the emulator exports CPU tensors, which NumPy imports
        assert np.from_dlpack(a).shape == shape
    assert ig.empty((0,), "float32").reshape(*shape).shape == shape
    many = ig.empty((1,) * (MAX_NDIM - 1) + (0,), "float32")
    path = tmp_path / "edge.safetensors"
    ig.io.save_safetensors({"a": a, "many": many}, path)
    back = ig.io.load_safetensors(path)
    assert back["a"].shape == shape and back["many"].shape == many.shape


def test_bad_dtype_lists_valid_names():
    with pytest.raises(ValueError) as ei:
        ig.empty(3, "float128")
    assert "float32" in str(ei.value) and "bfloat16" in str(ei.value)


def test_bad_owner_lists_valid_owners():
    with pytest.raises(ValueError) as ei:
        ig.empty(3, owner="nobody")
    assert "compute" in str(ei.value) and "collective" in str(ei.value)


def test_dtype_table():
    assert D.dtype("F8_E4M3") is D.float8_e4m3fn
    assert D.dtype(np.float32) is D.float32 and D.dtype(ml_dtypes.bfloat16) is D.bfloat16
    assert D.bfloat16.dlpack == (4, 16, 1) and D.float16.safetensors == "F16"
    assert D.from_dlpack(2, 32) is D.float32
    with pytest.raises(ValueError):
        D.from_safetensors("F4")


def test_empty_and_zero_d_arrays():
    e = ig.zeros((0, 5))
    assert e.nbytes == 0 and e.to_numpy().shape == (0, 5)
    s = ig.full((), 2.5, "float64")
    assert s.shape == () and s.numel == 1 and s.to_numpy() == 2.5
    e.free()
    s.free()


# -- host copies ------------------------------------------------------------------

@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_round_trip_every_dtype(dt):
    host = sample(dt, 1000).reshape(10, 100)
    a = ig.from_numpy(host)
    assert a.dtype is dt and a.shape == (10, 100)
    back = a.to_numpy()
    assert back.dtype == dt.numpy and back.tobytes() == host.tobytes()
    raw = ig.empty((10, 100), dt).from_host_raw(host.tobytes())
    assert raw.to_numpy().tobytes() == host.tobytes()


def test_from_host_raw_is_exact_for_bfloat16():
    vals = np.array([1.0, -2.5, 3.140625, 65280.0], dtype=ml_dtypes.bfloat16)
    a = ig.empty(4, "bfloat16").from_host_raw(vals.tobytes())
    assert a.to_numpy().tobytes() == vals.tobytes()
    with pytest.raises(ValueError, match="expected 8 bytes.*got 6 bytes"):
        a.from_host_raw(b"x" * 6)


def test_from_host_checks_element_count():
    a = ig.empty(4, "int32").from_host([1, 2, 3, 4])
    assert a.tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"expected 4 elements for shape \(4,\), got 3"):
        a.from_host([1, 2, 3])


def test_large_copies_go_through_pinned_staging():
    host = np.random.default_rng(2).random((3 << 20) // 8 * 3)  # ~9 MiB: chunked staging
    a = ig.from_numpy(host)
    back = a.to_numpy()
    np.testing.assert_array_equal(back, host)
    assert not back.flags.owndata  # lives in a pinned buffer from the pool
    a.free()


def test_asarray(dev):
    a = ig.asarray([[1, 2], [3, 4]], dtype="int64")
    assert a.shape == (2, 2) and a.to_numpy().tolist() == [[1, 2], [3, 4]]
    assert ig.asarray(a) is a


# -- device-side operations ----------------------------------------------------------

def test_zero_fill_clone_copy():
    a = ig.full((1000,), 1.25, "float32")
    assert (a.to_numpy() == 1.25).all()
    a.zero_()
    assert (a.to_numpy() == 0).all()
    a.fill_(7)
    c = a.clone()
    assert c.device_ptr != a.device_ptr and c.owner == a.owner and c.to_numpy().tobytes() == a.to_numpy().tobytes()
    a.fill_(-3)
    assert (c.to_numpy() == 7).all()  # independent
    c.copy_(a)
    assert (c.to_numpy() == -3).all()
    with pytest.raises(ValueError, match="same shape and dtype"):
        c.copy_(ig.empty(10))


@pytest.mark.parametrize("dt,val", [(D.int64, -123456789), (D.bfloat16, 1.5), (D.float16, -0.25), (D.uint8, 200),
                                    (D.complex64, 1 + 2j), (D.bool_, True)])
def test_fill_every_pattern(dt, val):
    a = ig.full((777,), val, dt)
    assert (a.to_numpy() == np.array(val, dt.numpy)).all()


def test_clone_is_exact_bytes():
    host = sample(D.bfloat16, 4096)
    a = ig.from_numpy(host)
    assert a.clone().to_numpy().tobytes() == host.tobytes()


def test_write_rows_kv_cache():
    cache = ig.zeros((8, 4), "float32")
    rows = ig.from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
    cache.write_rows(rows, 3)
    out = cache.to_numpy()
    assert (out[3:5] == np.arange(8).reshape(2, 4)).all() and (out[:3] == 0).all() and (out[5:] == 0).all()
    with pytest.raises(ValueError, match=r"overflow: writing 32 bytes at row 7 \(offset 112\) exceeds the 128-byte"):
        cache.write_rows(rows, 7)
    with pytest.raises(ValueError, match=r"source of shape \(3,\) is not rows of shape \(4,\)"):
        cache.write_rows(ig.empty(3, "float32"), 0)
    cache.write_rows(ig.full(4, 9.0), 0)  # one row of the row shape
    assert (cache.to_numpy()[0] == 9).all()


# -- views ----------------------------------------------------------------------------

def test_slice_is_zero_copy_and_keeps_parent_alive():
    host = np.arange(24, dtype=np.int32).reshape(4, 6)
    a = ig.from_numpy(host)
    v = a.slice(0, 1, 2)
    assert v.is_view and v.base is a and v.shape == (2, 6)
    assert v.device_ptr == a.device_ptr + 6 * 4
    assert (v.to_numpy() == host[1:3]).all()
    v.fill_(-1)
    assert (a.to_numpy()[1:3] == -1).all()
    pid = a.id
    del a
    gc.collect()
    assert v.base.id == pid and (v.to_numpy() == -1).all()  # parent still alive


def test_strided_slice_is_refused_with_advice():
    a = ig.empty((4, 6))
    with pytest.raises(ValueError, match="strided.*copy"):
        a.slice(1, 2, 2)
    assert a.slice(1, 0, 6).shape == (4, 6)  # whole dimension is contiguous
    assert ig.empty((1, 6)).slice(1, 2, 2).shape == (1, 2)


def test_getitem_and_reshape():
    host = np.arange(12, dtype=np.int16).reshape(3, 4)
    a = ig.from_numpy(host)
    assert (a[1].to_numpy() == host[1]).all() and a[-1].shape == (4,)
    assert (a[1:3].to_numpy() == host[1:3]).all()
    assert (a.reshape(4, 3).to_numpy() == host.reshape(4, 3)).all()
    assert a.reshape(-1).shape == (12,)
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, 3)
    with pytest.raises(ValueError, match="contiguous"):
        a[::2]
    with pytest.raises(IndexError):
        a[3]


def test_parent_with_live_views_refuses_free():
    a = ig.empty((4, 4))
    v = a[0:2]
    with pytest.raises(ig.MemoryContractViolation, match="view"):
        a.free()
    v.free()  # a view never frees memory
    assert not a.freed
    a.free()
    with pytest.raises(ig.UseAfterFreeError):
        v.to_numpy()


# -- free, refs, ownership ----------------------------------------------------------------

def test_free_rules():
    a = ig.empty(16)
    a.incref()
    with pytest.raises(ig.MemoryContractViolation, match="ref_count=1"):
        a.free()
    assert a.decref() == 0
    with pytest.raises(ig.MemoryContractViolation, match="already 0"):
        a.decref()
    gen = a.generation
    a.free()
    assert a.freed
    with pytest.raises(ig.DoubleFreeError) as ei:
        a.free()
    assert ei.value.array_id == a.id and ei.value.generation == gen
    for op in (a.to_numpy, a.zero_, a.clone, lambda: a.device_ptr, a.ref, a.incref):
        with pytest.raises(ig.UseAfterFreeError) as ei:
            op()
        assert ei.value.array_id == a.id and ei.value.generation == gen


def test_garbage_collected_arrays_return_memory():
    mr = ig.PoolResource(ig.DirectResource(0))
    before = mr.bytes_outstanding
    for _ in range(50):
        ig.empty((1024,), mr=mr)
    gc.collect()
    assert mr.bytes_outstanding == before
    x = ig.empty(256, mr=mr)
    x.free()
    del x  # the explicit free cancelled the collection-time free: no double free
    gc.collect()
    assert mr.bytes_outstanding == before


def test_transfer_ownership():
    a = ig.empty(4)
    assert a.transfer_ownership("io") == "io" and a.owner == "io"
    a.incref(), a.incref()
    with pytest.raises(ig.MemoryContractViolation, match="ref_count=2"):
        a.transfer_ownership("compute")
    a.decref(), a.decref()
    with pytest.raises(ig.MemoryContractViolation, match="owned by 'io'"):
        a.free()
    a.free(by="io")


def test_contract_acquire_release():
    c = ig.MemoryContract()
    a = ig.empty(8)
    assert c.acquire(a, by="io")
    c.assert_owner(a, "io")
    with pytest.raises(ig.MemoryContractViolation, match="double acquire") as ei:
        c.acquire(a, by="io")
    assert (ei.value.array_id, ei.value.owner, ei.value.caller) == (a.id, "io", "io")
    with pytest.raises(ig.MemoryContractViolation, match="held by 'io'"):
        c.acquire(a, by="collective")
    with pytest.raises(ig.MemoryContractViolation, match="not 'collective'"):
        c.release(a, by="collective")
    with pytest.raises(ValueError, match="unknown owner"):
        c.acquire(a, by="gpu-thing")
    assert c.release(a, by="io") and a.owner == "compute"
    with pytest.raises(ig.MemoryContractViolation):
        c.assert_owner(a, "io")
    a.incref(), a.incref()
    with pytest.raises(ig.MemoryContractViolation, match="shared"):
        c.acquire(a, by="io")


def test_contract_holding_always_releases():
    a = ig.empty(8)
    with pytest.raises(RuntimeError):
        with ig.contract.holding(a, by="collective"):
            assert a.owner == "collective"
            raise RuntimeError("boom")
    assert a.owner == "compute"


def test_contract_audit_and_tracking(monkeypatch):
    c = ig.MemoryContract()
    a = ig.empty((3, 3), "int8")
    c.track(a)
    assert c.tracked_count == 1
    assert c.audit(older_than=3600) == []
    rows = c.audit(older_than=0.0)
    assert rows[0]["id"] == rows[0]["array_id"] == a.id and rows[0]["owner"] == "compute" and rows[0]["shape"] == (3, 3)
    assert rows[0]["dtype"] == "int8" and rows[0]["freed"] is False and rows[0]["age_ms"] >= 0
    c.untrack(a)
    assert c.tracked_count == 0
    c.track(a)
    del a
    gc.collect()
    assert c.tracked_count == 0  # tracking is weak: it never keeps memory alive
    ig.register_owner("my-layer")
    b = ig.empty(2)
    c.acquire(b, by="my-layer")
    c.reset()
    assert c.tracked_count == 0


def test_contract_track_keeps_the_start_and_refuses_what_is_no_array():
    c = ig.MemoryContract()
    a = ig.empty(4)
    c.track(a)
    first = c.audit(older_than=0.0)[0]["age_ms"]
    time.sleep(0.01)
    c.track(a)  # tracked already: it keeps its start
    assert c.tracked_count == 1 and c.audit(older_than=0.0)[0]["age_ms"] >= first + 5

    class Impostor:  # an object that carries a tracked array's id is not that array
        id = a.id
    with pytest.raises(TypeError, match="takes an NvArray"):
        c.track(Impostor())
    with pytest.raises(TypeError, match="takes an NvArray"):
        c.track(42)


def test_a_tracked_arrays_site_is_the_programs_line():
    c = ig.MemoryContract()
    c.capture_sites = True
    a, b = ig.empty(4), ig.empty(2)
    c.track(a)  # TRACK-SITE
    c.acquire(b, by="io")  # ACQUIRE-SITE
    src = open(__file__).read().splitlines()

    def line_of(marker: str) -> int:
        return next(i for i, ln in enumerate(src, 1) if ln.rstrip().endswith(marker))

    innermost = []
    for row in c.audit(older_than=0.0):
        files = [ln for ln in row["site"].splitlines() if ln.lstrip().startswith("File ")]
        assert files[-1].startswith(f'  File "{__file__}"'), row["site"]
        innermost.append(int(files[-1].split(", line ")[1].split(",")[0]))
    assert sorted(innermost) == [line_of("# TRACK-SITE"), line_of("# ACQUIRE-SITE")]
    c.release(b, "io")


def test_a_block_held_after_a_contract_reset_is_tracked_again():
    a = ig.empty(4)
    with a.access(by="collective"):
        pass
    ig.contract.reset()  # forgets every tracked array
    with a.access(by="collective"):
        assert [r["array_id"] for r in ig.contract.audit(older_than=0.0)].count(a.id) == 1


def test_contract_threads():
    c = ig.MemoryContract()
    arrays = [ig.empty(4) for _ in range(16)]
    errors = []

    def work(i):
        try:
            for _ in range(200):
                a = arrays[(i * 7) % 16]
                try:
                    c.acquire(a, by="io")
                except ig.MemoryContractViolation:
                    continue
                c.release(a, by="io")
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors and all(a.owner == "compute" for a in arrays)


def test_ref_counts_threads():
    a = ig.empty(4)

    def work():
        for _ in range(500):
            a.incref()
            a.decref()

    ts = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert a.ref_count == 0


# -- GpuRef ---------------------------------------------------------------------------------

def test_gpuref():
    a = ig.full(4, 1.0)
    r = a.ref()
    assert r.access() is a and r.generation == a.device.generation and r.device_id == 0
    assert r.raw_device_ptr() == a.device_ptr and len(r) == 4
    s = a.device.create_stream()
    r.record_write(s)
    assert r.last_write_stream is s
    import pickle
    with pytest.raises(TypeError, match="process-local"):
        pickle.dumps(r)
    a.free()
    with pytest.raises(ig.UseAfterFreeError):
        r.access()
    s.close()


def test_gpuref_stale_after_rebuild_and_shutdown():
    d = ig.Device(ig.device_count() - 1)
    a = ig.empty(4, device=d)
    r = a.ref()
    d.rebuild()
    with pytest.raises(ig.StaleHandleError, match="context rebuilt") as ei:
        r.access()
    assert ei.value.reason == "context rebuilt"
    b = ig.empty(4, device=d)  # the default resource is remade for the new context
    r2 = b.ref()
    d.state.begin_shutdown()
    try:
        with pytest.raises(ig.StaleHandleError, match="shutting down"):
            r2.access()
    finally:
        d.state.accepting_ops = True


@pytest.mark.parametrize("which", ["device 0 (cached defaults)", "last device"])
def test_factories_on_a_shut_down_device_raise_at_once(which):
    """An array made after Device.shutdown() used to be returned, and every use of it then gave
    rebuild advice that rebuild() does not honour. The factory refuses, saying why."""
    d = ig.Device(0) if which.startswith("device 0") else ig.Device(ig.device_count() - 1)
    kw = {} if d.ordinal == 0 else {"device": d}
    ig.zeros(4, **kw)  # the defaults are cached while the device works
    d.shutdown()
    try:
        makers = [lambda: ig.zeros(4, **kw), lambda: ig.empty(0, **kw), lambda: ig.full((2, 2), 1.0, **kw),
                  lambda: ig.from_numpy(np.ones(3), **kw), lambda: ig.NvArray(8, **kw)]
        if d.ordinal == 0 and d.backend.host_memory:  # adopts on the current device (device 0)
            makers.append(lambda: ig.from_dlpack(np.ones(3, np.float32)))
        for make in makers:
            with pytest.raises(ig.StaleHandleError, match="shutting down") as ei:
                make()
            assert ei.value.reason == "device shutting down"
            assert "Device.shutdown()" in str(ei.value) and "rebuil" not in str(ei.value), str(ei.value)
    finally:
        d.state.accepting_ops = True  # restore for other tests


def test_gpuref_keeps_memory_alive():
    r = ig.full(8, 3.0).ref()
    gc.collect()
    assert (r.access().to_numpy() == 3.0).all()


# -- tracked use across streams -------------------------------------------------------------

def test_cross_stream_use_is_ordered_automatically(dev):
    a_s, b_s = dev.create_stream(), dev.create_stream()
    x = ig.empty(1 << 16, "uint8", stream=a_s)
    a_s.launch_host_func(lambda: __import__("time").sleep(0.2))
    x.fill_(9)  # queued on a_s behind the sleep
    y = x.clone(stream=b_s)  # must wait for the fill
    assert (y.to_numpy(stream=b_s) == 9).all()
    a_s.synchronize()
    a_s.close(), b_s.close()


def test_use_context_manager(dev):
    x = ig.zeros(16, "uint8")
    with x.use(access="write") as ptr:
        assert ptr == x.device_ptr
        dev.backend.memset_d8_async(ptr, 5, 16, x.stream.handle)
    assert (x.to_numpy() == 5).all()
    with pytest.raises(ValueError):
        with x.use(access="sideways"):
            pass


def test_untracked_resource_only_on_own_stream(dev):
    direct = ig.DirectResource(dev)
    s2 = dev.create_stream()
    x = ig.zeros(16, mr=direct)
    with pytest.raises(ig.StreamMisuseError, match="own stream"):
        x.clone(stream=s2)
    x.free()
    s2.close()


def test_pin_unpin():
    a = ig.empty(1000, "uint8")
    a.pin()
    assert a.pinned_host.nbytes == 1000
    with pytest.raises(RuntimeError, match="already pinned"):
        a.pin()
    a.unpin()
    with pytest.raises(RuntimeError, match="no pinned"):
        a.unpin()
    a.pin()
    a.free()  # releases the pinned buffer too


# -- DLPack ----------------------------------------------------------------------------------------

def test_dlpack_round_trip_zero_copy():
    a = ig.from_numpy(np.arange(10, dtype=np.float32))
    if ig.backend_name() == "emulated":
        n = np.from_dlpack(a)
        assert n.flags.writeable and (n == np.arange(10)).all()
        n[0] = 42  # the same bytes
        assert a.to_numpy()[0] == 42
        b = ig.from_dlpack(n)
        assert b.device_ptr == a.device_ptr
        h = np.arange(6, dtype=np.int64)
        c = ig.from_dlpack(h)
        h[2] = -1
        assert c.to_numpy()[2] == -1 and not c.owns_memory
        c.free()
    else:
        assert a.__dlpack_device__() == (2, 0)
        assert a.__cuda_array_interface__["data"][0] == a.device_ptr


def test_arrays_in_reference_cycles_are_freed_safely():
    mr = ig.PoolResource(ig.DirectResource(0))
    before = mr.bytes_outstanding
    for _ in range(20):
        a = ig.empty(1024, mr=mr)
        holder = {"a": a}
        holder["self"] = holder  # a cycle: only the cyclic collector frees it
        del a, holder
    gc.collect()  # finalizers run inside the collector: memory is handed back afterwards
    ig.empty(1, mr=mr).free()  # any array operation returns it
    assert mr.bytes_outstanding == before


# -- the conventions NumPy, PyTorch and CuPy users bring (issue 17, items 3 and 4) ------------

def test_dtypes_compare_like_numpy_dtypes():
    a = ig.zeros(3)
    assert a.dtype == np.float32 and a.dtype == "float32" and a.dtype == np.dtype("f4") and a.dtype == "f4"
    assert a.dtype != np.float64 and a.dtype != "int32" and a.dtype != "no such type" and a.dtype != 3
    assert np.dtype(a.dtype) == np.float32 and ig.float32 is D.float32 and ig.bfloat16 is D.bfloat16
    assert {ig.float32: "x"}[ig.dtype("f4")] == "x"
    assert ig.empty(2, "f8").dtype is ig.float64 and ig.empty(2, "<i4").dtype is ig.int32
    assert ig.empty(2, None).dtype is ig.float32 and ig.dtype(None) is ig.float32
    with pytest.raises(ValueError, match="valid dtypes are"):
        ig.empty(2, "f3")


def test_array_basics():
    a = ig.ones((2, 3), "int16")
    assert a.tolist() == [[1] * 3] * 2 and a.size == 6 and a.itemsize == 2 and a.strides == (6, 2)
    for like, want in ((ig.zeros_like(a), 0), (ig.ones_like(a), 1), (ig.full_like(a, 7), 7)):
        assert like.shape == a.shape and like.dtype is a.dtype and like.stream is a.stream
        assert (like.to_numpy() == want).all()
    assert ig.empty_like(a, "float32").dtype is ig.float32
    with pytest.raises(TypeError, match="NvArray to take the shape of"):
        ig.zeros_like(np.zeros(3))
    ig.synchronize()


def test_indexing_makes_views_where_contiguous_and_says_what_to_do_otherwise():
    h = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = ig.from_numpy(h)
    for k in (1, (1, 2), (1, 2, 3), (0, slice(1, 3)), (slice(0, 1),), (1, Ellipsis), (Ellipsis,), -1,
              (1, -1, slice(1, 3)), (slice(1, 2), slice(None), slice(None))):
        v = a[k]
        assert v.is_view and v.shape == h[k].shape and (v.to_numpy() == h[k]).all(), k
    with pytest.raises(ValueError, match=r"strided.*a\[i\]\[2:5\]"):
        a[0:2, 1]
    with pytest.raises(ValueError, match="step 1"):
        a[::2]
    with pytest.raises(TypeError, match="fancy or boolean indexing"):
        a[[0, 1]]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 0, 0, 0]
    with pytest.raises(IndexError, match="out of range"):
        a[1, 3]


def copy_between_devices_checks(direct: bool | None = None) -> None:
    """``dst.copy_(src)`` from device 0 to device 1 (peer to peer, or staged through the host where
    the devices cannot reach each other; ``direct`` says which to expect, None: either). The copy
    waits for the source's pending write and for a pending read of the destination; a write of the
    source queued right after it waits until the copy has read it. Every stream involved is held
    back for a while, so a missing wait shows as wrong bytes."""
    from helpers import sleep_on
    d0, d1 = ig.Device(0), ig.Device(1)
    if direct is not None:
        assert d1.can_access_peer(d0) is direct
    n = 1 << 16
    src = ig.from_numpy(np.arange(n, dtype=np.float32))
    dst = ig.zeros(n, device=1)
    reader = d1.create_stream()
    try:
        sleep_on(reader, 0.2)
        before = dst.clone(stream=reader)  # a read of the destination, still queued when the copy is
        sleep_on(src.stream, 0.2)
        src.fill_(5.0)                     # a write of the source, still queued when the copy is
        sleep_on(dst.stream, 0.2)          # the copy itself runs late
        assert dst.copy_(src) is dst
        src.fill_(7.0)                     # queued on the source's side right after the copy
        assert (before.to_numpy(stream=reader) == 0).all()
        assert (dst.to_numpy() == 5.0).all()
        assert (src.to_numpy() == 7.0).all()
        empty = ig.zeros(0, device=1)
        empty.copy_(ig.zeros(0))
        with pytest.raises(ValueError, match="same shape and dtype"):
            dst.copy_(ig.zeros(8))
        before.free()
    finally:
        reader.synchronize()
        reader.close()
    src.free()
    dst.free()


def test_copy_between_devices_is_ordered_both_ways():
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    copy_between_devices_checks()


def test_copy_between_devices_without_peer_access_is_staged_through_the_host(tmp_path):
    if ig.get_backend().name != "emulated":
        pytest.skip("a machine's GPUs have the peer access they have; the emulator can be made without it")
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers import IMPORT_ROOT
    here = str(Path(__file__).resolve().parent)
    code = ("import test_array; test_array.copy_between_devices_checks(direct=False); "
            "import ignis as ig; print('staged', ig.Device(1).can_access_peer(0))")
    env = dict(os.environ, IGNIS_BACKEND="emulated", IGNIS_EMULATED_DEVICES="2", IGNIS_EMULATED_PEER_ACCESS="0",
               IGNIS_EMU_JITTER="11:300",
               PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, here, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "staged False" in out.stdout


def test_kernel_scalar_declared_none_is_an_error():
    with pytest.raises(ValueError, match="argument 1 is declared None"):
        ig.Kernel(name="k", access=("write", None), host_impl=lambda *a: None)


# -- what an NvArray is: a memory container (no math), with natural edges ---------------------

def test_equality_and_truth_raise_and_say_what_to_do():
    a, b = ig.zeros(12), ig.zeros(12)
    for op in (lambda: a == b, lambda: a != b, lambda: a == a, lambda: a == 0):
        with pytest.raises(TypeError, match=r"not compared with (==|!=).*a is b.*to_numpy.*from_dlpack"):
            op()
    for one in (a, ig.zeros(1), ig.zeros(0)):
        with pytest.raises(TypeError, match=r"truth value of NvArray#\d+ .* is not defined.*a is not None.*item\(\)"):
            bool(one)
    with pytest.raises(TypeError):
        if a:
            pass
    # identity still hashes: arrays stay usable as dict keys and set members
    assert {a: 1, b: 2}[a] == 1 and len({a, b, a}) == 2 and hash(a) == hash(a)
    assert [x for x in (a, b) if x is b] == [b]


def test_setitem_writes_a_region_from_a_scalar_a_host_array_or_an_array():
    a = ig.zeros((3, 4), "int32")
    a[0] = 5
    a[1:3] = [1, 2, 3, 4]                      # broadcast over the rows
    a[2, 1:3] = np.array([7, 8])
    a[-1, 3] = 9.0                             # converted to the dtype
    src = ig.from_numpy(np.array([40, 41], np.int32))
    a[0, 2:4] = src                            # device to device
    expected = np.array([[5, 5, 40, 41], [1, 2, 3, 4], [1, 7, 8, 9]], np.int32)
    assert (a.to_numpy() == expected).all()
    a[...] = 0
    assert not a.to_numpy().any()


@pytest.mark.parametrize("key, error, message", [
    ((slice(None), 1), ValueError, r"NvArray#\d+\[:, 1\] = \.\.\.: only a contiguous region is written in place"),
    (slice(0, 3, 2), ValueError, "only a contiguous region"),
    ([0, 1], TypeError, "only a contiguous region"),
    (7, IndexError, "out of range"),
])
def test_setitem_refuses_what_it_cannot_write_and_writes_nothing(key, error, message):
    a = ig.zeros((3, 4))
    with pytest.raises(error, match=message):
        a[key] = 1.0
    assert not a.to_numpy().any()


def test_setitem_refuses_a_value_that_does_not_fit():
    a = ig.zeros((3, 4))
    with pytest.raises(ValueError, match=r"a value of shape \(5,\) does not fit the region of shape \(4,\)"):
        a[0] = np.ones(5)
    with pytest.raises(ValueError, match=r"the region is \(4,\) float32, the value \(3,\) float32"):
        a[0] = ig.zeros(3)
    assert not a.to_numpy().any()


def test_setitem_is_a_tracked_write(dev, streams, san, manual):
    s0, s1, _ = streams
    x = ig.zeros(256, stream=s0)
    y = ig.empty(256, stream=s1)
    dev.synchronize()
    ig.kernels.copy(y, x, stream=s1)           # s1 reads x
    with pytest.raises(ig.RaceError, match="write-after-read race"):
        x[0:8] = 1.0                            # on s0, with no wait for s1's read


def test_setitem_on_a_freed_array_is_refused():
    a = ig.zeros(4)
    a.free()
    with pytest.raises(ig.UseAfterFreeError):
        a[0] = 1.0


def test_item_reads_one_element():
    assert ig.full((1, 1), 2.5).item() == 2.5 and isinstance(ig.full(1, 2.5).item(), float)
    assert ig.full(1, 7, "int64").item() == 7 and isinstance(ig.full(1, 7, "int64").item(), int)
    assert ig.full(1, 1.5, "bfloat16").item() == 1.5
    a = ig.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert a[1, 2].item() == 5.0
    with pytest.raises(ValueError, match=r"item\(\) reads a one-element array; NvArray#\d+ has 6 elements"):
        a.item()


def test_item_is_a_tracked_read(dev, streams, san, manual):
    s0, s1, _ = streams
    x = ig.empty(4, stream=s0)
    dev.synchronize()
    ig.kernels.fill(x, 1.0, stream=s1)
    with pytest.raises(ig.RaceError, match="read-after-write race"):
        x[0].item()                             # on s0, not ordered after s1's write


def test_copy_is_a_new_array_with_the_same_contents():
    a = ig.from_numpy(np.arange(5, dtype=np.int16))
    b = a.copy()
    assert b is not a and b.device_ptr != a.device_ptr and b.shape == a.shape and b.dtype is a.dtype
    a[0] = 100
    assert b.to_numpy().tolist() == [0, 1, 2, 3, 4]


def test_kernels_copy_says_a_shape_mismatch_is_one():
    dst, src = ig.zeros(3), ig.full(4, 1.0)
    with pytest.raises(ValueError, match=r"shapes do not match: dst \(3,\) has 3 element\(s\), src \(4,\) has 4"):
        ig.kernels.copy(dst, src)
    with pytest.raises(ValueError, match=r"n=4 must be between 0 and the smaller array's size"):
        ig.kernels.copy(dst, src, 4)
    assert not dst.to_numpy().any()
    ig.kernels.copy(dst, src, 3)                      # the first three: fine
    ig.kernels.copy(ig.zeros((2, 2)), src)            # as many elements, another shape: a flat copy
    assert dst.to_numpy().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16", "uint8"])
def test_builtin_kernels_are_named_by_their_dtype(dtype):
    assert ig.kernels.kernel("fill", dtype).name == f"ignis_fill_{dtype}"
    assert ig.kernels.kernel("copy", ig.dtype(dtype)).name == f"ignis_copy_{dtype}"
    assert ig.kernels.kernel("fill", ig.dtype(dtype).itemsize).name.startswith("ignis_fill_uint")  # by size: bits
    with ig.sanitizer.enabled("collect") as san, ig.ordering("manual"):
        d = ig.Device(0)
        a, b = d.create_stream(), d.create_stream()
        x, y = ig.empty(16, dtype, stream=a), ig.empty(16, dtype, stream=b)
        d.synchronize()
        ig.kernels.fill(x, 1, stream=a)
        ig.kernels.copy(y, x, stream=b)
        d.synchronize()
        [e] = san.clear()
        assert e.first["op"] == f"ignis_fill_{dtype}" and e.second["op"] == f"ignis_copy_{dtype}"
        a.close()
        b.close()


def test_a_stream_of_another_device_is_refused_before_the_driver_sees_it():
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    a = ig.zeros(3)
    other = ig.Device(1).create_stream()
    try:
        for use in (lambda: a.to_numpy(stream=other), lambda: a.fill_(1.0, stream=other),
                    lambda: a.from_host([1, 2, 3], stream=other), lambda: a.access(other, "read").__enter__()):
            with pytest.raises(ValueError, match=r"memory of device 0 .* cannot be used on .* a stream of device 1: "
                                                 r"use a stream of device 0"):
                use()
        assert a.to_numpy().tolist() == [0.0, 0.0, 0.0]   # nothing written, nothing left half-done
    finally:
        other.close()


def test_a_shape_too_large_for_any_memory_says_so():
    with pytest.raises(ValueError, match=r"cannot be an array: it is too large: .* \(8 EiB\)"):
        ig.empty((1 << 62, 1 << 62))
