"""PyTorch's memory functions answered by Ignis's telemetry, under the guard.

Under a pluggable allocator ``torch.cuda.memory_stats`` and the functions built on
it (memory_allocated, max_memory_allocated, memory_reserved, memory_summary, ...)
raise. When the guard is PyTorch's allocator (``ignis.torch.use_guard`` with
``patch_memory_stats``, the default) they answer with Ignis's statistics of the
guard, and the snapshot functions with Ignis's snapshot (PyTorch's memory viewer
format). This is telemetry's work, a layer above the front end: importing this
module leaves ``torch_memory_views`` in ``ignis.torch.memory_views`` (importing
``ignis.torch`` imports no PyTorch), and the guard installs what it returns.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import torch as _front_end
from ..runtime import Device
from ..memory import guard_front
from .snapshot import dump_snapshot, record_memory_history, snapshot
from .stats import memory_stats, memory_summary, reset_peak_stats

__all__ = ["guard_memory_stats", "torch_memory_views"]


def guard_memory_stats(device: "Device | int" = 0) -> dict[str, int]:
    """Ignis's statistics for the guard of ``device`` (PyTorch's key layout), with the
    guard's own numbers (``guard.*``: live user bytes, quarantine, checks); the device's
    statistics while it has no guard."""
    ordinal = device.ordinal if isinstance(device, Device) else int(device)
    g = guard_front.guards().get(ordinal)
    if g is None:
        return memory_stats(device)
    out = memory_stats(resource=g)
    out.update(guard_front.guard_stats(ordinal) or {})
    return out


def torch_memory_views(torch: Any) -> dict[str, Callable[..., Any]]:
    """The replacements of ``torch.cuda.memory``'s functions, by name, for the guard to install."""
    guard_resource = guard_front.guard_resource

    def index(device: Any) -> int:
        if device is None:
            return torch.cuda.current_device()
        return torch.cuda._utils._get_device_index(device, optional=True)

    def t_memory_stats(device: Any = None) -> dict[str, Any]:
        return dict(sorted(guard_memory_stats(index(device)).items()))

    def t_reset_peak_memory_stats(device: Any = None) -> None:
        reset_peak_stats(resource=guard_resource(index(device)))

    def t_memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        return memory_summary(resource=guard_resource(index(device)), abbreviated=abbreviated)

    def t_snapshot(*_a: Any, **_k: Any) -> dict[str, Any]:
        return snapshot()

    def t_dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
        dump_snapshot(filename)

    def t_record_memory_history(enabled: Any = "all", *_a: Any, **_k: Any) -> None:
        record_memory_history(enabled not in (None, False))

    return {"memory_stats": t_memory_stats, "reset_peak_memory_stats": t_reset_peak_memory_stats,
            "memory_summary": t_memory_summary, "_snapshot": t_snapshot, "memory_snapshot": t_snapshot,
            "_dump_snapshot": t_dump_snapshot, "_record_memory_history": t_record_memory_history}


_front_end.memory_views = torch_memory_views
