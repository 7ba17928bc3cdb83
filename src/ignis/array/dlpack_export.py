"""DLPack and CUDA-array-interface export of NvArrays (layer 4), in pure Python (ctypes).

``NvArray.__dlpack__``: a ``"dltensor"`` capsule (``"dltensor_versioned"`` when
the consumer asks for DLPack 1.x) whose manager context keeps the array alive
until the consumer calls the deleter (or the capsule dies unconsumed). The
export is counted on the array (``free()`` refuses while it lives). The stream
handshake is honoured: the consumer's stream is made to wait for the array's
pending writes, recorded as a tracked use (``NvArray.access``), so no host
synchronization is needed. On the emulated backend the tensor is a CPU tensor
at the emulator's host address, so NumPy imports it zero-copy.

``NvArray.__cuda_array_interface__``: version 3, with the array's stream.

The DLPack structures and capsule names are ``ignis._dlpack``'s (the ABI, which the import
side, ``ignis.interop.dlpack``, reads too). The deleter and the
capsule destructor are C functions of the compiled array module (``nvarray.pyx``).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from .._dlpack import DELETER as _DELETER
from .._dlpack import FLAG_READ_ONLY as _FLAG_READ_ONLY
from .._dlpack import LEGACY as _LEGACY
from .._dlpack import VERSIONED as _VERSIONED
from .._dlpack import DLDataType as _DLDataType
from .._dlpack import DLDevice as _DLDevice
from .._dlpack import DLManagedTensor as _DLManagedTensor
from .._dlpack import DLManagedTensorVersioned as _DLManagedTensorVersioned
from .._dlpack import DLPackVersion as _DLPackVersion
from .._dlpack import capsule_new as _PyCapsule_New
from ..errors import UnsupportedError
from ..memory import Access
from ..runtime import Stream
from .nvarray import _CAI, _Export, _dlpack_callbacks

if TYPE_CHECKING:
    from .nvarray import NvArray

__all__ = ["export", "device_of", "cuda_array_interface", "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3


# Exported tensors not yet deleted: struct address -> (struct, shape array, array).
# Single dict operations, atomic under the GIL: the deleter may run on any thread.
_exports: dict[int, tuple[Any, Any, Any]] = {}


# The deleter and capsule destructor are function pointers that foreign code calls
# whenever it drops what it imported -- on any thread, also during the interpreter's
# final garbage collection, after this module's globals are cleared: C functions of
# the compiled array module (ignis/array/nvarray.pyx), bound to ``_exports``.


def device_of(a: "NvArray") -> tuple[int, int]:
    """``(device_type, device_id)``: CPU where the backend's device memory is host memory
    (the emulator), else the CUDA device."""
    return (KDL_CPU, 0) if a.device.backend.host_memory else (KDL_CUDA, a.device.ordinal)


def _consumer_stream(a: "NvArray", stream: Any) -> Stream | None:
    """The consumer's stream as an ignis Stream, or None when no ordering is asked."""
    if stream is None or stream == -1:
        return None
    if isinstance(stream, Stream):
        return stream
    if isinstance(stream, int):
        if stream in (1, 2):  # legacy / per-thread default streams: order against the array's stream
            return None
        return Stream.from_handle(stream, a.device)
    handle = getattr(stream, "__cuda_stream__", None)
    if handle is not None:
        return Stream.from_handle(handle()[1], a.device)
    raise TypeError(f"__dlpack__(stream=...) expects an int stream handle, got {type(stream).__name__}")


def export(a: "NvArray", *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
           copy: Any = None) -> Any:
    """The ``__dlpack__`` protocol for an NvArray. The export is counted on the array (and
    its bases) until the consumer's deleter runs: ``free()`` refuses meanwhile, and a
    dropped array keeps its memory until then. Read-only memory is exported with DLPack's
    read-only flag, which a legacy (unversioned) capsule cannot carry, so that is refused."""
    a._check_live("export through DLPack")
    readonly = a.readonly
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    if readonly and not versioned:
        raise BufferError(f"NvArray#{a.id} is read-only, and a legacy DLPack capsule cannot say so; the consumer "
                          "must ask for DLPack 1.0 or newer (max_version), or export a writable clone()")
    acc = Access.READ if readonly else Access.READ_WRITE
    if copy:
        raise UnsupportedError("__dlpack__(copy=True)", a.device.backend.name, "call clone() first")
    dev_type, dev_id = device_of(a)
    if dl_device is not None and tuple(dl_device) != (dev_type, dev_id):
        raise UnsupportedError(f"export to DLPack device {tuple(dl_device)}", a.device.backend.name,
                               f"this array lives on {(dev_type, dev_id)}")
    if dev_type == KDL_CPU:
        if stream not in (None, -1):
            raise ValueError(f"the {a.device.backend.name} backend exports CPU tensors; DLPack requires "
                             "stream=None for them")
        # A CPU consumer reads at once: make the bytes current first.
        s = a.stream
        with a.access(s, acc, by=None, op="DLPack export"):
            pass
        s.synchronize()
        data = a.device.backend.host_address(a._ptr) if a.nbytes else 0
    else:
        consumer = _consumer_stream(a, stream)
        if consumer is None and stream != -1:
            consumer = a.stream
            with a.access(consumer, acc, by=None, op="DLPack export"):
                pass
            consumer.synchronize()  # a legacy-default-stream consumer: only a host sync orders it
        elif consumer is not None:
            with a.access(consumer, acc, by=None, op="DLPack export"):
                pass
        data = a._ptr
    ndim = a.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*a.shape)
    managed: Any = _DLManagedTensorVersioned() if versioned else _DLManagedTensor()
    t = managed.dl_tensor
    t.data = data
    t.device = _DLDevice(dev_type, dev_id)
    t.ndim = ndim
    code, bits, lanes = a.dtype.dlpack
    t.dtype = _DLDataType(code, bits, lanes)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = None
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    if versioned:
        managed.version = _DLPackVersion(1, 1)
        managed.flags = _FLAG_READ_ONLY if readonly else 0
    addr = ctypes.addressof(managed)
    token = _Export(a.id)
    _exports[addr] = (managed, shape, a, token)
    a._add_export(token)
    return _PyCapsule_New(addr, _VERSIONED if versioned else _LEGACY, _capsule_destructor)


def cuda_array_interface(a: "NvArray") -> dict[str, Any]:
    """``__cuda_array_interface__`` version 3, with the array's stream (the consumer
    must order its work after it, as the protocol says).

    The interface has no release signal, so Ignis cannot know when a consumer stops using
    the memory. The safe rule: once exported this way, ``free()`` retires the array (any
    later use through Ignis raises) but its memory goes back to the pool only when the
    array object itself is collected. Consumers (CuPy, PyTorch, Numba) keep the object
    alive for as long as they use its memory, so none of them can see it reused. A raw
    pointer taken from the interface and kept without the object is outside this rule:
    keep the array alive, or use DLPack, whose exports are counted."""
    if not a.device.backend.cuda_driver:
        raise AttributeError(f"__cuda_array_interface__ is CUDA-only; the {a.device.backend.name} backend exports "
                             "through __dlpack__ (a CPU tensor) instead")
    a._check_live("export through __cuda_array_interface__")
    readonly = a.readonly
    acc = Access.READ if readonly else Access.READ_WRITE
    s = a.stream
    with a.access(s, acc, by=None, op="__cuda_array_interface__ export"):
        pass
    a._add_export(_CAI)
    return {"shape": a.shape, "typestr": a.dtype.numpy.str, "data": (a._ptr, readonly), "version": 3,
            "strides": None, "stream": s.handle}


# Bound last, once the three functions exist: the array module's export methods call them.
def _native_callbacks() -> tuple[Any, Any]:
    deleter, destructor = _dlpack_callbacks(_exports, export, device_of, cuda_array_interface)
    return _DELETER(deleter), ctypes.c_void_p(destructor)


_delete, _capsule_destructor = _native_callbacks()
