"""The driver entry points of the compiled hot paths (``ignis.backends._cudriver``): C
functions over the driver's own functions, which the module takes from ``libcuda.so.1``
at run time (no CUDA headers or cuda-bindings at build time), and whose addresses the
cuda backend hands to cross-stream tracking and the kernel launch
(``direct_calls()``) and the guard hands to PyTorch's free.

Anywhere: the module is built and imports; its addresses; how it takes the functions from
a driver library, checked against small real shared libraries named ``libcuda.so.1``
built here, each handing out its functions one way (``cuGetProcAddress_v2``, the older
``cuGetProcAddress``, plain symbols) and recording what it was asked; the clear refusal
where there is no driver, or one lacking a function, of the module and of the cuda
backend. On a GPU (marked ``gpu``): their use by the backend."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import types

import pytest

import ignis as ig
import ignis.backends
from helpers import IMPORT_ROOT
from ignis.memory import Access

NAMES = ("cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel", "cuMemsetD8Async", "cuMemsetD32Async",
         "cuCtxGetDevice", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuEventQuery")
NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND: what a wrapper returns when the driver's functions cannot be loaded

CTX_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))  # called with the GIL released
CTX_DEVICE_GIL = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))  # with it held; raises a pending error


@pytest.fixture
def cudriver():
    """``ignis.backends._cudriver``: built everywhere, with the rest of Ignis."""
    from ignis.backends import _cudriver
    return _cudriver


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_entry_points_are_distinct_addresses(cudriver):
    ep = cudriver.entry_points()
    assert set(ep) == set(NAMES)
    assert all(type(a) is int and a > 0 for a in ep.values())
    assert len(set(ep.values())) == len(NAMES)
    assert cudriver.entry_points() == ep  # the same functions every time


def test_the_module_needs_nothing_of_cuda_to_build():
    """Its source declares the driver functions itself: no cimport of cuda-bindings, no CUDA header."""
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "src" / "ignis" / "backends" / "_cudriver.pyx"
    if not src.is_file():
        pytest.skip("no source tree here (an installed wheel)")
    text = src.read_text()
    assert "cimport" not in text.replace("from libc.stdint cimport uintptr_t", "")
    assert "cuda.h" not in text and "cydriver" not in text


# -- a stand-in driver library: a real shared object named libcuda.so.1 ------------------------
# Each variant hands out its functions one way and records what it was asked (the CUDA version,
# the flags, how many look-ups); each function records its arguments and returns a status of its
# own (100 + its index; 200 + for the _ptsz symbols), so a test sees which function was called.
STUB_C = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
int stub_version = -1;
unsigned long long stub_flags = 99;
int stub_lookups = 0;
unsigned long long stub_args[12];
static int rec(void *e, void *s) { stub_args[0] = (uintptr_t)e; stub_args[1] = (uintptr_t)s; return 100; }
static int wait_(void *s, void *e, unsigned int f) {
    stub_args[0] = (uintptr_t)s; stub_args[1] = (uintptr_t)e; stub_args[2] = f; return 101; }
static int launch(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                  unsigned int bz, unsigned int sh, void *s, void **p, void **x) {
    unsigned long long a[11] = {(uintptr_t)f, gx, gy, gz, bx, by, bz, sh, (uintptr_t)s, (uintptr_t)p, (uintptr_t)x};
    memcpy(stub_args, a, sizeof a); return 102; }
static int m8(unsigned long long d, unsigned char v, size_t n, void *s) {
    stub_args[0] = d; stub_args[1] = v; stub_args[2] = n; stub_args[3] = (uintptr_t)s; return 103; }
static int m32(unsigned long long d, unsigned int v, size_t n, void *s) {
    stub_args[0] = d; stub_args[1] = v; stub_args[2] = n; stub_args[3] = (uintptr_t)s; return 104; }
static int ctxdev(int *d) { *d = 7; return 0; }
static int hd(unsigned long long d, const void *h, size_t n, void *s) {
    stub_args[0] = d; stub_args[1] = (uintptr_t)h; stub_args[2] = n; stub_args[3] = (uintptr_t)s; return 105; }
static int dh(void *h, unsigned long long d, size_t n, void *s) {
    stub_args[0] = (uintptr_t)h; stub_args[1] = d; stub_args[2] = n; stub_args[3] = (uintptr_t)s; return 106; }
static int eq(void *e) { stub_args[0] = (uintptr_t)e; return 107; }
static void *lookup(const char *name) {
#ifdef STUB_MISSING
    if (strcmp(name, STUB_MISSING) == 0) return NULL;
#endif
    if (!strcmp(name, "cuEventRecord")) return (void *)rec;
    if (!strcmp(name, "cuStreamWaitEvent")) return (void *)wait_;
    if (!strcmp(name, "cuLaunchKernel")) return (void *)launch;
    if (!strcmp(name, "cuMemsetD8Async")) return (void *)m8;
    if (!strcmp(name, "cuMemsetD32Async")) return (void *)m32;
    if (!strcmp(name, "cuCtxGetDevice")) return (void *)ctxdev;
    if (!strcmp(name, "cuMemcpyHtoDAsync")) return (void *)hd;
    if (!strcmp(name, "cuMemcpyDtoHAsync")) return (void *)dh;
    if (!strcmp(name, "cuEventQuery")) return (void *)eq;
    return NULL;
}
#ifdef STUB_V2
int cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status) {
    __atomic_add_fetch(&stub_lookups, 1, __ATOMIC_SEQ_CST);
    stub_version = version; stub_flags = flags;
    *pfn = lookup(sym);
    *status = *pfn ? 0 : 1;
    return *pfn ? 0 : 500;
}
#endif
#ifdef STUB_V1
int cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags) {
    __atomic_add_fetch(&stub_lookups, 1, __ATOMIC_SEQ_CST);
    stub_version = version; stub_flags = flags;
    *pfn = lookup(sym);
    return *pfn ? 0 : 500;
}
#endif
#ifdef STUB_SYMBOLS
int cuEventRecord(void *e, void *s) { return rec(e, s); }
int cuEventRecord_ptsz(void *e, void *s) { return 100 + rec(e, s); }
int cuStreamWaitEvent(void *s, void *e, unsigned int f) { return wait_(s, e, f); }
int cuStreamWaitEvent_ptsz(void *s, void *e, unsigned int f) { return 100 + wait_(s, e, f); }
int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int sh, void *s, void **p, void **x) {
    return launch(f, gx, gy, gz, bx, by, bz, sh, s, p, x); }
int cuLaunchKernel_ptsz(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int sh, void *s, void **p, void **x) {
    return 100 + launch(f, gx, gy, gz, bx, by, bz, sh, s, p, x); }
int cuMemsetD8Async(unsigned long long d, unsigned char v, size_t n, void *s) { return m8(d, v, n, s); }
int cuMemsetD8Async_ptsz(unsigned long long d, unsigned char v, size_t n, void *s) { return 100 + m8(d, v, n, s); }
int cuMemsetD32Async(unsigned long long d, unsigned int v, size_t n, void *s) { return m32(d, v, n, s); }
int cuMemsetD32Async_ptsz(unsigned long long d, unsigned int v, size_t n, void *s) { return 100 + m32(d, v, n, s); }
int cuCtxGetDevice(int *d) { return ctxdev(d); }
/* A copy's plain symbol is CUDA 3's 32-bit function: never the one to take. */
int cuMemcpyHtoDAsync(unsigned int d, const void *h, unsigned int n, void *s) { return 99; }
int cuMemcpyDtoHAsync(void *h, unsigned int d, unsigned int n, void *s) { return 99; }
int cuMemcpyHtoDAsync_v2(unsigned long long d, const void *h, size_t n, void *s) { return hd(d, h, n, s); }
int cuMemcpyHtoDAsync_v2_ptsz(unsigned long long d, const void *h, size_t n, void *s) { return 100 + hd(d, h, n, s); }
int cuMemcpyDtoHAsync_v2(void *h, unsigned long long d, size_t n, void *s) { return dh(h, d, n, s); }
int cuMemcpyDtoHAsync_v2_ptsz(void *h, unsigned long long d, size_t n, void *s) { return 100 + dh(h, d, n, s); }
int cuEventQuery(void *e) { return eq(e); }
#endif
"""


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def stub_driver(tmp_path_factory):
    """Build a stand-in ``libcuda.so.1`` of the given variant; returns its directory (for LD_LIBRARY_PATH)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the driver library is libcuda.so.1 on Linux")
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler to build the stand-in driver library")
    built: dict[tuple[str, ...], str] = {}

    def build(*defines: str) -> str:
        if defines not in built:
            d = tmp_path_factory.mktemp("libcuda")
            (d / "stub.c").write_text(STUB_C)
            subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", *(f"-D{x}" for x in defines),
                            "-o", str(d / "libcuda.so.1"), str(d / "stub.c")], check=True, capture_output=True)
            built[defines] = str(d)
        return built[defines]
    return build


# Run in a child whose LD_LIBRARY_PATH finds the stand-in first: calls each wrapper through ctypes
# (the GIL released, as the compiled callers call them), then reads what the library recorded.
CHILD = textwrap.dedent(r"""
    import ctypes, json, os, sys, threading
    from ignis.backends import _cudriver as m
    c_int, vp, u, ull, sz = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_size_t
    sigs = {
        "cuEventRecord": (vp, vp), "cuStreamWaitEvent": (vp, vp, u),
        "cuLaunchKernel": (vp, u, u, u, u, u, u, u, vp, vp, vp),
        "cuMemsetD8Async": (ull, ctypes.c_ubyte, sz, vp), "cuMemsetD32Async": (ull, u, sz, vp),
        "cuCtxGetDevice": (ctypes.POINTER(c_int),), "cuMemcpyHtoDAsync": (ull, vp, sz, vp),
        "cuMemcpyDtoHAsync": (vp, ull, sz, vp), "cuEventQuery": (vp,)}
    ep = m.entry_points()
    fn = {n: ctypes.CFUNCTYPE(c_int, *sigs[n])(ep[n]) for n in sigs}
    out = {"mapped_at_import": any("libcuda" in l for l in open("/proc/self/maps"))}
    if sys.argv[1] == "threads":  # the first calls come from many threads at once: one load
        res = []
        ts = [threading.Thread(target=lambda: res.append(fn["cuEventRecord"](16, 32))) for _ in range(16)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        out["statuses"] = sorted(set(res))
    big = (1 << 40) + 8
    calls = {
        "cuEventRecord": (0x10, 0x20), "cuStreamWaitEvent": (0x30, 0x40, 1),
        "cuLaunchKernel": (0x50, 1, 2, 3, 4, 5, 6, 7, 0x60, 0x70, 0x80),
        "cuMemsetD8Async": (big, 0xAB, 3, 0x90), "cuMemsetD32Async": (big, 0xDEADBEEF, 5, 0xA0),
        "cuMemcpyHtoDAsync": (big, 0xB0, 1 << 33, 0xC0), "cuMemcpyDtoHAsync": (0xD0, big, 1 << 33, 0xE0),
        "cuEventQuery": (0xF0,)}
    stub = None
    for name, args in calls.items():
        status = fn[name](*args)
        if stub is None and status != 500:
            stub = ctypes.CDLL("libcuda.so.1")  # the library the module opened (the same soname)
        got = list((ctypes.c_ulonglong * 12).in_dll(stub, "stub_args")[:len(args)]) if stub else None
        out[name] = [status, None if got is None else got == list(args)]
    dev = c_int(-1)
    out["cuCtxGetDevice"] = [fn["cuCtxGetDevice"](ctypes.byref(dev)), dev.value]
    out["pending"] = ctypes.PYFUNCTYPE(c_int, ctypes.POINTER(c_int))(ep["cuCtxGetDevice"])(ctypes.byref(dev))
    try:
        loaded = m.load()
        out["load"] = sorted(loaded) == sorted(ep) and all(loaded.values()) and len(set(loaded.values())) == 9
    except OSError as e:
        out["load"] = str(e)
    out["load_error"] = m.load_error()
    out["via"] = m.resolved_via()
    if stub is not None:
        out["version"] = c_int.in_dll(stub, "stub_version").value
        out["flags"] = ctypes.c_ulonglong.in_dll(stub, "stub_flags").value
        out["lookups"] = c_int.in_dll(stub, "stub_lookups").value
    print(json.dumps(out))
""")


def _run_child(libdir: str | None, mode: str = "calls", ptds: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", None)
    if ptds is not None:
        env["CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"] = ptds
    env["LD_LIBRARY_PATH"] = libdir or ""
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


EXPECTED_CALLS = {"cuEventRecord": 100, "cuStreamWaitEvent": 101, "cuLaunchKernel": 102, "cuMemsetD8Async": 103,
                  "cuMemsetD32Async": 104, "cuMemcpyHtoDAsync": 105, "cuMemcpyDtoHAsync": 106, "cuEventQuery": 107}


@pytest.mark.parametrize("ptds, flags", [(None, 0), ("0", 0), ("1", 2)])
def test_the_functions_come_from_cuGetProcAddress_v2(stub_driver, ptds, flags):
    """Taken at the first call (not at import), each asked for the CUDA 12.0 signature, with
    cuda-bindings' default stream: per-thread (flag 2) where CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM
    is a nonzero integer, the default (0) otherwise; arguments reach the driver unchanged."""
    out = _run_child(stub_driver("STUB_V2"), ptds=ptds)
    assert out["mapped_at_import"] is False
    for name, status in EXPECTED_CALLS.items():
        assert out[name] == [status, True], name
    assert out["cuCtxGetDevice"] == [0, 7]
    assert out["pending"] == 0
    assert out["load"] is True and out["load_error"] is None
    assert out["via"] == "cuGetProcAddress_v2"
    assert (out["version"], out["flags"], out["lookups"]) == (12000, flags, 9)


def test_the_functions_come_from_the_older_cuGetProcAddress(stub_driver):
    out = _run_child(stub_driver("STUB_V1"))
    for name, status in EXPECTED_CALLS.items():
        assert out[name] == [status, True], name
    assert out["via"] == "cuGetProcAddress"
    assert (out["version"], out["flags"], out["lookups"]) == (12000, 0, 9)


@pytest.mark.parametrize("ptds, offset", [(None, 0), ("1", 100)])
def test_a_driver_without_cuGetProcAddress_gives_them_by_name(stub_driver, ptds, offset):
    """By symbol: the _ptsz functions for the per-thread default stream, the plain ones otherwise
    (a copy's _v2 either way: its plain symbol is the 32-bit one; an event's query takes no
    stream and has one symbol)."""
    out = _run_child(stub_driver("STUB_SYMBOLS"), ptds=ptds)
    for name, status in EXPECTED_CALLS.items():
        assert out[name] == [status + (0 if name == "cuEventQuery" else offset), True], name
    assert out["cuCtxGetDevice"] == [0, 7]
    assert out["via"] == "dlsym"


def test_many_threads_making_the_first_call_load_once(stub_driver):
    out = _run_child(stub_driver("STUB_V2"), mode="threads")
    assert out["statuses"] == [100]
    assert out["lookups"] == 9


def test_a_driver_lacking_a_function_is_refused_by_name(stub_driver):
    """Every wrapper then returns CUDA_ERROR_NOT_FOUND and calls nothing, with no Python error
    pending; ``load()`` says which function the driver lacks."""
    out = _run_child(stub_driver("STUB_V2", "STUB_MISSING=\"cuLaunchKernel\""))
    for name in EXPECTED_CALLS:
        assert out[name] == [NOT_FOUND, None], name
    assert out["cuCtxGetDevice"] == [NOT_FOUND, -1]
    assert out["pending"] == NOT_FOUND
    assert "gave no cuLaunchKernel for CUDA 12.0" in out["load"]
    assert "IGNIS_BACKEND=emulated" in out["load"]
    assert "cuLaunchKernel" in out["load_error"]


@pytest.mark.skipif(_driver_loadable(), reason="the CUDA driver library loads here: no missing-driver case")
def test_a_missing_driver_is_a_status_and_a_clear_load_error():
    out = _run_child(None)
    for name in EXPECTED_CALLS:
        assert out[name] == [NOT_FOUND, None], name
    assert out["pending"] == NOT_FOUND  # PYFUNCTYPE would raise an exception the wrapper left pending
    assert "the CUDA driver library could not be loaded (libcuda.so.1" in out["load"]
    assert "install it, or set IGNIS_BACKEND=emulated" in out["load"]
    assert out["via"] == ""


def test_the_cuda_backend_refuses_a_driver_lacking_a_function(stub_driver):
    """The backend loads the entry points' functions when it starts: a driver without one is a
    DriverError naming it (cuda-bindings' cuInit stood in for, as the driver here is not real)."""
    code = textwrap.dedent("""
        import types
        import ignis.backends.cuda as c
        from ignis.errors import DriverError
        c.cu = types.SimpleNamespace(cuInit=lambda flags: (0,))
        try:
            c.CudaBackend()
        except DriverError as e:
            print("refused:", e)
    """)
    env = dict(os.environ, LD_LIBRARY_PATH=stub_driver("STUB_V2", "STUB_MISSING=\"cuMemsetD32Async\""),
               PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:"), out.stdout
    for part in ("CUDA_ERROR_NOT_FOUND", "cuGetProcAddress", "gave no cuMemsetD32Async", "IGNIS_BACKEND=emulated"):
        assert part in out.stdout, part


@pytest.mark.skipif(_driver_loadable(), reason="the CUDA driver library loads here: no missing-driver case")
def test_without_a_driver_the_cuda_backend_refuses_and_the_emulator_runs():
    """IGNIS_BACKEND=cuda on a machine with no libcuda.so.1: a clear refusal; the emulated backend
    works in the same installation."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p),
               IGNIS_BACKEND="cuda")
    code = "import ignis as ig; ig.zeros(4)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1
    assert "libcuda.so.1" in out.stderr and "IGNIS_BACKEND=emulated" in out.stderr, out.stderr
    env["IGNIS_BACKEND"] = "emulated"
    code = "import ignis as ig; a = ig.full(4, 3.0); print(ig.get_backend().name, a.to_numpy().tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["emulated", "[3.0,", "3.0,", "3.0,", "3.0]"]


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
    dc = cuda_backend.direct_calls()
    assert dc.raw == (ep["cuEventRecord"], ep["cuStreamWaitEvent"], ep["cuLaunchKernel"])
    assert dc.entry_points == ep and dc.backend is cuda_backend  # a wrapper's: gated by its faults too
    inner = getattr(cuda_backend, "inner", cuda_backend)
    assert inner.direct_calls() is inner.direct_calls() and inner.direct_calls().backend is inner  # made once
    assert any(g is cuda_backend._trace for g in dc.gates) and dc.is_open()


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
    for part in ("ignis.backends._cudriver", "needs only a C compiler", "pip install .",
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
    ``direct_calls().entry_points``); one that gives none is refused before anything is swapped."""
    tg = pytest.importorskip("ignis.torch._guard", reason="the PyTorch front end does not import here")
    stand_in = types.SimpleNamespace(name="stand-in", cuda_driver=True, direct_calls=lambda: None)
    monkeypatch.setattr(ignis.backends, "get_backend", lambda: stand_in)
    with pytest.raises(tg.GuardError, match="cuMemsetD8Async, cuMemsetD32Async, cuCtxGetDevice.*stand-in.*"
                                            "ignis.backends._cudriver.*IGNIS_BACKEND"):
        tg._driver_entry_points()
