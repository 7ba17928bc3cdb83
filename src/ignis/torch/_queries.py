"""``Event.query()`` and ``Stream.query()`` as the host synchronizations they are.

A ``True`` from ``torch.cuda.Event.query()`` tells the host that everything the event's
record covers has finished on the device; from ``torch.cuda.Stream.query()``, that all the
stream's queued work has. PyTorch's GPU trace reports neither (it reports only the waiting
``synchronize()`` calls), so a program that polls ``query()`` until it answers True and then
reads a pinned buffer, or queues work on another stream without an event wait, is correct
but would look unordered.

``add_listeners(on_event, on_stream)`` wraps both methods (``_tap.MethodTap``, once for every
listener) so that each ``True`` answer calls ``on_event(event)`` / ``on_stream(stream)``;
``remove_listeners`` puts PyTorch's methods back when the last listener leaves. A ``False``
answer orders nothing. The device-generic ``torch.Event`` / ``torch.Stream`` are not wrapped:
they are built-in types of PyTorch's C extension, whose methods cannot be replaced (a program
polling those gets the synchronization told with ``synchronize()``, or an event wait).
"""

from __future__ import annotations

from typing import Any, Callable

from ._tap import MethodTap, when_true

__all__ = ["add_listeners", "remove_listeners", "installed"]


def _event_class() -> Any:
    import torch
    return getattr(torch.cuda, "Event", None)


def _stream_class() -> Any:
    import torch
    return getattr(torch.cuda, "Stream", None)


_event_tap = MethodTap(_event_class, "query", when_true)
_stream_tap = MethodTap(_stream_class, "query", when_true)


def add_listeners(on_event: Callable[[Any], None], on_stream: Callable[[Any], None]) -> bool:
    """Call ``on_event(event)`` whenever a ``torch.cuda.Event.query()`` returns True and
    ``on_stream(stream)`` whenever a ``torch.cuda.Stream.query()`` does; returns whether both
    wrappers are installed."""
    return _event_tap.add(on_event) & _stream_tap.add(on_stream)


def remove_listeners(on_event: Callable[[Any], None], on_stream: Callable[[Any], None]) -> None:
    """Forget the two; the last listener gone, the methods are PyTorch's again."""
    _event_tap.remove(on_event)
    _stream_tap.remove(on_stream)


def installed() -> bool:
    """Whether both methods are wrapped now."""
    return _event_tap.installed() and _stream_tap.installed()
