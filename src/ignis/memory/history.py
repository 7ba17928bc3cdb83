"""The hook through which allocation events reach telemetry.

Resources call ``recorder(action, resource, ptr, size, stream, block)`` when
``recorder`` is set (telemetry installs one with ``set_recorder``); when it
is ``None`` the cost is one C field test. The slot itself is
``ignis.memory.hooks``'s; this module names it for its callers. Actions, after PyTorch's memory
snapshot vocabulary: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom``.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

from . import hooks as _hooks

__all__ = ["recorder", "set_recorder"]

Recorder = Callable[[str, Any, int, int, Any, Any], None]


def set_recorder(fn: Recorder | None) -> Recorder | None:
    """Install (or with None remove) the allocation-event recorder; returns the previous one."""
    return _hooks.set_recorder(fn)


class _ReadOnlyHook(types.ModuleType):
    """This module, refusing assignments to ``recorder`` (it reads the hook slot: an assignment
    would shadow it and change nothing the resources see)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "recorder":
            raise AttributeError("ignis.memory.history.recorder is read-only: install a recorder with "
                                 "history.set_recorder")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ReadOnlyHook


def __getattr__(name: str) -> Any:
    if name == "recorder":  # the installed recorder, or None
        return _hooks.HOOKS.recorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
