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
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .. import dtypes as _dt
from .._types import Access

if TYPE_CHECKING:
    from .device import Device

__all__ = ["Kernel", "RawPtr", "SCALAR_CTYPES"]

SCALAR_CTYPES = _CTYPES = {"int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "int16": ctypes.c_int16, "uint16": ctypes.c_uint16,
           "int32": ctypes.c_int32, "uint32": ctypes.c_uint32, "int64": ctypes.c_int64,
           "uint64": ctypes.c_uint64, "float32": ctypes.c_float, "float64": ctypes.c_double,
           "bool": ctypes.c_bool}


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


def _marshaller(param_types: tuple) -> Callable[..., list]:
    """A function of the launch arguments returning their ctypes values, written out for
    this signature (no per-launch loop): arrays pass ``_ptr``, scalars their value."""
    names = [f"a{i}" for i in range(len(param_types))]
    items = [f"c{i}({n}._ptr)" if is_array else f"c{i}({n})" for i, (n, (_, is_array)) in
             enumerate(zip(names, param_types))]
    env = {f"c{i}": ctor for i, (ctor, _) in enumerate(param_types)}
    exec(f"def marshal({', '.join(names)}):\n    return [{', '.join(items)}]\n", env)
    return env["marshal"]


class Kernel:
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
        # ctypes constructor per argument (arrays pass their pointer), for the launch's parameters
        self.param_types = tuple((ctypes.c_void_p, True) if sp[0] == "array" else (_CTYPES[sp[1].name], False)
                                 for sp in self.specs)
        self.marshal = _marshaller(self.param_types)  # (*args) -> the launch's ctypes parameters
        self._last: tuple | None = None  # (device, generation, function) of the last launch
        self._compiled: dict[tuple[int, int, int], int] = {}
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

    def _function(self, device: "Device") -> int:
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
                        from ..errors import UnsupportedError
                        raise UnsupportedError(f"kernel {self.name!r} without CUDA source", device.backend.name,
                                               "give the Kernel its source= for GPUs")
                    fn = self._compiled[key] = device.backend.kernel_compile(
                        device.ordinal, self.source, self.name, self.options)
        self._last = (device, device.state.generation, fn)
        return fn

    def __repr__(self) -> str:
        return f"<ignis.Kernel {self.name} args={len(self.specs)}>"
