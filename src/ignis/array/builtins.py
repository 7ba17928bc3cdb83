"""Built-in kernels: fill, copy, strided gather, axpy.

Each is a real CUDA kernel (grid-stride loop, compiled once per device) with a
NumPy ``host_impl`` for the emulated backend, launched through ``launch`` so
every use is tracked. fill / copy / gather move element bits and work for
every dtype; axpy is for float32 and float64. They double as the kernels the
bug zoo and the sanitizer tests use.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from .._types import Access
from ..runtime import Kernel, Stream
from .launch import launch
from .nvarray import NvArray

__all__ = ["fill", "copy", "gather", "axpy", "kernel"]


def __dir__() -> list[str]:
    # ``ig.kernels`` is this module: its namespace is the kernels, not what it imports
    return sorted(__all__)

_BITS = {1: ("unsigned char", "uint8"), 2: ("unsigned short", "uint16"), 4: ("unsigned int", "uint32"),
         8: ("unsigned long long", "uint64")}
_FLOAT = {"float32": "float", "float64": "double"}
_BLOCK = 256
_kernels: dict[tuple[str, str], Kernel] = {}
_lock = threading.Lock()

_LOOP = "for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; " \
        "i += (long long)gridDim.x * blockDim.x)"


def _grid(n: int) -> int:
    return max(1, min((n + _BLOCK - 1) // _BLOCK, 8192))


def _element(key: str) -> tuple[str, str, str]:
    """(C type, NumPy bits dtype, name) for ``key``: an item size ("4": named by the bits,
    ``uint32``) or a dtype name ("float32": named by the dtype, moved as its bits)."""
    if key.isdigit():
        ctype, bits = _BITS[int(key)]
        return ctype, bits, bits
    from ..dtypes import dtype
    dt = dtype(key)
    ctype, bits = _BITS[dt.itemsize]
    return ctype, bits, dt.name


def _make(op: str, key: str) -> Kernel:
    R, W, RW = Access.READ, Access.WRITE, Access.READ_WRITE
    if op == "fill":
        ctype, bits, label = _element(key)
        name = f"ignis_fill_{label}"
        src = f'extern "C" __global__ void {name}({ctype}* dst, {ctype} value, long long n) {{ {_LOOP} dst[i] = value; }}'

        def host(dst: Any, value: Any, n: Any) -> None:
            dst[0:int(n)].view(bits)[:] = value

        return Kernel(src, name, (W, bits, "int64"), host)  # always the whole array
    if op == "copy":
        ctype, bits, label = _element(key)
        name = f"ignis_copy_{label}"
        src = (f'extern "C" __global__ void {name}({ctype}* dst, const {ctype}* src, long long n) '
               f'{{ {_LOOP} dst[i] = src[i]; }}')

        def host(dst: Any, src_: Any, n: Any) -> None:
            dst[0:int(n)] = src_[0:int(n)]

        size = lambda d, s, n: (0, n * d.dtype.itemsize)  # noqa: E731
        return Kernel(src, name, ((W, size), (R, size), "int64"), host)
    if op == "gather":
        ctype, bits, label = _element(key)
        name = f"ignis_gather_{label}"
        src = (f'extern "C" __global__ void {name}({ctype}* dst, const {ctype}* src, long long n, '
               f'long long stride, long long offset) {{ {_LOOP} dst[i] = src[offset + i * stride]; }}')

        def host(dst: Any, src_: Any, n: Any, stride: Any, offset: Any) -> None:
            n, stride, offset = int(n), int(stride), int(offset)
            if n:
                dst[0:n] = src_[offset:offset + (n - 1) * stride + 1:stride]

        def src_range(d: NvArray, s: NvArray, n: int, stride: int, offset: int) -> tuple[int, int]:
            isz = s.dtype.itemsize
            return (offset * isz, (offset + (n - 1) * stride + 1) * isz) if n else (0, 0)

        return Kernel(src, name, ((W, lambda d, s, n, st, o: (0, n * d.dtype.itemsize)), (R, src_range),
                                  "int64", "int64", "int64"), host)
    if op == "axpy":
        ctype = _FLOAT[key]
        name = f"ignis_axpy_{key}"
        src = (f'extern "C" __global__ void {name}({ctype}* y, const {ctype}* x, {ctype} a, long long n) '
               f'{{ {_LOOP} y[i] = a * x[i] + y[i]; }}')

        def host(y: Any, x: Any, a: Any, n: Any) -> None:
            n = int(n)
            y[0:n] = a * x[0:n] + y[0:n]

        size = lambda y, x, a, n: (0, n * y.dtype.itemsize)  # noqa: E731
        return Kernel(src, name, ((RW, size), (R, size), key, "int64"), host)
    raise ValueError(f"unknown built-in kernel {op!r}")


def kernel(op: str, dtype_or_size: Any) -> Kernel:
    """The built-in ``Kernel`` for ``op``: "fill", "copy", "gather" by dtype (named for it in
    reports: ``ignis_fill_float32``) or by item size (named for its bits: ``ignis_fill_uint32``);
    "axpy" by float dtype name."""
    key = str(dtype_or_size) if isinstance(dtype_or_size, (int, str)) else getattr(dtype_or_size, "name",
                                                                                    str(dtype_or_size))
    k = _kernels.get((op, key))
    if k is None:
        with _lock:
            k = _kernels.get((op, key))
            if k is None:
                k = _kernels[(op, key)] = _make(op, key)
    return k


_fill_plans: dict[str, tuple[Kernel, dict]] = {}  # dtype name -> (fill kernel, value -> element bits)


def fill(dst: NvArray, value: Any, *, stream: Stream | None = None) -> NvArray:
    """Set every element of ``dst`` to ``value`` with a kernel."""
    dt = dst.dtype
    plan = _fill_plans.get(dt.name)
    if plan is None:
        plan = _fill_plans.setdefault(dt.name, (kernel("fill", dt.name), {}))
    k, cache = plan
    # 0.0 == -0.0 (and they hash alike) but their bits differ: a negative zero gets its own key
    key = value if value or type(value) is not float or math.copysign(1.0, value) > 0 else "-0.0"
    bits = cache.get(key)
    if bits is None:
        bits = np.array(value, dtype=dt.numpy).view(_BITS[dt.itemsize][1]).item()
        if len(cache) < 256:
            cache[key] = bits
    n = dst.numel
    grid = (n + _BLOCK - 1) // _BLOCK
    launch(k, grid if 0 < grid <= 8192 else (1 if grid < 1 else 8192), _BLOCK, dst, bits, n, stream=stream)
    return dst


def copy(dst: NvArray, src: NvArray, n: int | None = None, *, stream: Stream | None = None) -> NvArray:
    """Copy ``n`` elements (default: all of them: ``src`` and ``dst`` must have as many) from
    ``src`` to ``dst`` with a kernel, in flat (C) order.

    Raises:
        ValueError: element sizes differ; ``n`` is None and the arrays have different
            numbers of elements; ``n`` is negative or more than either array has.
    """
    if src.dtype.itemsize != dst.dtype.itemsize:
        raise ValueError(f"copy: element sizes differ ({src.dtype.name} -> {dst.dtype.name})")
    if n is None:
        if src.numel != dst.numel:
            raise ValueError(f"copy: the shapes do not match: dst {dst.shape} has {dst.numel} element(s), src "
                             f"{src.shape} has {src.numel}; pass n= to copy the first n elements")
        n = src.numel
    elif not 0 <= n <= min(src.numel, dst.numel):
        raise ValueError(f"copy: n={n} must be between 0 and the smaller array's size (dst {dst.shape}: "
                         f"{dst.numel} element(s), src {src.shape}: {src.numel})")
    launch(kernel("copy", dst.dtype.name), _grid(n), _BLOCK, dst, src, n, stream=stream)
    return dst


def gather(dst: NvArray, src: NvArray, stride: int, offset: int = 0, *, stream: Stream | None = None) -> NvArray:
    """``dst[i] = src[offset + i * stride]`` for every element of ``dst`` (a strided copy)."""
    if src.dtype.itemsize != dst.dtype.itemsize:
        raise ValueError(f"gather: element sizes differ ({src.dtype.name} -> {dst.dtype.name})")
    launch(kernel("gather", dst.dtype.name), _grid(dst.numel), _BLOCK, dst, src, dst.numel, stride, offset,
           stream=stream)
    return dst


def axpy(y: NvArray, x: NvArray, a: float, *, stream: Stream | None = None) -> NvArray:
    """``y = a * x + y`` (float32 / float64)."""
    if x.dtype is not y.dtype or y.dtype.name not in _FLOAT:
        raise ValueError(f"axpy needs x and y of the same float32 or float64 dtype, got {x.dtype.name}, "
                         f"{y.dtype.name}")
    if x.numel < y.numel:
        raise ValueError(f"axpy: x has {x.numel} elements, y has {y.numel}")
    launch(kernel("axpy", y.dtype.name), _grid(y.numel), _BLOCK, y, x, a, y.numel, stream=stream)
    return y
