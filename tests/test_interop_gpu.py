"""Zero-copy interop with PyTorch and CuPy on a real GPU (skipped elsewhere)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ignis as ig

pytestmark = pytest.mark.gpu


def test_torch_round_trip_zero_copy():
    torch = pytest.importorskip("torch")
    a = ig.from_numpy(np.arange(16, dtype=np.float32))
    t = torch.from_dlpack(a)
    assert t.data_ptr() == a.device_ptr and t.is_cuda
    t.mul_(2)  # torch writes, Ignis reads the same bytes
    torch.cuda.synchronize()
    assert (a.to_numpy() == 2 * np.arange(16)).all()
    src = torch.arange(8, dtype=torch.int64, device="cuda")
    b = ig.from_dlpack(src)
    assert b.device_ptr == src.data_ptr() and not b.owns_memory
    b.fill_(7)
    b.stream.synchronize()
    assert src.tolist() == [7] * 8
    bf = torch.ones(4, dtype=torch.bfloat16, device="cuda")
    assert ig.from_dlpack(bf).dtype is ig.dtypes.bfloat16


def test_torch_stream_handshake():
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    a = ig.empty(1 << 20, "float32")
    a.stream.launch_host_func(lambda: __import__("time").sleep(0.1))
    a.fill_(3.0)  # queued behind the sleep on Ignis's stream
    with torch.cuda.stream(s):
        t = torch.from_dlpack(a)  # the producer makes s wait for the fill
        total = t.sum()
    s.synchronize()
    assert total.item() == 3.0 * (1 << 20)


def test_cupy_round_trip_and_cai():
    cupy = pytest.importorskip("cupy")
    a = ig.from_numpy(np.arange(10, dtype=np.float64))
    c = cupy.from_dlpack(a)
    assert c.data.ptr == a.device_ptr
    c += 1
    cupy.cuda.get_current_stream().synchronize()
    assert (a.to_numpy() == np.arange(10) + 1).all()
    cai = a.__cuda_array_interface__
    assert cai["data"][0] == a.device_ptr and cai["version"] == 3
    d = cupy.asarray(a)  # through __cuda_array_interface__
    assert d.data.ptr == a.device_ptr
    x = cupy.arange(5, dtype=cupy.int32)
    b = ig.from_dlpack(x)
    assert b.device_ptr == x.data.ptr and b.tolist() == [0, 1, 2, 3, 4]


def test_cupy_allocator_plugin():
    cupy = pytest.importorskip("cupy")
    mr = ig.StatisticsResource(ig.PoolResource(ig.AsyncResource(0)))
    prev = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(ig.interop.cupy_allocator(mr))
    try:
        x = cupy.ones(1 << 20, dtype=cupy.float32)
        assert mr.statistics.count.value >= 1 and mr.bytes_outstanding >= 4 << 20
        assert float(x.sum()) == float(1 << 20)
        del x
        gc.collect()
        cupy.cuda.get_current_stream().synchronize()
        assert mr.statistics.bytes.value == 0
    finally:
        cupy.cuda.set_allocator(prev)


# -- exports are counted; read-only producers stay read-only (issue 14, A1 and A4) -----------

@pytest.mark.parametrize("lib", ["torch", "cupy"])
def test_free_refused_while_a_gpu_consumer_holds_a_dlpack_export(lib):
    mod = pytest.importorskip(lib)
    a = ig.full(4096, 1.0)
    t = mod.from_dlpack(a)
    with pytest.raises(ig.MemoryContractViolation, match=rf"NvArray#{a.id}: 1 DLPack export"):
        a.free()
    b = ig.full(4096, 2.0)  # the block was not handed out again
    assert b.device_ptr != a.device_ptr
    t.fill(5.0) if lib == "cupy" else t.fill_(5.0)
    mod.cuda.get_current_stream().synchronize() if lib == "cupy" else mod.cuda.synchronize()
    assert (b.to_numpy() == 2.0).all() and (a.to_numpy() == 5.0).all()
    del t
    gc.collect()
    a.free()
    b.free()


def test_cai_export_keeps_memory_until_the_consumer_drops_the_array():
    cupy = pytest.importorskip("cupy")
    mr = ig.get_current_resource(ig.Device(0))
    start = mr.bytes_outstanding
    a = ig.full(4096, 3.0)
    ptr = a.device_ptr
    d = cupy.asarray(a)  # __cuda_array_interface__: no release signal
    assert d.data.ptr == ptr
    a.free()  # retires the array; the memory stays with the consumer
    with pytest.raises(ig.UseAfterFreeError):
        a.to_numpy()
    others = [ig.full(4096, 9.0) for _ in range(8)]
    assert all(o.device_ptr != ptr for o in others)
    d += 1
    cupy.cuda.get_current_stream().synchronize()
    assert float(d.sum()) == 4.0 * 4096 and all((o.to_numpy() == 9.0).all() for o in others)
    for o in others:
        o.free()
    del a, d
    gc.collect()
    assert mr.bytes_outstanding == start  # back once the consumer let go


class _ReadOnlyTorchProducer:
    """A producer that marks its tensor read-only with DLPack 1.x's flag."""

    def __init__(self, t):
        self.t = t

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, **kw):
        import ctypes
        try:
            cap = self.t.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:
            pytest.skip("this PyTorch cannot export DLPack 1.x capsules")
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        try:
            addr = get(cap, b"dltensor_versioned")
        except ValueError:
            pytest.skip("this PyTorch answered with a legacy capsule")
        ctypes.c_uint64.from_address(addr + 24).value |= 1  # DLManagedTensorVersioned.flags: READ_ONLY
        return cap


def test_read_only_import_from_a_torch_producer():
    torch = pytest.importorskip("torch")
    t = torch.arange(64, dtype=torch.float32, device="cuda")
    a = ig.from_dlpack(_ReadOnlyTorchProducer(t))
    assert a.readonly and a.device_ptr == t.data_ptr()
    assert (a.to_numpy() == np.arange(64)).all()
    for write in (lambda: a.fill_(1.0), lambda: a.zero_(), lambda: a[0:8].copy_(ig.zeros(8)),
                  lambda: ig.kernels.fill(a, 0.0)):
        with pytest.raises(ig.ReadOnlyError):
            write()
    torch.cuda.synchronize()
    assert t.tolist() == list(range(64))
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__(stream=None)
    c = a.clone()
    assert not c.readonly and c.fill_(1.0).to_numpy().sum() == 64
    c.free()
