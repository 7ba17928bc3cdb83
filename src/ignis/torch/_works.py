"""``Work.is_completed()`` as the host synchronization it is.

An asynchronous collective's ``Work`` answers ``is_completed()`` by asking its end
event (``cudaEventQuery``), which PyTorch's GPU trace does not report. A ``True``
tells the host that the collective has finished on the device: what the program
queues after it, on any stream, runs after the collective, so a program that polls
``is_completed()`` and then uses the buffers without ``wait()`` is correct.

``add_listener(fn)`` wraps ``torch._C._distributed_c10d.Work.is_completed`` (once,
for every listener) so that each ``True`` answer calls ``fn(work)``;
``remove_listener(fn)`` puts the original back when the last listener leaves. A
``False`` answer orders nothing. Where this PyTorch has no ``torch.distributed``,
or its ``Work`` cannot be wrapped, nothing is installed and ``installed()`` is
False.
"""

from __future__ import annotations

from typing import Any, Callable

from ._tap import MethodTap, when_true

__all__ = ["add_listener", "remove_listener", "installed", "work_class"]


_work: Any = None  # the Work class, once found (each collective's end asks for it)


def work_class() -> Any:
    """``torch._C._distributed_c10d.Work``, or None where this PyTorch has none."""
    global _work
    if _work is not None:
        return _work
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return None
        from torch._C._distributed_c10d import Work
    except Exception:  # (a build without distributed support)
        return None
    _work = Work  # (only a class found is kept: an import that failed is asked again)
    return Work


_tap = MethodTap(work_class, "is_completed", when_true)
_is_completed = _tap.wrapper


def add_listener(fn: Callable[[Any], None]) -> bool:
    """Call ``fn(work)`` whenever a ``Work.is_completed()`` returns True; returns whether the
    wrapper is installed."""
    return _tap.add(fn)


def remove_listener(fn: Callable[[Any], None]) -> None:
    """Forget ``fn``; the last listener gone, ``Work.is_completed`` is PyTorch's again."""
    _tap.remove(fn)


def installed() -> bool:
    """Whether ``Work.is_completed`` is wrapped now."""
    return _tap.installed()
