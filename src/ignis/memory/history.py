"""The hook through which allocation events reach telemetry.

Resources call ``recorder(action, resource, ptr, size, stream, block)`` when
``recorder`` is set (telemetry installs one with ``set_recorder``); when it
is ``None`` the cost is one C field test. The slot itself is
``ignis.memory.hooks``'s; this module names it for its callers. Actions, after PyTorch's memory
snapshot vocabulary: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom``.
"""

from __future__ import annotations

from typing import Any, Callable

from . import hooks as _hooks

__all__ = ["recorder", "set_recorder"]

Recorder = Callable[[str, Any, int, int, Any, Any], None]


def set_recorder(fn: Recorder | None) -> Recorder | None:
    """Install (or with None remove) the allocation-event recorder; returns the previous one."""
    return _hooks.set_recorder(fn)


_hooks.refuse_assignment(__name__, {"recorder": "install a recorder with history.set_recorder"})


def __getattr__(name: str) -> Any:
    if name == "recorder":  # the installed recorder, or None
        return _hooks.HOOKS.recorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
