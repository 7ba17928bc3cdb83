"""Ignis: a memory-safe GPU buffer runtime for Python."""

from . import dtypes, errors
from .backends import backend_name, get_backend, set_backend
from .dtypes import DType, dtype
from .dtypes import (bfloat16, bool_, complex64, float8_e4m3fn, float8_e5m2, float16, float32, float64, int8,
                     int16, int32, int64, uint8, uint16, uint32, uint64)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .runtime import Device, DeviceState, Event, Stream, current_device, current_stream, device_count
from . import memory
from .memory import *  # noqa: F401,F403
from .memory import __all__ as _memory_all
from .safety import (DEFAULT_OWNER, GpuRef, MemoryContract, contract, get_ordering, ordering, owners,
                     register_owner, sanitizer, set_ordering)
from .array import (NvArray, empty, empty_like, from_numpy, full, full_like, launch, ones, ones_like, synchronize,
                    zeros, zeros_like)
from .array import builtins as kernels
from .runtime import Kernel, RawPtr
from . import interop
from .interop import asarray, from_dlpack
from . import io
from . import ipc
from . import collective
from . import telemetry
from .telemetry import dump_snapshot, memory_stats, memory_summary, plot_timeline, record_memory_history, reset_peak_stats, snapshot  # noqa: E501

from ._version import __version__

__all__ = ["__version__", "backend_name", "get_backend", "set_backend", "dtypes", "errors",
           "DType", "dtype", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
           "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64", "Device", "DeviceState", "Event", "Stream", "device_count", "current_device", "current_stream",
           "memory", "interop", "io", "ipc", "collective", "MemoryContract", "contract", "register_owner", "owners", "DEFAULT_OWNER",
           "GpuRef", "NvArray", "launch", "Kernel", "RawPtr", "kernels", "sanitizer", "ordering", "set_ordering",
           "get_ordering", "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like",
           "from_numpy", "asarray", "from_dlpack", "synchronize",
           "telemetry", "memory_stats", "memory_summary", "reset_peak_stats", "record_memory_history", "snapshot",
           "dump_snapshot", "plot_timeline",
           *_errors_all, *_memory_all]

import os as _os

if _os.environ.get("IGNIS_SANITIZE", "").strip() not in ("", "0"):
    sanitizer.enable(_os.environ.get("IGNIS_SANITIZE_MODE", "raise"))
    from .torch import _hook as _torch_hook  # PyTorch ops too, once the program imports torch
    _torch_hook.enable_on_import(_os.environ.get("IGNIS_SANITIZE_MODE", "raise"))
