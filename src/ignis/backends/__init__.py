"""Backend selection.

``IGNIS_BACKEND=auto|cuda|emulated`` (default ``auto``): ``auto`` takes the
``cuda`` backend when a driver and at least one device answer, otherwise the
``emulated`` one, and says which once on stderr. The choice is made once per
process, on first use; ``set_backend`` replaces it (tests, the CLI).
"""

from __future__ import annotations

import os
import sys
import threading

from .base import CU_STATUS, OPS, Backend, DeviceProperties, driver_error

__all__ = ["Backend", "DeviceProperties", "CU_STATUS", "OPS", "driver_error",
           "get_backend", "set_backend", "backend_name"]

_backend: Backend | None = None
_lock = threading.Lock()
_VALID = ("auto", "cuda", "emulated")


def _make(name: str) -> Backend:
    if name == "emulated":
        from .emulated import EmulatedBackend
        return EmulatedBackend()
    if name == "cuda":
        from .cuda import CudaBackend
        return CudaBackend()
    raise ValueError(f"unknown backend {name!r}; valid: {', '.join(_VALID)} (IGNIS_BACKEND)")


def _auto() -> Backend:
    try:
        from .cuda import CudaBackend
        backend = CudaBackend()
        if backend.device_count() > 0:
            print("ignis: using the cuda backend (IGNIS_BACKEND=auto)", file=sys.stderr)
            return backend
        reason = "no CUDA device"
    except Exception as exc:  # no driver library, no device, driver too old
        reason = f"no usable CUDA driver ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    print(f"ignis: {reason}; using the emulated backend (IGNIS_BACKEND=auto)", file=sys.stderr)
    return _make("emulated")


def get_backend() -> Backend:
    """The process's backend, chosen on first call."""
    global _backend
    b = _backend
    if b is not None:
        return b
    with _lock:
        if _backend is None:
            name = os.environ.get("IGNIS_BACKEND", "auto").strip().lower() or "auto"
            if name not in _VALID:
                raise ValueError(f"IGNIS_BACKEND={name!r} is not valid; use one of {', '.join(_VALID)}")
            _backend = _auto() if name == "auto" else _make(name)
        return _backend


def set_backend(backend: Backend | str) -> Backend:
    """Replace the process's backend (by name or instance). Objects made on the
    previous backend must not be used afterwards."""
    global _backend
    with _lock:
        _backend = _make(backend) if isinstance(backend, str) else backend
        return _backend


def backend_name() -> str:
    """``"cuda"`` or ``"emulated"``."""
    return get_backend().name
