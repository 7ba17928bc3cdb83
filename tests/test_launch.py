"""The compiled launch: the packed parameter buffer, the direct driver path and its
fallbacks to the backend's ``kernel_launch``.

Three parts:

- ``Kernel.pack`` / ``marshal`` (no device needed): each argument's bytes are what
  the ctypes type of its declaration makes of the value, and a value it refuses
  raises ctypes' own error.
- The direct path, driven here without a GPU: ``DirectStub`` is the emulated backend
  dressed as the cuda backend is for the compiled launch (its ``direct_calls`` gives
  a stream table, a current-context record and, third in ``raw``, the address of a
  "cuLaunchKernel" that is a ctypes callback recording its arguments; the gates are the
  backend's own).
  Every decision of ``Kernel._queue`` (direct, or the backend's method) is checked.
- On a real GPU (``@pytest.mark.gpu``): built-in and declared kernels launched through
  the driver's own cuLaunchKernel, their results, and the count of direct launches.
"""

from __future__ import annotations

import ctypes
import re
import struct
import threading

import numpy as np
import pytest

import ignis as ig
from ignis.backends.emulated import EmulatedBackend
from ignis.backends.faults import FaultInjectingBackend
from ignis.errors import DriverError
from ignis.runtime.kernel import SCALAR_CTYPES, driver_calls

SRC = 'extern "C" __global__ void k() {}'  # never compiled here: the stub hands out a fake function
CODES = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
         "uint64": "Q", "float32": "f", "float64": "d", "bool": "?"}


def _kernel(*scalars: str, name: str = "k") -> ig.Kernel:
    """A kernel of one READ_WRITE array and ``scalars`` (dtype names)."""
    return ig.Kernel(SRC, name, ("read_write", *scalars), lambda *a: None)


def _slot(dtype: str, value) -> bytes:
    """What the ctypes type of ``dtype`` makes of ``value``, in an 8-byte slot (the reference)."""
    return bytes(SCALAR_CTYPES[dtype](value)).ljust(8, b"\0")


def _launches() -> int:
    return driver_calls()["kernel_launch"]


# -- the packed buffer ------------------------------------------------------------------------
VALUES = [0, 1, -1, 7, 127, 128, 255, 256, 300, -129, 2**31 - 1, 2**31, -2**31, 2**32 + 5, 2**63 - 1,
          2**63, -2**63, 2**64 + 3, 2**70 + 9, -2**70, True, False]
FLOATS = [0.0, -0.0, 1.5, -2.25, 0.1, 1e300, -1e-300, float("inf"), float("-inf"), 3, -7, 2**70, True]
NUMPY = [np.int8(-3), np.uint16(65535), np.int64(-2**40), np.uint64(2**64 - 1), np.float32(1.5), np.float64(0.1),
         np.bool_(True), np.int32(0)]


@pytest.mark.parametrize("dtype", list(CODES))
def test_pack_matches_ctypes_for_every_scalar_dtype(dtype):
    k = _kernel(dtype)
    x = ig.empty(4, "float32")
    values = FLOATS if dtype.startswith("float") else VALUES
    if dtype == "bool":
        values = VALUES + FLOATS + ["x", "", None, [], [0]]
    for v in values + NUMPY:
        try:
            want = _slot(dtype, v)
        except Exception as e:  # noqa: BLE001 - ctypes refuses it: pack must refuse it the same way
            with pytest.raises(type(e), match=f"^{re.escape(str(e))}$"):
                k.pack(x, v)
            continue
        got = k.pack(x, v)
        assert got == struct.pack("<Q", x.device_ptr) + want, (dtype, v)
        # marshal: the ctypes value the backend's kernel_launch gets, from the same bytes
        p = k.marshal(x, v)
        assert type(p[1]) is SCALAR_CTYPES[dtype]
        assert bytes(p[1]) == bytes(SCALAR_CTYPES[dtype](v))
    x.free()


def test_pack_layout_is_one_slot_per_argument_in_struct_terms():
    k = ig.Kernel(SRC, "k", ("write", "read", "float32", "int64", "uint8", "bool", "float64"), lambda *a: None)
    y, x = ig.empty(16), ig.empty(16)
    got = k.pack(y, x, 2.5, 1 << 40, 300, 2, -0.5)
    want = b"".join(struct.pack("<" + c, v).ljust(8, b"\0") for c, v in
                    (("Q", y.device_ptr), ("Q", x.device_ptr), ("f", 2.5), ("q", 1 << 40), ("B", 300 & 0xFF),
                     ("?", True), ("d", -0.5)))
    assert got == want
    assert len(got) == 8 * k.nargs
    y.free()
    x.free()


def test_pack_errors_are_ctypes_errors():
    k = _kernel("int64", "float32", "uint8")
    x = ig.empty(4)
    cases = [(1.5, 2.0, 1), ("3", 2.0, 1), (None, 2.0, 1), (np.float64(1.0), 2.0, 1), (1, "2", 1), (1, None, 1),
             (1, 1j, 1), (1, 10**400, 1), (1, 2.0, 2.5), (1, 2.0, np.float32(1))]
    for args in cases:
        ref = None
        for dt, v in zip(("int64", "float32", "uint8"), args):
            try:
                SCALAR_CTYPES[dt](v)
            except Exception as e:  # noqa: BLE001
                ref = e
                break
        assert ref is not None, args
        for call in (k.pack, k.marshal):
            with pytest.raises(type(ref), match=f"^{re.escape(str(ref))}$"):
                call(x, *args)
    with pytest.raises(TypeError, match="declares 4 argument"):
        k.pack(x, 1, 2.0)
    with pytest.raises(AttributeError):  # an array argument must be an NvArray (launch's preflight says so)
        k.pack(5, 1, 2.0, 3)
    x.free()


def test_pack_more_arguments_than_the_stack_buffer():
    dts = [list(CODES)[i % len(CODES)] for i in range(40)]
    k = _kernel(*dts)
    x = ig.empty(4)
    vals = [(i * 37 - 500) if not dt.startswith("float") else i / 3 for i, dt in enumerate(dts)]
    assert k.pack(x, *vals) == struct.pack("<Q", x.device_ptr) + b"".join(_slot(d, v) for d, v in zip(dts, vals))
    x.free()


# -- the direct path, on a stub of the cuda backend ---------------------------------------------
_LAUNCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class _Fn:
    """A compiled function as the cuda backend hands it out: ``int()`` is the driver's handle."""

    def __init__(self, addr: int) -> None:
        self.addr = addr

    def __int__(self) -> int:
        return self.addr


class _Ctx:
    pass


class DirectStub(EmulatedBackend):
    """The emulated backend with the cuda backend's hooks for the compiled launch. Its
    "driver" records each direct launch (function, dims, shared memory, stream, the
    parameter buffer read through the pointer array) and answers ``status``; its
    ``kernel_launch`` (the backend's path) records its arguments and queues nothing."""

    name = "stub-cuda"
    host_kernels = False  # launches compiled kernels, as the cuda backend does

    def __init__(self) -> None:
        super().__init__(devices=1, memory="64MiB")
        self.table: dict[int, tuple] = {}
        self.cur = threading.local()
        self.dev_rec = type("Dev", (), {})()
        self.dev_rec.ctx = _Ctx()
        self._raw = _LAUNCH_FN(self._driver_launch)  # kept alive with the backend
        self.reset()

    def reset(self) -> None:
        """This thread's context current, the driver accepting, nothing recorded."""
        self.cur.ctx = self.dev_rec.ctx
        self.status = 0
        self.direct: list[tuple] = []
        self.via_backend: list[tuple] = []
        self.nparams = 0
        self.compiled = 0

    def _driver_launch(self, f, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        data = b"".join(ctypes.string_at(params[i], 8) for i in range(self.nparams))
        self.direct.append((f, (gx, gy, gz), (bx, by, bz), shm, stream, data, extra))
        return self.status

    def direct_calls(self):  # a launch only; no epoch: the context is asked at every launch
        return self._direct_calls(self.table, {}, self.cur, None, (0, 0, ctypes.cast(self._raw, ctypes.c_void_p).value))

    def stream_create(self, ordinal: int, priority: int = 0) -> int:
        h = super().stream_create(ordinal, priority)
        self.table[h] = (self.dev_rec, object())
        return h

    def kernel_compile(self, ordinal, source, name, options=()):
        self.compiled += 1
        return _Fn(0xF00D0)

    def kernel_launch(self, function, grid, block, shared_mem, stream, params=()):
        self.via_backend.append((function, grid, block, shared_mem, stream, [bytes(p) for p in params]))
        if self.status:
            raise DriverError(self.status, "CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel", "refused (stub)")


_STUB: list[DirectStub] = []  # one for the module (each backend keeps a stream worker thread)


@pytest.fixture
def stub():
    """The process's backend is a ``DirectStub`` for the test (inside the fault-injecting
    wrapper, as every backend in the tests), with nothing recorded yet; yields the stub."""
    if not _STUB:
        _STUB.append(FaultInjectingBackend(DirectStub()))
    wrapper = _STUB[0]
    be = wrapper.inner
    be.reset()
    prev = ig.get_backend()
    ig.set_backend(wrapper)
    try:
        yield be
    finally:
        ig.Device(0).synchronize()
        wrapper.clear_faults()
        ig.set_backend(prev)


def test_direct_launch_passes_everything_to_the_driver(stub):
    k = _kernel("int64", "float32", name="direct")
    stub.nparams = 3
    d = ig.Device(0)
    s = d.create_stream()
    x = ig.zeros(64, stream=s)
    before = _launches()
    ig.launch(k, (2, 3), (128, 2), x, -5, 0.5, stream=s, shared_mem=96)
    assert _launches() == before + 1 and stub.via_backend == [] and stub.compiled == 1
    f, g, b, shm, st, data, extra = stub.direct[-1]
    assert (f, g, b, shm, st, extra) == (0xF00D0, (2, 3, 1), (128, 2, 1), 96, s.handle, None)
    assert data == k.pack(x, -5, 0.5)
    ig.launch(k, 1, 1, x, 1, 1.0, stream=s)  # compiled once per device and generation
    assert stub.compiled == 1 and _launches() == before + 2
    s.synchronize()
    s.close()


def test_builtins_go_direct(stub):
    x, y = ig.empty(1000), ig.empty(1000)
    stub.nparams = 3
    before = _launches()
    ig.kernels.fill(x, 1.5)
    ig.kernels.copy(y, x)
    assert _launches() == before + 2 and stub.via_backend == []
    fill, copy = stub.direct[-2:]
    assert fill[5] == struct.pack("<QI4xq", x.device_ptr, struct.unpack("<I", struct.pack("<f", 1.5))[0], 1000)
    assert copy[5] == struct.pack("<QQq", y.device_ptr, x.device_ptr, 1000)
    assert fill[1] == (4, 1, 1) and fill[2] == (256, 1, 1)


def test_more_parameters_than_the_stack_buffer_go_direct(stub):
    dts = ["int32"] * 20
    k = _kernel(*dts, name="many")
    stub.nparams = 21
    x = ig.empty(8)
    before = _launches()
    ig.launch(k, 1, 32, x, *range(20))
    assert _launches() == before + 1
    assert stub.direct[-1][5] == k.pack(x, *range(20))


def _assert_backend_path(stub, before: int, k, *args) -> None:
    assert _launches() == before
    fn, grid, block, shm, st, params = stub.via_backend[-1]
    assert isinstance(fn, _Fn) and params == [bytes(p) for p in k.marshal(*args)]


def test_armed_fault_takes_the_backend_path(stub):
    k = _kernel("int64", name="faulty")
    x = ig.empty(8)
    before = _launches()
    ig.get_backend().inject_fault("kernel_launch")  # on the wrapper in use
    with pytest.raises(DriverError, match="injected fault"):
        ig.launch(k, 1, 1, x, 3)
    assert _launches() == before and stub.direct == []
    ig.launch(k, 1, 1, x, 3)  # disarmed again: direct
    assert _launches() == before + 1


def test_a_kernel_launch_on_the_instance_sees_every_launch(stub):
    k = _kernel("int64", name="listened")
    x = ig.empty(8)
    seen = []
    be = ig.get_backend()  # the backend in use (the wrapper)
    be.kernel_launch = lambda *a: seen.append(a)
    try:
        before = _launches()
        ig.launch(k, 1, 1, x, 3)
        ig.kernels.fill(x, 2.0)
    finally:
        del be.kernel_launch
    assert _launches() == before and stub.direct == [] and len(seen) == 2
    assert [bytes(p) for p in seen[0][5]] == [bytes(p) for p in k.marshal(x, 3)]


def test_context_not_current_takes_the_backend_path(stub):
    k = _kernel("int64", name="ctx")
    x = ig.empty(8)
    before = _launches()
    stub.cur.ctx = None
    ig.launch(k, 1, 1, x, 3)
    _assert_backend_path(stub, before, k, x, 3)
    stub.cur.ctx = _Ctx()  # another context current on this thread
    ig.launch(k, 1, 1, x, 4)
    _assert_backend_path(stub, before, k, x, 4)
    seen = []
    t = threading.Thread(target=lambda: (ig.launch(k, 1, 1, x, 5), seen.append(_launches())))
    stub.cur.ctx = stub.dev_rec.ctx
    t.start()
    t.join()
    assert seen == [before]  # a fresh thread has no current context: the backend's path
    _assert_backend_path(stub, before, k, x, 5)
    ig.launch(k, 1, 1, x, 6)  # this thread's context current again: direct
    assert _launches() == before + 1


def test_foreign_stream_takes_the_backend_path(stub):
    k = _kernel("int64", name="foreign")
    d = ig.Device(0)
    s = d.create_stream()
    x = ig.empty(8, stream=s)
    del stub.table[s.handle]  # a handle this backend did not make
    before = _launches()
    ig.launch(k, 1, 1, x, 3, stream=s)
    _assert_backend_path(stub, before, k, x, 3)
    s.synchronize()
    s.close()


@pytest.mark.parametrize("grid, block, shared_mem", [(2**32, 1, 0), ((1, 2**32), 1, 0), (1, (1, 1, 2**33), 0),
                                                      (1, 1, 2**32), (1, 1, -1), (1, 1, 1.0), ((True, 1), 1, 0)])
def test_dimensions_the_driver_cannot_take_go_to_the_backend(stub, grid, block, shared_mem):
    k = _kernel("int64", name="dims")
    x = ig.empty(8)
    before = _launches()
    ig.launch(k, grid, block, x, 3, shared_mem=shared_mem)
    _assert_backend_path(stub, before, k, x, 3)
    assert stub.via_backend[-1][3] is shared_mem


def test_driver_refusal_is_the_backends_error(stub):
    k = _kernel("int64", name="refused")
    x = ig.empty(8)
    stub.nparams = 2
    stub.status = 1
    before = _launches()
    with pytest.raises(DriverError, match="refused"):
        ig.launch(k, 1, 1, x, 3)
    assert len(stub.direct) == 1 and len(stub.via_backend) == 1  # tried directly once, then the backend's way
    assert _launches() == before
    stub.status = 0
    ig.kernels.fill(x, 1.0)  # the uses were ended: the array is usable
    assert _launches() == before + 1


def test_bad_scalar_on_the_direct_path_raises_ctypes_error_and_ends_the_uses(stub):
    k = ig.Kernel(SRC, "bad", ("read", "write", "int64"), lambda *a: None)
    d = ig.Device(0)
    s1, s2 = d.create_stream(), d.create_stream()
    a = ig.zeros(8, stream=s1)
    b = ig.zeros(8, stream=s1)
    try:
        ig.Device(0).synchronize()
        before = _launches()
        with pytest.raises(TypeError, match="^'float' object cannot be interpreted as an integer$"):
            ig.launch(k, 1, 1, a, b, 1.5, stream=s2)  # a use on s2 of blocks from s1: begun, then ended
        assert _launches() == before and stub.direct == [] and stub.via_backend == []
        blk = b._block
        assert blk.hazard_record()[0] is s2  # the write's use was recorded, although nothing was queued
        ig.launch(k, 1, 1, a, b, 2, stream=s2)
        assert _launches() == before + 1
    finally:
        d.synchronize()
        s1.close()
        s2.close()


def test_sanitizer_on_launches_go_direct_and_are_checked(stub, san):
    x = ig.empty(1000)
    stub.nparams = 3
    before, checked = _launches(), san.checked
    for _ in range(3):
        ig.kernels.fill(x, 2.0)
    assert _launches() == before + 3 and san.checked == checked + 3 and stub.via_backend == []


def test_untracked_resource_is_refused_before_the_driver(stub):
    direct = ig.DirectResource(ig.Device(0))
    a = ig.zeros(16, mr=direct)
    before = _launches()
    with pytest.raises(ig.StreamMisuseError, match="refused before launch"):
        ig.kernels.fill(a, 1.0)
    assert _launches() == before and stub.direct == [] and stub.via_backend == []
    a.free()


# -- on a real GPU ----------------------------------------------------------------------
PARAMS_SRC = r'''
extern "C" __global__ void ignis_test_params(double* out, signed char a, unsigned char b, short c,
        unsigned short d, int e, unsigned int f, long long g, unsigned long long h, float i, double j, bool k) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = a; out[1] = b; out[2] = c; out[3] = d; out[4] = e; out[5] = f;
        out[6] = (double)g; out[7] = (double)h; out[8] = i; out[9] = j; out[10] = k ? 1.0 : 0.0;
    }
}'''
PARAMS_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64",
                 "bool")
MANY_SRC = r'''
extern "C" __global__ void ignis_test_many(long long* out, ''' + ", ".join(f"int p{i}" for i in range(20)) + r''') {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ''' + " ".join(f"out[{i}] = p{i};" for i in range(20)) + r'''
    }
}'''


def _params_host(out, *vals):
    out[0:11] = [float(v) for v in vals]


def _many_host(out, *vals):
    out[0:20] = [int(v) for v in vals]


def _values_kernels():
    params = ig.Kernel(PARAMS_SRC, "ignis_test_params", ("write", *PARAMS_DTYPES), _params_host)
    many = ig.Kernel(MANY_SRC, "ignis_test_many", ("write", *["int32"] * 20), _many_host)
    return params, many


def test_every_scalar_dtype_reaches_the_kernel():
    """On any backend (the emulator runs the host_impl); on a GPU through the driver's
    cuLaunchKernel with the packed buffer, and counted as direct launches."""
    params, many = _values_kernels()
    out = ig.zeros(11, "float64")
    vals = (-5, 250, -30000, 60000, -2**31, 2**32 - 1, -2**40, 2**50, 1.5, -2.25, True)
    before = _launches()
    ig.launch(params, 1, 32, out, *vals)
    assert out.to_numpy().tolist() == [float(v) for v in vals]
    out2 = ig.zeros(20, "int64")
    ig.launch(many, 1, 32, out2, *range(-10, 10))
    assert out2.to_numpy().tolist() == list(range(-10, 10))
    if ig.backend_name() == "cuda":
        assert _launches() == before + 2
    else:
        assert _launches() == before


@pytest.mark.gpu
def test_gpu_builtins_go_through_the_driver_directly():
    x = ig.empty(1 << 20, "float32")
    y = ig.empty(1 << 20, "float32")
    ig.Device(0).synchronize()
    before = _launches()
    ig.kernels.fill(x, 2.5)
    ig.kernels.copy(y, x)
    ig.kernels.axpy(y, x, 2.0)  # y = 2 * 2.5 + 2.5
    assert _launches() == before + 3
    assert (y.to_numpy() == 7.5).all() and (x.to_numpy() == 2.5).all()
    s = ig.Device(0).create_stream()
    ig.kernels.fill(x, -1.0, stream=s)  # another stream: a cross-stream use, still direct
    assert _launches() == before + 4
    assert (x.to_numpy() == -1.0).all()
    s.synchronize()
    s.close()


@pytest.mark.gpu
def test_gpu_unusual_launches_take_the_backend_path():
    be = ig.get_backend()
    x = ig.empty(4096, "float32")
    ig.kernels.fill(x, 0.0)
    before = _launches()
    be.inject_fault("kernel_launch")
    try:
        with pytest.raises(DriverError, match="injected fault"):
            ig.kernels.fill(x, 1.0)
    finally:
        be.clear_faults()
    assert _launches() == before
    seen = []
    orig = type(be).kernel_launch
    be.kernel_launch = lambda *a: (seen.append(a), orig(be, *a))[1]
    try:
        ig.kernels.fill(x, 3.0)
    finally:
        del be.kernel_launch
    assert len(seen) == 1 and _launches() == before and (x.to_numpy() == 3.0).all()
    k = ig.kernels.kernel("fill", 4)
    with pytest.raises(DriverError) as ei:  # more threads per block than any GPU has: the driver refuses
        ig.launch(k, 1, 4096, x, 0, 4096)
    assert ei.value.call == "cuLaunchKernel" and _launches() == before
    ig.kernels.fill(x, 4.0)  # the refused launch left the array usable
    assert _launches() == before + 1 and (x.to_numpy() == 4.0).all()


@pytest.mark.gpu
def test_gpu_fresh_thread_and_sanitizer():
    x = ig.empty(4096, "float32")
    ig.kernels.fill(x, 0.0)
    ig.Device(0).synchronize()
    out = []

    def work():
        for v in (1.0, 2.0, 3.0):
            ig.kernels.fill(x, v)
        out.append(x.to_numpy().copy())

    before = _launches()
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert (out[0] == 3.0).all()
    assert _launches() >= before + 2  # the first may make the context current through the backend
    before = _launches()
    with ig.sanitizer.enabled():
        ig.kernels.fill(x, 5.0)
        y = ig.empty_like(x)
        ig.kernels.copy(y, x)
        assert (y.to_numpy() == 5.0).all()
    assert _launches() == before + 2
