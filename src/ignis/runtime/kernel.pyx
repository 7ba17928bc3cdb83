"""Kernels with declared access (``launch`` lives in the array layer, ``ignis.array.launch``).

A ``Kernel`` is CUDA C source (compiled with NVRTC on the cuda backend, once
per device, context generation and source) plus a ``host_impl`` that the
emulated backend runs over the same arguments. Each launch argument is
declared in ``access``:

- an array argument: ``Access.READ`` / ``WRITE`` / ``READ_WRITE`` (or
  "read" / "write" / "read_write"), optionally with the byte range it
  touches: ``(Access.WRITE, lambda *args: (start, stop))`` relative to the
  array's first byte (default: the whole array);
- a scalar argument: its dtype (``"int64"``, ``"float32"``, ...).

``launch`` checks everything first (the preflight of seeds/004: an array in
a resource that cannot track cross-stream use refuses the launch before any
work is queued; a declared range outside the array is an OutOfBoundsError),
then does ``prepare_block_use`` for every array, queues the kernel, and
``finish_block_use``. In ``host_impl`` an array argument is a ``RawPtr``:
``p[i]`` and ``p[a:b]`` address elements relative to the pointer as C does
(negative indices are before it); leaving the underlying allocation is the
emulator's illegal address, which fails the stream like a faulting kernel.

Compiled (typed fields in ``kernel.pxd``): the launch's parameters are packed
here, once per launch, into a C buffer (``Kernel.pack``: one 8-byte slot per
argument, the value as its declared C type in the slot's first bytes; an
array passes its device address). On the cuda backend the common case goes
straight to the driver's ``cuLaunchKernel`` with that buffer and the GIL
released, through a C entry point of ``ignis.backends._cudriver`` that calls
the driver's own function (the backend's ``direct_calls()``, which also decides
which launches may go direct); every other case goes through the backend's ``kernel_launch`` with
the same bytes as ctypes values (``Kernel.marshal``), so its errors are the
backend's.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_IsTrue
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from .. import dtypes as _dt
from .._types import Access
from ..errors import UnsupportedError
from .stream cimport Stream
from ..backends.direct cimport DirectCalls

if TYPE_CHECKING:
    from .device import Device

cdef extern from "Python.h":
    void *PyLong_AsVoidPtr(object) except? NULL
    unsigned long long PyLong_AsUnsignedLongLongMask(object) except? <unsigned long long>-1
    double PyFloat_AsDouble(object) except? -1.0
    double PyFloat_AS_DOUBLE(object) noexcept

__all__ = ["Kernel", "RawPtr", "SCALAR_CTYPES"]

SCALAR_CTYPES = _CTYPES = {"int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "int16": ctypes.c_int16, "uint16": ctypes.c_uint16,
           "int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64,
           "uint64": ctypes.c_uint64, "float32": ctypes.c_float, "float64": ctypes.c_double,
           "bool": ctypes.c_bool}

# The C type of each parameter in the packed buffer, as ``struct`` letters: "P" a pointer
# (an array argument), then one per scalar dtype of SCALAR_CTYPES.
_CODES = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
          "uint64": "Q", "float32": "f", "float64": "d", "bool": "?"}
cdef enum:
    _SMALL = 16  # parameters packed on the stack; a launch with more allocates its buffer


# -- the direct driver launch --------------------------------------------------------
# On a backend with direct driver calls (``backend.direct_calls()``, a typed
# ``ignis.backends.direct.DirectCalls``), a launch whose stream the backend lets go direct
# (``launch_target``: its own table, gates and current context decide) of a kernel whose
# CUfunction is known, with every dimension a C unsigned int, goes straight to the driver
# with the GIL released through its cuLaunchKernel entry point. Everything else, and a
# launch the driver refuses there (it is then made again, to raise the backend's error),
# goes through the backend's ``kernel_launch``.

cdef unsigned long long _n_launch = 0
cdef object _dc_backend = None     # the backend the direct calls below are its (bound once per backend)
cdef DirectCalls _dc = None


cdef DirectCalls _direct(object backend):
    """The direct calls of ``backend`` (asked once, then while it stays the one in use), or None."""
    global _dc, _dc_backend
    if _dc_backend is not backend:
        try:
            found = backend.direct_calls()
        except Exception:  # noqa: BLE001 - a backend without them: its kernel_launch only
            found = None
        _dc = found if isinstance(found, DirectCalls) else None
        _dc_backend = backend
    return _dc


cdef inline bint _dim(object v, unsigned int *out) except -1:
    """``v`` as a C unsigned int for the driver; False where it is not one (the backend's
    method then takes the launch, and raises what it raises)."""
    if type(v) is not int or not 0 <= v <= 0xFFFFFFFF:
        return False
    out[0] = <unsigned int>PyLong_AsUnsignedLongLongMask(v)
    return True


def driver_calls() -> dict[str, int]:
    """The kernel launches queued straight to the driver (the cuda backend's direct
    path, ``Kernel``'s compiled launch) since the process started; launches made
    through the backend's ``kernel_launch`` are not in it.

    Returns:
        ``{"kernel_launch": n}``.
    """
    return {"kernel_launch": _n_launch}


class RawPtr:
    """A typed pointer into emulated device memory, for ``host_impl``.

    ``launch`` passes one for each array argument of a kernel run on the emulated
    backend, pointing at the array's first element and typed by its dtype.
    ``p[i]`` reads or writes one element, ``p[a:b]`` is a NumPy view of elements
    ``[a, b)`` (assignable: ``p[0:n] = ...``); indices are relative to the pointer
    as in C, so negative ones address memory before it. Reaching outside the
    underlying allocation raises ``IndexError`` ("illegal address"), which fails
    the stream like a faulting kernel. ``p[a:b]`` needs ``b``.

    Args:
        buf: the whole allocation, as a uint8 NumPy array.
        byte_offset: where the pointer points, in bytes from the allocation's start.
        dtype: the element type (a NumPy dtype or anything ``np.dtype`` takes).

    Attributes:
        dtype: the NumPy dtype of the elements.
    """

    __slots__ = ("_buf", "_off", "dtype")

    def __init__(self, buf: np.ndarray, byte_offset: int, dtype: np.dtype) -> None:
        self._buf = buf          # the whole allocation, uint8
        self._off = byte_offset  # where the pointer points
        self.dtype = np.dtype(dtype)

    def _range(self, start: int, stop: int) -> np.ndarray:
        size = self.dtype.itemsize
        lo = self._off + start * size
        hi = self._off + stop * size
        if lo < 0 or hi > self._buf.nbytes or hi < lo:
            raise IndexError(f"illegal address: elements [{start}, {stop}) of a {self.dtype} pointer reach bytes "
                             f"[{lo}, {hi}) of a {self._buf.nbytes}-byte allocation")
        return self._buf[lo:hi].view(self.dtype)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            if key.step not in (None, 1):
                return self._range(key.start or 0, key.stop)[::key.step]
            return self._range(key.start or 0, key.stop)
        return self._range(key, key + 1)[0]

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice):
            self._range(key.start or 0, key.stop)[:] = value
        else:
            self._range(key, key + 1)[0] = value


cdef class Kernel:
    """A device function with a declared access for each argument.

    A Kernel is CUDA C source, compiled with NVRTC on the cuda backend, plus an
    optional NumPy ``host_impl`` that the emulated backend runs instead. Either
    may be left out, but not both; a launch on a backend whose half is missing
    raises ``UnsupportedError``. Run it with ``ig.launch(kernel, grid, block,
    *args)``, which checks the arguments against ``access`` and makes each array
    argument a tracked use.

    ``access`` has one entry per kernel argument, in order:

    - an array argument: what the kernel does to its bytes, ``Access.READ``,
      ``Access.WRITE`` or ``Access.READ_WRITE`` (or the strings ``"read"``,
      ``"write"``, ``"read_write"``). ``launch`` then passes the array's device
      address, queues the waits the access needs on the launch stream (under
      ``auto`` ordering), and records the use after queuing the kernel. By default
      the use covers the whole array. ``(access, byte_range)`` narrows it:
      ``byte_range`` is called with the launch's arguments (arrays as ``NvArray``,
      scalars as given) and returns ``(start, stop)`` in bytes from the array's
      first byte; ``launch`` refuses a range outside the array
      (``OutOfBoundsError``), and the sanitizer checks races on that range only.
    - a scalar argument: its dtype, one of ``int8``, ``uint8``, ``int16``,
      ``uint16``, ``int32``, ``uint32``, ``int64``, ``uint64``, ``float32``,
      ``float64``, ``bool`` (a name, an ``ig.DType`` or a NumPy type; see
      ``SCALAR_CTYPES``). The value is passed as that C type.

    On the cuda backend the source is compiled at the first launch on each device
    and context generation, and cached (a rebuilt context compiles again). On the
    emulated backend ``host_impl`` is called once per launch, on the stream's
    worker thread when the stream reaches it, with a ``RawPtr`` for each array
    argument and each scalar converted to its NumPy type. It is not given the grid,
    block or shared memory size: it does the whole launch's work in one call. An
    exception in it fails the stream like a faulting kernel.

    Args:
        source: CUDA C source defining the ``extern "C" __global__`` function ``name``;
            None for a kernel that runs only on the emulated backend.
        name: the name of that function (required with ``source``); without ``source``
            it defaults to ``host_impl.__name__``.
        access: one declaration per kernel argument, as above.
        host_impl: ``host_impl(*args)``, the emulated backend's implementation; None for a
            kernel that runs only on a GPU.
        options: extra NVRTC options (e.g. ``("-use_fast_math",)``), after the
            ``--gpu-architecture`` of the device and ``--std=c++17`` that Ignis passes.

    Attributes:
        source: the CUDA C source, or None.
        name: the kernel's name (the function's, or ``host_impl``'s), used in errors and reports.
        host_impl: the emulated implementation, or None.
        options: the extra NVRTC options, a tuple.
        nargs: the number of arguments ``launch`` expects.
        array_args: the indices of the array arguments.

    Raises:
        ValueError: neither ``source`` nor ``host_impl``; ``source`` without ``name``; an
            ``access`` entry that is None, neither an access nor a dtype, a dtype that
            cannot be passed to a kernel (``float16``, ``bfloat16``...), or a byte range
            that is not callable. The message names the argument's index.

    Example::

        src = r'''
        extern "C" __global__ void scale(float* y, const float* x, float a, long long n) {
            long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
            if (i < n) y[i] = a * x[i];
        }'''

        def scale_host(y, x, a, n):            # the emulator's version: all of it at once
            y[0:int(n)] = a * x[0:int(n)]

        scale = ig.Kernel(src, "scale", access=(ig.Access.WRITE, ig.Access.READ, "float32", "int64"),
                          host_impl=scale_host)
        x, y = ig.ones(1000), ig.empty(1000)
        ig.launch(scale, (1000 + 255) // 256, 256, y, x, 2.0, 1000)

        # Only the first n elements are touched: say so, and launch checks it.
        n_bytes = lambda y, x, a, n: (0, n * 4)
        scale_n = ig.Kernel(src, "scale", access=((ig.Access.WRITE, n_bytes), (ig.Access.READ, n_bytes),
                                                  "float32", "int64"), host_impl=scale_host)
        # ig.launch(scale_n, 4, 256, y, x, 2.0, 2000) raises OutOfBoundsError: 8000 bytes of 4000
    """

    def __init__(self, source: str | None = None, name: str | None = None, access: Sequence[Any] = (),
                 host_impl: Callable[..., None] | None = None, options: Sequence[str] = ()) -> None:
        if source is None and host_impl is None:
            raise ValueError("a Kernel needs CUDA source (for the cuda backend) and/or a host_impl "
                             "(for the emulated backend)")
        if source is not None and not name:
            raise ValueError("a Kernel with source needs the name of its extern \"C\" __global__ function")
        self.source = source
        self.name = name or getattr(host_impl, "__name__", "kernel")
        self.host_impl = host_impl
        self.options = tuple(options)
        self.specs = [self._parse(i, a) for i, a in enumerate(access)]
        self.nargs = len(self.specs)
        self.array_args = tuple(i for i, sp in enumerate(self.specs) if sp[0] == "array")
        # (index, access, byte range or None) of each array argument, for launch's preflight
        self.plan = tuple((i, sp[1], sp[2]) for i, sp in enumerate(self.specs) if sp[0] == "array")
        # ctypes type per argument (arrays pass their pointer): ``marshal``'s values, and the
        # conversion of a scalar that ``pack`` does not convert itself
        self.param_types = tuple((ctypes.c_void_p, True) if sp[0] == "array" else (_CTYPES[sp[1].name], False)
                                 for sp in self.specs)
        # the C type of each parameter in the packed buffer (one letter each, see _CODES)
        self._codes = "".join("P" if sp[0] == "array" else _CODES[sp[1].name] for sp in self.specs).encode()
        self._last = None  # (device, generation, function, its driver address or 0) of the last launch
        self._compiled = {}  # (id(device), ordinal, generation) -> function
        self._lock = threading.Lock()

    @staticmethod
    def _parse(i: int, spec: Any) -> tuple[str, Any, Any]:
        rng = None
        if isinstance(spec, tuple):
            spec, rng = spec
            if not callable(rng):
                raise ValueError(f"argument {i}: the byte range must be a callable (*args) -> (start, stop)")
        if isinstance(spec, Access):
            return ("array", spec, rng)
        if isinstance(spec, str) and spec.lower().replace("-", "_") in ("read", "write", "read_write"):
            return ("array", Access.parse(spec), rng)
        if spec is None:  # not a default: a kernel's scalar type must be said
            raise ValueError(f"argument {i} is declared None; declare an access (Access.READ / WRITE / "
                             f"READ_WRITE) for an array or a scalar dtype ({', '.join(_CTYPES)})")
        try:
            dt = _dt.dtype(spec)
        except ValueError:
            raise ValueError(f"argument {i}: {spec!r} is neither an access (Access.READ / WRITE / READ_WRITE) "
                             f"nor a scalar dtype ({', '.join(_CTYPES)})") from None
        if dt.name not in _CTYPES:
            raise ValueError(f"argument {i}: scalar dtype {dt.name} cannot be passed to a kernel; "
                             f"use one of {', '.join(_CTYPES)}")
        return ("scalar", dt, None)

    def _function(self, device: "Device") -> Any:
        """The compiled function for ``device`` (compiled at the first call per device and
        context generation); remembered, with its driver address, as ``_last``."""
        last = self._last
        if last is not None and last[0] is device and last[1] == device.state.generation:
            return last[2]
        key = (id(device), device.ordinal, device.state.generation)
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    if self.source is None:
                        raise UnsupportedError(f"kernel {self.name!r} without CUDA source", device.backend.name,
                                               "give the Kernel its source= for GPUs")
                    fn = self._compiled[key] = device.backend.kernel_compile(
                        device.ordinal, self.source, self.name, self.options)
        try:  # the driver's CUfunction handle, for the direct launch (0: the backend's method only)
            addr = int(fn)
        except Exception:  # noqa: BLE001 - a backend whose functions are not driver handles
            addr = 0
        self._last = (device, device.state.generation, fn, addr if type(addr) is int and addr > 0 else 0)
        return fn

    # -- the launch's parameters ------------------------------------------------
    def pack(self, *args: Any) -> bytes:
        """The launch's parameter buffer for ``args``, as the driver is given it: one
        8-byte slot per argument, holding the value as its declared C type in the slot's
        first bytes (little-endian on the machines CUDA runs on), the rest zero. An array
        argument passes its device address (``_ptr``), an 8-byte pointer.

        Conversions are ctypes' (``SCALAR_CTYPES``): integers keep their low bits (no
        overflow check: -1 as ``uint8`` is 255), floats round to the C type, ``bool`` is
        the value's truth. A Python ``int``, ``float`` or ``bool`` is converted here as
        ctypes converts it; any other value (a NumPy scalar, an object with
        ``__index__`` or ``__float__``) by the ctypes type itself.

        Args:
            *args: one value per ``access`` declaration, as ``launch`` takes them.

        Raises:
            TypeError: the argument count differs from the declarations, or a value that
                the declared C type does not take (ctypes' message: a float for an
                integer type, a str for a float type...).
            OverflowError: an int too large for a float type.
            AttributeError: an array argument that is not an ``NvArray``.
        """
        cdef uint64_t slots[_SMALL]
        cdef uint64_t *buf = slots
        cdef Py_ssize_t n = self.nargs
        if len(args) != n:
            raise TypeError(f"kernel {self.name} declares {n} argument(s), got {len(args)}")
        if n > _SMALL:
            buf = <uint64_t *>PyMem_Malloc(n * sizeof(uint64_t))
            if buf == NULL:
                raise MemoryError()
        try:
            self._pack(args, buf)
            return (<char *>buf)[:n * sizeof(uint64_t)]
        finally:
            if buf != slots:
                PyMem_Free(buf)

    def marshal(self, *args: Any) -> list:
        """The launch's parameters as ctypes values, one per argument (``c_void_p`` for an
        array, the ``SCALAR_CTYPES`` type of a scalar): what the backend's
        ``kernel_launch`` takes. Made from ``pack``'s bytes, so the values and errors
        are the same as the direct launch's.

        Args:
            *args: one value per ``access`` declaration, as ``launch`` takes them.

        Raises:
            TypeError, OverflowError, AttributeError: as ``pack``.
        """
        data = self.pack(*args)
        return [ctor.from_buffer_copy(data, 8 * i) for i, (ctor, _) in enumerate(self.param_types)]

    cdef int _pack(self, tuple args, uint64_t *slots) except -1:
        """Write ``args`` into ``slots`` (``nargs`` of them): see ``pack``."""
        cdef const char *codes = self._codes
        cdef Py_ssize_t i
        cdef char c
        cdef double d
        cdef unsigned long long u
        cdef uint64_t *slot
        for i in range(self.nargs):
            v = args[i]
            c = codes[i]
            slot = slots + i
            slot[0] = 0
            if c == b"P":
                v = v._ptr
            elif c == b"f" or c == b"d":
                tv = type(v)
                if tv is float:
                    d = PyFloat_AS_DOUBLE(v)
                elif tv is int:
                    d = PyFloat_AsDouble(v)  # what ctypes calls: OverflowError for an int beyond a double
                else:
                    self._pack_slow(i, v, slot)
                    continue
                if c == b"f":
                    (<float *>slot)[0] = <float>d
                else:
                    (<double *>slot)[0] = d
                continue
            elif c == b"?":
                tv = type(v)
                if tv is bool or tv is int or tv is float:
                    (<uint8_t *>slot)[0] = 1 if PyObject_IsTrue(v) else 0
                else:
                    self._pack_slow(i, v, slot)
                continue
            tv = type(v)
            if tv is not int and tv is not bool:
                self._pack_slow(i, v, slot)
                continue
            u = PyLong_AsUnsignedLongLongMask(v)  # ctypes' conversion: the low bits, never an overflow
            if c == b"b" or c == b"B":
                (<uint8_t *>slot)[0] = <uint8_t>u
            elif c == b"h" or c == b"H":
                (<uint16_t *>slot)[0] = <uint16_t>u
            elif c == b"i" or c == b"I":
                (<uint32_t *>slot)[0] = <uint32_t>u
            else:  # q, Q, P
                slot[0] = <uint64_t>u
        return 0

    cdef int _pack_slow(self, Py_ssize_t i, object value, uint64_t *slot) except -1:
        """Argument ``i`` converted by its ctypes type (its conversion and its errors), into ``slot``."""
        cdef bytes data = bytes((<tuple>self.param_types[i])[0](value))
        cdef Py_ssize_t size = len(data)
        memcpy(slot, <const char *>data, size if size < 8 else 8)
        return 0

    # -- the launch ----------------------------------------------------------
    cdef int _queue(self, object device, Stream stream, tuple grid, tuple block, object shared_mem,
                    tuple args) except -1:
        """Queue this kernel on ``stream`` (of ``device``, checked open and current by the
        caller) with ``args`` (checked by the caller's preflight): straight to the driver
        where the cuda backend allows it (see "the direct driver launch" above), else
        through the backend's ``kernel_launch``. Compiles the kernel at its first launch
        on the device and context generation."""
        global _n_launch
        cdef DirectCalls q
        cdef uint64_t slots_s[_SMALL]
        cdef void *params_s[_SMALL]
        cdef uint64_t *slots = slots_s
        cdef void **params = params_s
        cdef unsigned int d[7]
        cdef void *f
        cdef void *st
        cdef int r = 1
        cdef Py_ssize_t i, n = self.nargs
        last = self._last
        if last is None or (<tuple>last)[0] is not device or (<tuple>last)[1] != device.state.generation:
            self._function(device)
            last = self._last
        fn = (<tuple>last)[2]
        backend = device.backend
        q = _direct(backend)
        h = stream.handle
        if q is not None and (<tuple>last)[3]:
            sr = q.launch_target(h)  # keeps the driver's stream object alive while the GIL is released
            if sr is not None \
                    and _dim(grid[0], d) and _dim(grid[1], d + 1) and _dim(grid[2], d + 2) \
                    and _dim(block[0], d + 3) and _dim(block[1], d + 4) and _dim(block[2], d + 5) \
                    and _dim(shared_mem, d + 6):
                if n > _SMALL:
                    slots = <uint64_t *>PyMem_Malloc(n * sizeof(uint64_t))
                    params = <void **>PyMem_Malloc(n * sizeof(void *))
                    if slots == NULL or params == NULL:
                        PyMem_Free(slots)
                        PyMem_Free(params)
                        raise MemoryError()
                try:
                    self._pack(args, slots)
                    for i in range(n):
                        params[i] = slots + i
                    f = PyLong_AsVoidPtr((<tuple>last)[3])
                    st = PyLong_AsVoidPtr(h)
                    with nogil:
                        r = q.launch_fn(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], st, params, NULL)
                finally:
                    if slots != slots_s:
                        PyMem_Free(slots)
                        PyMem_Free(params)
                if r == 0:
                    _n_launch += 1
                    return 0
                # refused: the backend's method makes the same launch, and raises its error
        backend.kernel_launch(fn, grid, block, shared_mem, h, self.marshal(*args))
        return 0

    def __repr__(self) -> str:
        return f"<ignis.Kernel {self.name} args={len(self.specs)}>"
