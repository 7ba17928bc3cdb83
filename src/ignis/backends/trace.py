"""The trace registry (layer 0): observers of a backend's ordering operations.

A listener subscribes to a backend and hears, from the backend itself, each of
the operations that order work between streams and the host:

========================================  ==============================================================
``on_event_record(event, stream)``        ``event_record``, before the record is queued (so anything
                                          that can see the record already sees what the listener made of it)
``on_stream_wait_event(stream, event)``   ``stream_wait_event``, once it succeeded
``on_stream_synchronize(stream)``         ``stream_synchronize``, and a ``stream_query`` that answered True
``on_event_synchronize(event)``           ``event_synchronize``, and an ``event_query`` that answered True
``on_device_synchronize(ordinal)``        ``device_synchronize``
``on_stream_destroyed(stream)``           ``stream_destroy`` (a new stream may get the handle)
``on_event_destroyed(event)``             ``event_destroy``
========================================  ==============================================================

The sanitizer is such a listener (it keeps its vector clocks from them); front
ends feed it the same calls from their own library's trace callbacks.
``TraceListener`` has every method as a no-op, for listeners that want a few.

Rules:

- Nothing is patched: a backend's methods are the same objects whether or not
  anyone listens. Each traced operation tests its backend's listener list
  (``if self._trace:``); with no subscriber that one test is the whole cost.
- The list is per backend and changed in place (the memory layer's direct
  driver path holds it: that path queues records and waits without calling the
  backend's methods, so it stays off while anyone listens). A wrapping backend
  (``FaultInjectingBackend``) shares its inner backend's list: subscribing
  through either reaches the backend that does the work.
- A listener's exception propagates from the backend call that emitted it.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["TraceListener", "EVENTS", "subscribe", "unsubscribe", "listeners", "emit"]

# The methods a listener has, one per traced operation (see the module docstring).
EVENTS = ("on_event_record", "on_stream_wait_event", "on_stream_synchronize", "on_event_synchronize",
          "on_device_synchronize", "on_stream_destroyed", "on_event_destroyed")

_lock = threading.Lock()


class TraceListener:
    """A listener whose every trace method does nothing: subclass it and override the ones you need."""

    def on_event_record(self, event: int, stream: int) -> None:
        """``event`` is being recorded on ``stream`` (both driver handles)."""

    def on_stream_wait_event(self, stream: int, event: int) -> None:
        """``stream`` now waits for ``event``'s latest record."""

    def on_stream_synchronize(self, stream: int) -> None:
        """The host saw all work queued on ``stream`` finish."""

    def on_event_synchronize(self, event: int) -> None:
        """The host saw ``event``'s latest record reached."""

    def on_device_synchronize(self, ordinal: int | None = None) -> None:
        """The host saw all work of device ``ordinal`` finish."""

    def on_stream_destroyed(self, stream: int) -> None:
        """The stream handle ``stream`` was destroyed."""

    def on_event_destroyed(self, event: int) -> None:
        """The event handle ``event`` was destroyed."""


def _backend(backend: Any) -> Any:
    if backend is None:
        from . import get_backend
        return get_backend()
    if not isinstance(getattr(backend, "_trace", None), list):
        raise TypeError(f"expected an ignis backend, got {type(backend).__name__}")
    return backend


def subscribe(listener: Any, backend: Any = None) -> None:
    """Make ``listener`` hear the traced operations of ``backend`` (default: the process's).
    Subscribing a listener again changes nothing.

    Args:
        listener: an object with every method of ``EVENTS`` (a ``TraceListener`` has them all).
        backend: the backend to observe; None for ``get_backend()``.

    Raises:
        TypeError: ``listener`` lacks one of the methods, or ``backend`` is not a backend.
    """
    missing = [name for name in EVENTS if not callable(getattr(listener, name, None))]
    if missing:
        raise TypeError(f"a trace listener needs the methods {', '.join(EVENTS)}; {type(listener).__name__} "
                        f"lacks {', '.join(missing)} (subclass ignis.backends.trace.TraceListener)")
    b = _backend(backend)
    with _lock:
        if not any(x is listener for x in b._trace):
            b._trace.append(listener)


def unsubscribe(listener: Any, backend: Any = None) -> bool:
    """Stop ``listener`` hearing ``backend`` (default: the process's). Returns False when it was
    not subscribed.

    Args:
        listener: a listener given to ``subscribe``.
        backend: the backend it observes; None for ``get_backend()``.
    """
    b = _backend(backend)
    with _lock:
        for i, x in enumerate(b._trace):
            if x is listener:
                del b._trace[i]
                return True
    return False


def listeners(backend: Any = None) -> tuple:
    """The listeners subscribed to ``backend`` (default: the process's), in subscription order.

    Args:
        backend: the backend; None for ``get_backend()``.
    """
    return tuple(_backend(backend)._trace)


def emit(trace: list, name: str, *args: Any) -> None:
    """Call ``name(*args)`` on every listener of ``trace`` (a backend's ``_trace``). Backends
    call it only after ``if self._trace:``, so an unobserved operation never gets here.

    Args:
        trace: the backend's listener list.
        name: the listener method (one of ``EVENTS``).
        args: its arguments.
    """
    for listener in tuple(trace):
        getattr(listener, name)(*args)
