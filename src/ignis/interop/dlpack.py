"""DLPack and the CUDA array interface: import, in pure Python (ctypes).

Import (``from_dlpack``): the producer is asked to order its work before our
stream; the capsule is consumed, and the resulting non-owning array keeps the
producer's memory alive and calls its deleter when it dies. Only contiguous
tensors are adopted. ``__cuda_array_interface__`` objects are adopted too.

Export (``NvArray.__dlpack__``, ``__dlpack_device__``,
``__cuda_array_interface__``) is the array layer's: ``ignis.array.dlpack_export``,
whose ``export``, ``device_of`` and ``cuda_array_interface`` are re-exported here.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from .. import dtypes as _dt
from .._dlpack import FLAG_READ_ONLY as _FLAG_READ_ONLY
from .._dlpack import LEGACY as _LEGACY
from .._dlpack import VERSIONED as _VERSIONED
from .._dlpack import DLManagedTensor as _DLManagedTensor
from .._dlpack import DLManagedTensorVersioned as _DLManagedTensorVersioned
from .._dlpack import capsule_get_pointer as _PyCapsule_GetPointer
from .._dlpack import capsule_is_valid as _PyCapsule_IsValid
from .._dlpack import capsule_set_name as _PyCapsule_SetName
from ..array.dlpack_export import KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, cuda_array_interface, device_of, export
from ..errors import UnsupportedError
from ..runtime import Device, Stream, current_device

if TYPE_CHECKING:
    from ..array import NvArray

__all__ = ["export", "device_of", "from_dlpack", "cuda_array_interface", "KDL_CPU", "KDL_CUDA"]


class _Imported:
    """Keeps a consumed DLPack tensor's producer alive; calls its deleter on death."""

    __slots__ = ("managed", "owner")

    def __init__(self, managed: Any, owner: Any) -> None:
        self.managed = managed
        self.owner = owner

    def __del__(self) -> None:
        m = self.managed
        if m is not None:
            self.managed = None
            try:
                if m.deleter:
                    m.deleter(ctypes.addressof(m))
            except Exception:
                pass


def from_dlpack(x: Any, *, stream: Stream | None = None, owner: str = "compute") -> "NvArray":
    """Adopt ``x``'s memory without copying (a non-owning array that keeps ``x`` alive).

    The producer is asked (the DLPack stream handshake) to order its pending work
    before ``stream``. A producer that marks its tensor read-only (DLPack 1.x's flag: a
    non-writeable NumPy array, a read-only mapping) gives a read-only array: every write
    to it raises ``ReadOnlyError``. Objects with only ``__cuda_array_interface__`` are
    adopted on the current device. An ``NvArray`` is returned as it is. ``ig.from_dlpack``
    is this function.

    Args:
        x: an object with ``__dlpack__`` (or ``__cuda_array_interface__``); an ``NvArray``
            is returned as it is, once checked (not freed, not stale).
        stream: the new array's stream, the one the producer orders its work before;
            None: the device's default stream.
        owner: the new array's owner name (default ``"compute"``).

    Raises:
        TypeError: ``x`` has neither protocol, or gave a capsule that is not DLPack's.
        ValueError: the tensor is not contiguous, not on a CUDA device (on the cuda
            backend), or of a dtype Ignis does not know.
        UnsupportedError: on the emulated backend, a tensor that is not in host memory.
        UseAfterFreeError: ``x`` is an ``NvArray`` that was freed.
        StaleHandleError: ``x`` is an ``NvArray`` made before a context rebuild, or the device
            is shut down.
    """
    from ..array import NvArray

    if isinstance(x, NvArray):
        x.check_usable("adopt")  # freed, or made before a context rebuild: refused, not passed on
        return x
    if not hasattr(x, "__dlpack__"):
        if hasattr(x, "__cuda_array_interface__"):
            return _from_cai(x, owner)
        raise TypeError(f"from_dlpack needs an object with __dlpack__ (or __cuda_array_interface__), "
                        f"got {type(x).__name__}")
    dev_type, dev_id = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (KDL_CUDA, 0)
    dev_type, dev_id = int(dev_type), int(dev_id)
    from ..backends import get_backend
    backend = get_backend()
    if backend.host_memory:  # device memory is host memory: adopt CPU tensors
        if dev_type not in (KDL_CPU, KDL_CUDA_HOST):
            raise UnsupportedError(f"importing DLPack device type {dev_type}", backend.name,
                                   "this backend adopts CPU tensors only")
        device = current_device()
        device.check_usable("adopt an array")
        kwargs: dict[str, Any] = {}
    else:
        if dev_type != KDL_CUDA:
            raise ValueError(f"from_dlpack: the tensor lives on DLPack device type {dev_type}, not on a CUDA "
                             "device; copy it with ig.from_numpy / ig.asarray instead")
        device = Device(dev_id)
        device.check_usable("adopt an array")
        kwargs = {"stream": (stream if stream is not None else device.default_stream).handle}
    try:
        capsule = x.__dlpack__(max_version=(1, 1), **kwargs)
    except TypeError:
        try:
            capsule = x.__dlpack__(**kwargs)
        except TypeError:
            capsule = x.__dlpack__()
            if not backend.host_memory:
                device.synchronize()
    readonly = False
    if _PyCapsule_IsValid(capsule, _VERSIONED):
        managed: Any = _DLManagedTensorVersioned.from_address(_PyCapsule_GetPointer(capsule, _VERSIONED))
        used = b"used_dltensor_versioned"
        readonly = bool(managed.flags & _FLAG_READ_ONLY)
    elif _PyCapsule_IsValid(capsule, _LEGACY):
        managed = _DLManagedTensor.from_address(_PyCapsule_GetPointer(capsule, _LEGACY))
        used = b"used_dltensor"
    else:
        raise TypeError("from_dlpack: the producer returned a capsule that is not a DLPack tensor")
    t = managed.dl_tensor
    keep = _Imported(managed, x)
    _PyCapsule_SetName(capsule, used)
    ndim = t.ndim
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    dt = _dt.from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    if t.strides and ndim:
        expect, acc = [], 1
        for d in reversed(shape):
            expect.append(acc)
            acc *= d
        got = [int(t.strides[i]) for i in range(ndim)]
        if any(g != e for g, e, d in zip(got, reversed(expect), shape) if d > 1):
            raise ValueError(f"from_dlpack: only contiguous tensors can be adopted (strides {got} for shape "
                             f"{shape}); make it contiguous first")
    nbytes = dt.itemsize
    for d in shape:
        nbytes *= d
    data = (t.data or 0) + t.byte_offset
    if backend.host_memory and nbytes:
        ptr, adopted = backend.adopt_host_memory(device.ordinal, data, nbytes)
        if adopted:
            keep = _EmuAdopted(keep, backend, device.ordinal, ptr)
    else:
        ptr = data
    s = stream if stream is not None else device.default_stream
    out = NvArray.from_foreign(ptr, shape, dt, device, s, owner=owner, keepalive=keep)
    if readonly:
        out.mark_read_only(f"the {type(x).__name__} it was imported from is read-only (DLPack's read-only flag)")
    return out


class _EmuAdopted:
    """Releases host memory adopted into the emulator when the array dies."""

    __slots__ = ("inner", "backend", "ordinal", "ptr")

    def __init__(self, inner: Any, backend: Any, ordinal: int, ptr: int) -> None:
        self.inner, self.backend, self.ordinal, self.ptr = inner, backend, ordinal, ptr

    def __del__(self) -> None:
        try:
            self.backend.release_host_memory(self.ordinal, self.ptr)
        except Exception:
            pass


def _from_cai(x: Any, owner: str) -> "NvArray":
    from ..array import NvArray

    cai = x.__cuda_array_interface__
    if cai.get("strides") not in (None, ()):
        raise ValueError("from_dlpack: only contiguous __cuda_array_interface__ arrays can be adopted")
    import numpy as np
    dt = _dt.dtype(np.dtype(cai["typestr"]))
    ptr = int(cai["data"][0])
    shape = tuple(int(d) for d in cai["shape"])
    device = current_device()  # the interface names no device: CUDA's current one, as CuPy takes it
    device.check_usable("adopt an array")
    s = device.default_stream
    if cai.get("stream") not in (None, -1, 1, 2):
        ev = device.backend.event_create(device.ordinal, False)
        device.backend.event_record(ev, int(cai["stream"]))
        device.backend.stream_wait_event(s.handle, ev)
        device.backend.event_destroy(ev)
    out = NvArray.from_foreign(ptr, shape, dt, device, s, owner=owner, keepalive=x)
    if cai["data"][1]:
        out.mark_read_only(f"the {type(x).__name__} it was imported from is read-only "
                           "(__cuda_array_interface__ data flag)")
    return out
