"""Backend selection.

``IGNIS_BACKEND=auto|cuda|emulated`` (default ``auto``): ``auto`` takes the
``cuda`` backend when a driver and at least one device answer, otherwise the
``emulated`` one, and says which once on stderr. The choice is made once per
process, on first use; ``set_backend`` replaces it (tests, the CLI).

Fork: a child made by ``fork()`` (multiprocessing's default start method on
Linux) after the parent used a backend cannot use it: the emulator's stream
threads and the CUDA driver's contexts do not survive a fork, and work queued
there would wait forever. An at-fork handler marks such a backend in the
child, so ``get_backend()`` and every operation of objects inherited from the
parent raise ``ForkedProcessError`` (which says to use the ``spawn`` or
``forkserver`` start method) instead of hanging. A child of a parent that only
imported Ignis, or never touched a device, uses Ignis normally; so does a
child that only imports it. ``set_backend`` in the child starts afresh.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable

from . import base as _base
from .base import CU_STATUS, OPS, Backend, DeviceProperties, driver_error

__all__ = ["Backend", "DeviceProperties", "CU_STATUS", "OPS", "driver_error",
           "get_backend", "set_backend", "backend_name", "on_backend_change"]

_backend: Backend | None = None
_lock = threading.Lock()
_listeners: list = []  # called after set_backend replaced the backend (on_backend_change)
_VALID = ("auto", "cuda", "emulated")


def _make(name: str) -> Backend:
    if name == "emulated":
        from .emulated import EmulatedBackend
        return EmulatedBackend()
    if name == "cuda":
        from .cuda import CudaBackend
        return CudaBackend()
    raise ValueError(f"unknown backend {name!r}; valid: {', '.join(_VALID)} (IGNIS_BACKEND)")


auto_fallback: str | None = None  # why IGNIS_BACKEND=auto took the emulator (`ignis doctor` shows it)


def _auto() -> Backend:
    global auto_fallback
    try:
        from .cuda import CudaBackend
        backend = CudaBackend()
        if backend.device_count() > 0:
            print("ignis: using the cuda backend (IGNIS_BACKEND=auto)", file=sys.stderr)
            return backend
        reason = auto_fallback = "no CUDA device"
    except Exception as exc:  # no driver library, no device, driver too old, a part not built
        if isinstance(exc, ImportError) and exc.name == "ignis.backends._cudriver":
            reason = "the cuda backend is not built here (ignis.backends._cudriver is missing)"
        else:
            reason = "no usable CUDA driver"
        auto_fallback = f"{reason}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    print(f"ignis: {reason}; using the emulated backend (`ignis doctor` says why; IGNIS_BACKEND chooses)",
          file=sys.stderr)
    return _make("emulated")


def get_backend() -> Backend:
    """The process's backend, chosen on first call."""
    global _backend
    b = _backend
    if b is not None:
        if b._forked_from is not None:
            raise b.forked_error("use Ignis")
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
        _backend = b = _make(backend) if isinstance(backend, str) else backend
        for fn in tuple(_listeners):
            fn()
        return b


def on_backend_change(fn: "Callable[[], None]") -> None:
    """Call ``fn()`` each time ``set_backend`` replaces the process's backend (caches of
    objects made on the old one drop them there). ``fn`` runs under this module's lock: it
    must not call back into it.

    Args:
        fn: a function of no arguments.
    """
    if not callable(fn):
        raise TypeError(f"on_backend_change takes a function, not {type(fn).__name__}")
    _listeners.append(fn)


def backend_name() -> str:
    """``"cuda"`` or ``"emulated"``."""
    return get_backend().name


def _after_fork_in_child() -> None:
    """os.register_at_fork(after_in_child=...): a lock held by a parent thread at the
    fork stays held in the child, so replace it; mark every backend the parent used
    (the process's, and any other made here, e.g. by set_backend)."""
    global _lock
    _lock = threading.Lock()
    parent = os.getppid()
    for b in list(_base._instances):
        try:
            if b._forked_from is None and b.fork_unsafe():
                b.mark_forked(parent)
        except Exception:  # noqa: BLE001 - a half-built backend: nothing to mark
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
