"""The driver entry points of the compiled hot paths (``ignis.backends._cudriver``): C
functions over cuda-bindings' ``cydriver``, whose addresses the cuda backend hands to
cross-stream tracking and the kernel launch (``tracking_calls()["raw"]``) and the guard
hands to PyTorch's free. Their addresses and the missing-driver case are tested
anywhere the module is built (it needs cuda-bindings' cydriver.pxd and cuda.h at build
time); their use by the backend on a GPU (marked ``gpu``); and, anywhere, the clear
refusal of the cuda backend where the module is missing, and of the guard under PyTorch
where the backend gives no entry points."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types

import pytest

import ignis as ig
import ignis.backends
from helpers import IMPORT_ROOT
from ignis.memory import Access

NAMES = ("cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel", "cuMemsetD8Async", "cuMemsetD32Async",
         "cuCtxGetDevice")
NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND: what cydriver returns when it cannot load the driver

CTX_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))  # called with the GIL released
CTX_DEVICE_GIL = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))  # with it held; raises a pending error


@pytest.fixture
def cudriver():
    """``ignis.backends._cudriver``; the test is skipped, with the reason, where it is not built."""
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed: ignis.backends._cudriver "
                        "(built over its cydriver) cannot exist here")
    try:
        from ignis.backends import _cudriver
    except ImportError as e:
        pytest.skip(f"ignis.backends._cudriver is not built here (it needs cuda-bindings' cydriver.pxd and "
                    f"cuda.h at build time; see setup.py): {e}")
    return _cudriver


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_entry_points_are_six_distinct_addresses(cudriver):
    ep = cudriver.entry_points()
    assert set(ep) == set(NAMES)
    assert all(type(a) is int and a > 0 for a in ep.values())
    assert len(set(ep.values())) == len(NAMES)
    assert cudriver.entry_points() == ep  # the same functions every time


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_taking_the_entry_points_loads_no_driver(cudriver):
    """cydriver loads the driver library at its first call, not at import: the module imports,
    and gives its addresses, on a machine without a driver (and no earlier)."""
    code = ("import ignis.backends._cudriver as m; ep = m.entry_points(); "
            "print(any('libcuda' in line for line in open('/proc/self/maps')))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(_driver_loadable(), reason="the CUDA driver library loads here: no missing-driver case")
def test_a_missing_driver_is_a_status_and_leaves_no_python_error(cudriver):
    """Without a driver library cydriver returns CUDA_ERROR_NOT_FOUND with a Python exception
    set; the wrapper clears it (keeping it for ``last_load_error``) and returns the status, so
    its C callers see a refused call, whether they hold the GIL or not."""
    addr = cudriver.entry_points()["cuCtxGetDevice"]
    n0, _ = cudriver.last_load_error()
    dev = ctypes.c_int(-7)
    assert CTX_DEVICE(addr)(ctypes.byref(dev)) == NOT_FOUND
    assert dev.value == -7
    # PYFUNCTYPE keeps the GIL and raises whatever exception the function left pending: none.
    assert CTX_DEVICE_GIL(addr)(ctypes.byref(dev)) == NOT_FOUND
    n, last = cudriver.last_load_error()
    assert n == n0 + 2
    assert isinstance(last, Exception)


# -- on a GPU: the backend's direct paths use these entry points ----------------------------------

@pytest.fixture
def cuda_backend():
    b = ig.get_backend()
    assert b.name == "cuda"
    b.init_device(0)
    yield b
    b.clear_faults()


@pytest.mark.gpu
def test_the_cuda_backend_hands_over_these_entry_points(cudriver, cuda_backend):
    ep = cudriver.entry_points()
    calls = cuda_backend.tracking_calls()
    assert calls["raw"] == (ep["cuEventRecord"], ep["cuStreamWaitEvent"], ep["cuLaunchKernel"])
    assert calls["entry_points"] == ep


@pytest.mark.gpu
def test_an_entry_point_reaches_the_driver(cudriver, cuda_backend):
    cuda_backend.set_current(0)  # device 0's context current on this thread (whatever ran before)
    dev = ctypes.c_int(-1)
    assert CTX_DEVICE(cudriver.entry_points()["cuCtxGetDevice"])(ctypes.byref(dev)) == 0
    assert dev.value == 0


@pytest.mark.gpu
def test_cross_stream_tracking_calls_the_driver_directly(cudriver, cuda_backend):
    """A block written on one stream and read on another: tracking's event records and waits
    go straight to the driver through the entry points (``driver_calls`` counts them)."""
    from ignis.memory.resource import driver_calls
    cuda_backend.set_current(0)
    d = ig.Device(0)
    pool = ig.PoolResource(ig.DirectResource(d))
    s1, s2 = d.create_stream(), d.create_stream()
    try:
        before = driver_calls()
        blk = pool.allocate(4096, s1)
        for s, acc in ((s1, Access.WRITE), (s2, Access.READ), (s1, Access.WRITE)):
            pool.prepare_block_use(blk, s, acc)
            pool.finish_block_use(blk, s, acc)
        pool.deallocate(blk)
        after = driver_calls()
        assert after["event_record"] > before["event_record"]
        assert after["stream_wait_event"] > before["stream_wait_event"]
        d.synchronize()
    finally:
        pool.close()
        s1.close()
        s2.close()


# -- where the module is missing --------------------------------------------------------------

@pytest.fixture
def without_cudriver(monkeypatch):
    """``import ignis.backends._cudriver`` fails, as in an installation built without it."""
    monkeypatch.setitem(sys.modules, "ignis.backends._cudriver", None)
    monkeypatch.delattr(ignis.backends, "_cudriver", raising=False)


def _fake_driver(monkeypatch) -> None:
    """cuda-bindings' driver module as far as the backend reaches before it imports the module:
    a cuInit that succeeds (no GPU needed)."""
    import ignis.backends.cuda as cuda_mod
    monkeypatch.setattr(cuda_mod, "cu", types.SimpleNamespace(cuInit=lambda flags: (0,)))


def _says_how_to_rebuild(text: str) -> None:
    for part in ("ignis.backends._cudriver", "cuda-bindings", "cuda.h", "pip install --no-build-isolation .",
                 "python setup.py build_ext --inplace", "IGNIS_BACKEND=emulated"):
        assert part in text, part


def test_the_cuda_backend_refuses_to_start_without_the_module(without_cudriver, monkeypatch):
    from ignis.backends.cuda import CudaBackend
    _fake_driver(monkeypatch)
    with pytest.raises(ImportError) as info:
        CudaBackend()
    assert info.value.name == "ignis.backends._cudriver"
    _says_how_to_rebuild(str(info.value))


def test_auto_says_the_cuda_backend_is_not_built(without_cudriver, monkeypatch, capsys):
    _fake_driver(monkeypatch)
    monkeypatch.setattr(ignis.backends, "auto_fallback", None)
    emulated = object()
    monkeypatch.setattr(ignis.backends, "_make", lambda name: emulated if name == "emulated" else None)
    assert ignis.backends._auto() is emulated
    assert "the cuda backend is not built here (ignis.backends._cudriver is missing)" in capsys.readouterr().err
    assert "ignis.backends._cudriver" in ignis.backends.auto_fallback


def test_the_guard_under_pytorch_refuses_a_backend_without_entry_points(monkeypatch):
    """The guard takes the poison's entry points from the active backend (the cuda backend's
    ``tracking_calls()["entry_points"]``); one that gives none is refused before anything is swapped."""
    tg = pytest.importorskip("ignis.torch._guard", reason="the PyTorch front end does not import here")
    stand_in = types.SimpleNamespace(name="stand-in", cuda_driver=True, tracking_calls=lambda: {"raw": (1, 2, 3)})
    monkeypatch.setattr(ignis.backends, "get_backend", lambda: stand_in)
    with pytest.raises(tg.GuardError, match="cuMemsetD8Async, cuMemsetD32Async, cuCtxGetDevice.*stand-in.*"
                                            "ignis.backends._cudriver.*IGNIS_BACKEND"):
        tg._driver_entry_points()
