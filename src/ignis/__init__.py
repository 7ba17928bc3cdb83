"""Ignis: a memory-safe GPU buffer runtime for Python."""

from __future__ import annotations

from . import dtypes, errors
from .backends import backend_name, get_backend, set_backend
from .dtypes import DType, dtype
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .runtime import Device, DeviceState, Event, Stream, device_count
from . import memory
from .memory import *  # noqa: F401,F403
from .memory import __all__ as _memory_all
from .safety import DEFAULT_OWNER, GpuRef, MemoryContract, contract, owners, register_owner
from .array import NvArray, asarray, empty, from_dlpack, from_numpy, full, zeros
from . import interop

__version__ = "0.1.0"

__all__ = ["__version__", "backend_name", "get_backend", "set_backend", "dtypes", "errors",
           "DType", "dtype", "Device", "DeviceState", "Event", "Stream", "device_count",
           "memory", "interop", "MemoryContract", "contract", "register_owner", "owners", "DEFAULT_OWNER",
           "GpuRef", "NvArray", "empty", "zeros", "full", "from_numpy", "asarray", "from_dlpack",
           *_errors_all, *_memory_all]
