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
