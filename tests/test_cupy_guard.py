"""The debug guard as CuPy's allocator (ignis.cupy).

CPU part: the allocator function ``cupy.cuda.set_allocator`` receives is driven
with a stand-in for the few CuPy names it uses (the device, the current
stream's handle, UnownedMemory, MemoryPointer) over Ignis's own streams on the
active backend. GPU part (``@pytest.mark.gpu``): real CuPy arrays and kernels.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import types

import pytest

import ignis as ig
import ignis.cupy
from helpers import IMPORT_ROOT, read, write
from ignis.memory import guard_front as tg
from ignis.memory.guard_alloc import state as _s

G, POISON = 256, 0xA5


class _Unowned:
    def __init__(self, ptr, size, owner, device_id=0):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class _MemPtr:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


def _fake_cupy(stream: ig.Stream) -> types.SimpleNamespace:
    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        get_current_stream=lambda: types.SimpleNamespace(ptr=stream.handle),
        UnownedMemory=_Unowned, MemoryPointer=_MemPtr)
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def cupy_alloc(streams):
    tg.reset()
    tg.configure({"batch": 4})
    yield ignis.cupy._cupy_allocator(_fake_cupy(streams[0])), streams[0]
    tg.reset()


def test_arrays_get_guards_poison_and_are_freed_when_cupy_lets_go(cupy_alloc):
    alloc, s = cupy_alloc
    mp = alloc(4000)
    g = tg.guard_resource(0)
    assert g.bytes_outstanding == 4000 and _s.blocks[mp.ptr].tag == "cupy"
    assert read(mp.ptr, 4000, s) == bytes([POISON]) * 4000
    ptr = mp.ptr
    del mp
    gc.collect()
    assert g.bytes_outstanding == 0 and ptr not in _s.blocks
    assert tg.check(raise_=False) == []


def test_empty_allocation_owns_nothing(cupy_alloc):
    alloc, _ = cupy_alloc
    mp = alloc(0)
    assert mp.ptr == 0 and mp.mem.owner is None


def test_a_cupy_write_past_the_end_is_reported_as_an_array(cupy_alloc):
    alloc, s = cupy_alloc
    mp = alloc(1000)
    keep = write(mp.ptr + 1000, b"\x01" * 4, s)
    del mp
    gc.collect()
    (e,) = tg.check(raise_=False)
    assert isinstance(e, ig.OutOfBoundsError) and "past the end of a 1000-byte array (tag 'cupy'" in str(e)
    assert os.path.basename(__file__) in str(e)  # the allocation site
    del keep


def test_use_guard_needs_the_cuda_backend(monkeypatch, streams):
    if ig.get_backend().name == "cuda":
        pytest.skip("the cuda backend is active")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(streams[0]))
    tg.reset()
    try:
        with pytest.raises(tg.GuardError, match="cuda backend"):
            ignis.cupy.use_guard()
    finally:
        tg.reset()


def test_the_package_imports_neither_framework():
    code = "import sys, ignis.cupy, ignis.torch._guard; print('cupy' in sys.modules, 'torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


@pytest.mark.gpu
def test_real_cupy_arrays_under_the_guard():
    cupy = pytest.importorskip("cupy")
    tg.reset()
    try:
        ignis.cupy.use_guard(batch=4)
        x = cupy.arange(1000, dtype=cupy.float32)
        assert int(x.data.ptr) in _s.blocks
        y = (x * 2).sum()
        assert float(y) == 999000.0
        z = cupy.empty(256, dtype=cupy.uint8)
        assert bool((z == POISON).all())  # never written: the poison
        k = cupy.RawKernel(r'extern "C" __global__ void w(float* p) { p[1000 + threadIdx.x] = 1.0f; }', "w")
        k((1,), (4,), (x,))
        del x, z
        with pytest.raises(ig.OutOfBoundsError, match="past the end of a 4000-byte array"):
            ignis.cupy.check()
    finally:
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        tg.reset()
