"""Arrays (layer 4): NvArray and its factories.

``ig.asarray`` and ``ig.from_dlpack``, which adopt other libraries' memory, are
the interop layer's (``ignis.interop``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from .launch import launch
from .nvarray import NvArray, drain_deferred, empty
from . import dlpack_export  # noqa: F401  (binds NvArray's DLPack and CUDA-array-interface export)

__all__ = ["NvArray", "launch", "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
           "full_like", "from_numpy", "synchronize"]


def zeros(shape: Any, dtype: Any = _dt.float32, **kw: Any) -> NvArray:
    """An array of zeros (a device memset), ordered on the array's stream.

    Args:
        shape: an int or a sequence of non-negative ints.
        dtype: anything ``ig.dtype`` resolves (default float32).
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor).

    Raises:
        ValueError: a bad shape or an unknown dtype.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    return empty(shape, dtype, **kw).zero_()


def ones(shape: Any, dtype: Any = _dt.float32, **kw: Any) -> NvArray:
    """An array of ones (filled on the device), ordered on the array's stream.

    Args:
        shape: an int or a sequence of non-negative ints.
        dtype: anything ``ig.dtype`` resolves (default float32).
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor).

    Raises:
        ValueError: a bad shape or an unknown dtype.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    return empty(shape, dtype, **kw).fill_(1)


def full(shape: Any, value: Any, dtype: Any = _dt.float32, **kw: Any) -> NvArray:
    """An array with every element equal to ``value`` (filled on the device).

    Args:
        shape: an int or a sequence of non-negative ints.
        value: one scalar, converted to ``dtype`` as NumPy converts it.
        dtype: anything ``ig.dtype`` resolves (default float32).
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor).

    Raises:
        TypeError: ``value`` is not a scalar.
        ValueError: a bad shape or an unknown dtype.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    return empty(shape, dtype, **kw).fill_(value)


def _like(a: NvArray, dtype: Any, kw: dict) -> tuple[tuple[int, ...], Any, dict]:
    if not isinstance(a, NvArray):
        raise TypeError(f"expected an NvArray to take the shape of, got {type(a).__name__}")
    if "stream" not in kw and "device" not in kw:
        kw["stream"] = a.stream
    return a.shape, a.dtype if dtype is None else dtype, kw


def empty_like(a: NvArray, dtype: Any = None, **kw: Any) -> NvArray:
    """An uninitialized array with ``a``'s shape, dtype (unless given), device and stream.

    Args:
        a: the ``NvArray`` to take the shape (and dtype) of.
        dtype: the dtype, or None for ``a``'s.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor). Giving ``device`` or ``stream`` replaces ``a``'s stream.

    Raises:
        TypeError: ``a`` is not an NvArray.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    shape, dt, kw = _like(a, dtype, kw)
    return empty(shape, dt, **kw)


def zeros_like(a: NvArray, dtype: Any = None, **kw: Any) -> NvArray:
    """Zeros with ``a``'s shape, dtype (unless given), device and stream.

    Args:
        a: the ``NvArray`` to take the shape (and dtype) of.
        dtype: the dtype, or None for ``a``'s.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor). Giving ``device`` or ``stream`` replaces ``a``'s stream.

    Raises:
        TypeError: ``a`` is not an NvArray.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    shape, dt, kw = _like(a, dtype, kw)
    return zeros(shape, dt, **kw)


def ones_like(a: NvArray, dtype: Any = None, **kw: Any) -> NvArray:
    """Ones with ``a``'s shape, dtype (unless given), device and stream.

    Args:
        a: the ``NvArray`` to take the shape (and dtype) of.
        dtype: the dtype, or None for ``a``'s.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor). Giving ``device`` or ``stream`` replaces ``a``'s stream.

    Raises:
        TypeError: ``a`` is not an NvArray.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    shape, dt, kw = _like(a, dtype, kw)
    return ones(shape, dt, **kw)


def full_like(a: NvArray, value: Any, dtype: Any = None, **kw: Any) -> NvArray:
    """``value`` everywhere, with ``a``'s shape, dtype (unless given), device and stream.

    Args:
        a: the ``NvArray`` to take the shape (and dtype) of.
        value: one scalar, converted to the dtype as NumPy converts it.
        dtype: the dtype, or None for ``a``'s.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor). Giving ``device`` or ``stream`` replaces ``a``'s stream.

    Raises:
        TypeError: ``a`` is not an NvArray, or ``value`` is not a scalar.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
    """
    shape, dt, kw = _like(a, dtype, kw)
    return full(shape, value, dt, **kw)


def synchronize(device: Any = None) -> None:
    """Wait on the host until all work queued on ``device`` (default: the current device) has finished.

    First, the memory of arrays that the cyclic garbage collector freed goes back to its
    resources (the collector defers it to a safe point: this is one, as are the next array
    creation and free), so the resources' figures are true afterwards.

    Args:
        device: an ``ig.Device`` or ordinal; None for the current device.

    Raises:
        StaleHandleError: the device is shutting down.
        DriverError: queued work failed (the driver's error for it).
    """
    from ..runtime import Device, current_device
    drain_deferred()
    (current_device() if device is None else Device(device)).synchronize()


def from_numpy(a: np.ndarray, *, dtype: Any = None, **kw: Any) -> NvArray:
    """Copy a NumPy array (any layout) to a new device array of the same shape.

    Args:
        a: a NumPy array, or anything ``np.asarray`` accepts.
        dtype: the device array's dtype (values converted as NumPy converts them); None
            keeps ``a``'s.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor).

    Raises:
        ValueError: ``a``'s dtype (or ``dtype``) is not one Ignis knows.
        OutOfMemoryError: the resource cannot get the memory (the rest as ``ig.empty``).
        DriverError: the copy failed; the new array is freed first.
    """
    a = np.asarray(a)
    dt = _dt.dtype(a.dtype if dtype is None else dtype)
    out = NvArray(a.shape, dt, **kw)
    try:
        out.from_host(a)
    except BaseException:
        out.free()
        raise
    return out
