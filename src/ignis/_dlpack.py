"""The DLPack ABI (dlpack.h, versions 0.8 and 1.x) as ctypes structures, and the capsule calls
that export and import need: shared by ``ignis.array.dlpack_export`` (``NvArray.__dlpack__``)
and ``ignis.interop.dlpack`` (``from_dlpack``). Foundation: imports nothing of Ignis.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLPackVersion", "DLManagedTensorVersioned",
           "DELETER", "FLAG_READ_ONLY", "LEGACY", "VERSIONED", "capsule_new", "capsule_get_pointer",
           "capsule_is_valid", "capsule_set_name"]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


FLAG_READ_ONLY = 1
LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"


def _api(name: str, restype: Any, *argtypes: Any) -> Any:
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


capsule_new = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
capsule_get_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
capsule_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
capsule_set_name = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
