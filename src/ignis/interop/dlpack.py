"""DLPack and the CUDA array interface, in pure Python (ctypes).

Export (``NvArray.__dlpack__``): a legacy ``"dltensor"`` capsule whose
manager context keeps the array alive until the consumer calls the deleter
(or the capsule dies unconsumed). The stream handshake is honoured: the
consumer's stream is made to wait for the array's pending writes, recorded
as a tracked use, so no host synchronization is needed. On the emulated
backend the tensor is a CPU tensor at the emulator's host address, so NumPy
imports it zero-copy.

Import (``from_dlpack``): the producer is asked to order its work before our
stream; the capsule is consumed, and the resulting non-owning array keeps the
producer's memory alive and calls its deleter when it dies. Only contiguous
tensors are adopted.
"""

from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Any

from .. import dtypes as _dt
from ..errors import UnsupportedError
from ..memory import Access
from ..runtime import Device, Stream, current_device

if TYPE_CHECKING:
    from ..array import NvArray

__all__ = ["export", "device_of", "from_dlpack", "cuda_array_interface", "KDL_CPU", "KDL_CUDA"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_FLAG_READ_ONLY = 1
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"


def _api(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_PyCapsule_New = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_PyCapsule_GetPointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_PyCapsule_IsValid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_PyCapsule_SetName = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# The capsule destructor gets a borrowed pointer to a capsule being destroyed:
# these variants take it as a raw address (never touching its refcount).
_RawIsValid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_RawGetPointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Exported tensors not yet deleted: struct address -> (struct, shape array, array).
# Single dict operations, atomic under the GIL: the deleter may run on any thread.
_exports: dict[int, tuple[Any, Any, Any]] = {}


def _immortal(obj: Any) -> Any:
    """Keep ``obj`` for the life of the process (one reference that is never given back)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


# The deleter and capsule destructor are function pointers that foreign code calls
# whenever it drops what it imported -- also during the interpreter's final garbage
# collection, after this module's globals are cleared. Where ignis._speedups is built
# they are C functions; otherwise ctypes callbacks that are never freed, that reach
# nothing through this module's globals, and that do nothing once the interpreter is
# finalizing (the process is ending; its memory goes with it).
def _delete_impl(addr: int, _pop: Any = _exports.pop, _finalizing: Any = sys.is_finalizing) -> None:
    if not _finalizing():
        _pop(addr, None)


def _capsule_destructor_impl(capsule: int, _valid: Any = _RawIsValid, _get: Any = _RawGetPointer,
                             _pop: Any = _exports.pop, _finalizing: Any = sys.is_finalizing,
                             _names: tuple = (_LEGACY, _VERSIONED)) -> None:
    # A capsule nobody consumed (its name unchanged) must run the producer's deleter.
    if _finalizing():
        return
    for name in _names:
        if _valid(capsule, name):
            _pop(_get(capsule, name), None)
            return


def _native_callbacks() -> tuple[Any, Any]:
    from ..memory import pool as _pool
    sp = _pool._speedups
    if sp is not None:
        deleter, destructor = sp.dlpack_setup(_exports)
        return _DELETER(deleter), ctypes.c_void_p(destructor)
    callback = _immortal(_CAPSULE_DESTRUCTOR(_capsule_destructor_impl))
    return _immortal(_DELETER(_delete_impl)), ctypes.cast(callback, ctypes.c_void_p)


_delete, _capsule_destructor = _native_callbacks()


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
    from ..array.nvarray import _Export
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
        a._begin(s, acc, "DLPack export")
        a._end(s, acc)
        s.synchronize()
        data = a.device.backend.host_address(a._ptr) if a.nbytes else 0
    else:
        consumer = _consumer_stream(a, stream)
        if consumer is None and stream != -1:
            consumer = a.stream
            a._begin(consumer, acc, "DLPack export")
            a._end(consumer, acc)
            consumer.synchronize()  # a legacy-default-stream consumer: only a host sync orders it
        elif consumer is not None:
            a._begin(consumer, acc, "DLPack export")
            a._end(consumer, acc)
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
    """Adopt a DLPack-capable object's memory as a non-owning NvArray (zero-copy). A
    producer that marks its tensor read-only (DLPack 1.x's flag: a non-writeable NumPy
    array, a read-only mapping) gives a read-only array: every write to it raises
    ``ReadOnlyError``."""
    from ..array import NvArray
    from ..array.nvarray import _ReadOnly

    if isinstance(x, NvArray):
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
        kwargs: dict[str, Any] = {}
    else:
        if dev_type != KDL_CUDA:
            raise ValueError(f"from_dlpack: the tensor lives on DLPack device type {dev_type}, not on a CUDA "
                             "device; copy it with ig.from_numpy / ig.asarray instead")
        device = Device(dev_id)
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
    out = NvArray._wrap(shape, dt, device, s, ptr, None, None, owner, keepalive=keep)
    if readonly:
        out._gate = _ReadOnly(f"the {type(x).__name__} it was imported from is read-only (DLPack's read-only flag)")
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
    s = device.default_stream
    if cai.get("stream") not in (None, -1, 1, 2):
        ev = device.backend.event_create(device.ordinal, False)
        device.backend.event_record(ev, int(cai["stream"]))
        device.backend.stream_wait_event(s.handle, ev)
        device.backend.event_destroy(ev)
    out = NvArray._wrap(shape, dt, device, s, ptr, None, None, owner, keepalive=x)
    if cai["data"][1]:
        from ..array.nvarray import _ReadOnly
        out._gate = _ReadOnly(f"the {type(x).__name__} it was imported from is read-only "
                              "(__cuda_array_interface__ data flag)")
    return out


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
    from ..array.nvarray import _CAI
    if not a.device.backend.cuda_driver:
        raise AttributeError(f"__cuda_array_interface__ is CUDA-only; the {a.device.backend.name} backend exports "
                             "through __dlpack__ (a CPU tensor) instead")
    a._check_live("export through __cuda_array_interface__")
    readonly = a.readonly
    acc = Access.READ if readonly else Access.READ_WRITE
    s = a.stream
    a._begin(s, acc, "__cuda_array_interface__ export")
    a._end(s, acc)
    a._add_export(_CAI)
    return {"shape": a.shape, "typestr": a.dtype.numpy.str, "data": (a._ptr, readonly), "version": 3,
            "strides": None, "stream": s.handle}
