"""``Event.query()`` and ``Stream.query()`` as the host synchronizations they are.

A ``True`` from ``torch.cuda.Event.query()`` tells the host that everything the event's
record covers has finished on the device; from ``torch.cuda.Stream.query()``, that all the
stream's queued work has. PyTorch's GPU trace reports neither (it reports only the waiting
``synchronize()`` calls), so a program that polls ``query()`` until it answers True and then
reads a pinned buffer, or queues work on another stream without an event wait, is correct
but would look unordered.

The same holds for the device-generic ``torch.Event`` and ``torch.Stream`` (what
``torch.accelerator`` hands out, and what device-agnostic programs poll); their ``query()``
reaches the device through PyTorch's device guard, which reports nothing either.

``add_listeners(on_event, on_stream)`` wraps the four methods (``_tap.MethodTap``, once for
every listener; the generic types' in their immutable type's dictionary, see ``_tap``) so
that each ``True`` answer calls ``on_event(event)`` / ``on_stream(stream)`` with the object
asked, of either kind; ``remove_listeners`` puts PyTorch's methods back when the last
listener leaves. A ``False`` answer orders nothing.
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


def _generic_event_class() -> Any:
    import torch
    return getattr(torch, "Event", None)


def _generic_stream_class() -> Any:
    import torch
    return getattr(torch, "Stream", None)


_event_tap = MethodTap(_event_class, "query", when_true)
_stream_tap = MethodTap(_stream_class, "query", when_true)
_generic_event_tap = MethodTap(_generic_event_class, "query", when_true)
_generic_stream_tap = MethodTap(_generic_stream_class, "query", when_true)


def add_listeners(on_event: Callable[[Any], None], on_stream: Callable[[Any], None]) -> bool:
    """Call ``on_event(event)`` whenever an ``Event.query()`` returns True and
    ``on_stream(stream)`` whenever a ``Stream.query()`` does (``torch.cuda``'s and the
    device-generic ones); returns whether all four wrappers are installed."""
    ok = _event_tap.add(on_event) & _stream_tap.add(on_stream)
    return _generic_event_tap.add(on_event) & _generic_stream_tap.add(on_stream) & ok


def remove_listeners(on_event: Callable[[Any], None], on_stream: Callable[[Any], None]) -> None:
    """Forget the two; the last listener gone, the methods are PyTorch's again."""
    for tap, fn in ((_event_tap, on_event), (_stream_tap, on_stream), (_generic_event_tap, on_event),
                    (_generic_stream_tap, on_stream)):
        tap.remove(fn)


def installed() -> bool:
    """Whether all four methods are wrapped now."""
    return all(t.installed() for t in (_event_tap, _stream_tap, _generic_event_tap, _generic_stream_tap))
