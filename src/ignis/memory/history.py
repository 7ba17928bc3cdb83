"""The hook through which allocation events reach telemetry.

Resources call ``recorder(action, resource, ptr, size, stream, block)`` when
``recorder`` is set (telemetry installs one with ``set_recorder``); when it
is ``None`` the cost is one attribute test. Actions, after PyTorch's memory
snapshot vocabulary: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom``.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["recorder", "set_recorder"]

Recorder = Callable[[str, Any, int, int, Any, Any], None]
recorder: Recorder | None = None


def set_recorder(fn: Recorder | None) -> Recorder | None:
    """Install (or with None remove) the allocation-event recorder; returns the previous one."""
    global recorder
    prev, recorder = recorder, fn
    return prev
