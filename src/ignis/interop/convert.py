"""``asarray``: an NvArray for anything: itself, an adopted DLPack / CUDA array
interface object, or a copy of host data."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..array import NvArray, from_numpy
from .dlpack import from_dlpack

__all__ = ["asarray"]


def asarray(obj: Any, *, dtype: Any = None, **kw: Any) -> NvArray:
    """An NvArray for ``obj``: itself, a zero-copy adoption of a DLPack / CUDA array
    interface object, or a copy of host data (NumPy arrays, sequences, scalars).

    Args:
        obj: an ``NvArray``, an object with ``__dlpack__`` or ``__cuda_array_interface__``
            (adopted as ``ig.from_dlpack`` does, on its default stream), or host data.
        dtype: for host data, the device dtype; for an NvArray it must be the array's own
            (no conversion); ignored for adopted objects.
        **kw: ``device``, ``stream``, ``owner``, ``mr``, ``tag``, as for ``ig.empty`` (the
            ``NvArray`` constructor). Used for host data only.

    Raises:
        ValueError: ``dtype`` differs from an NvArray's dtype, or is unknown.
        TypeError: as ``ig.from_dlpack``, for an object it adopts.
        OutOfMemoryError: as ``ig.from_numpy``, for host data.
        UseAfterFreeError: ``obj`` is an ``NvArray`` that was freed.
        StaleHandleError: ``obj`` is an ``NvArray`` made before a context rebuild.
    """
    if isinstance(obj, NvArray):
        obj.check_usable("take as an array")  # freed, or made before a context rebuild: refused
        if dtype is not None and _dt.dtype(dtype) is not obj.dtype:
            raise ValueError(f"asarray: array is {obj.dtype.name}, not {_dt.dtype(dtype).name}; "
                             "dtype conversion needs a copy")
        return obj
    if not isinstance(obj, np.ndarray) and (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        return from_dlpack(obj)
    return from_numpy(np.asarray(obj, dtype=None if dtype is None else _dt.dtype(dtype).numpy), **kw)
