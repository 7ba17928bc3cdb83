"""The one allocation-event recorder telemetry installs (``ignis.memory.history``).

Design: statistics and history each subscribe a function; the hook installs
the cheapest callable that reaches all of them (the function itself when
there is one, a fan-out when there are several), and nothing at all when none
is subscribed, so the allocation hot path pays nothing while telemetry is
off. A recorder that someone else installed before is kept and still called.

Rules: a subscriber must not take a resource's lock (pools report segment
events while holding theirs) and must not raise: an allocation that already
happened would otherwise look failed and leak. Each subscriber catches what
it raises itself (no wrapper frame on the hot path) and calls ``failed``,
which turns it off with a warning.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable

from ..memory import history as _history
from ..memory.hooks import HOOKS as _HOOKS

__all__ = ["subscribe", "unsubscribe", "subscribed", "failed"]

Recorder = Callable[[str, Any, int, int, Any, Any], None]

_subscribers: dict[str, Recorder] = {}
_installed: Recorder | None = None
_foreign: Recorder | None = None
_lock = threading.RLock()


def subscribe(name: str, fn: Recorder) -> None:
    """Route allocation events to ``fn`` under ``name`` (replacing a previous one)."""
    with _lock:
        _subscribers[name] = fn
        _reinstall()


def unsubscribe(name: str) -> None:
    with _lock:
        if _subscribers.pop(name, None) is not None:
            _reinstall()


def subscribed(name: str) -> bool:
    return name in _subscribers


def failed(name: str, error: BaseException) -> None:
    """What a subscriber calls when it raised: it is turned off, with a warning."""
    warnings.warn(f"ignis telemetry: the {name} recorder failed ({type(error).__name__}: {error}) and was "
                  "turned off", RuntimeWarning, stacklevel=3)
    unsubscribe(name)


def _reinstall() -> None:
    global _installed, _foreign
    current = _HOOKS.recorder
    if current is not _installed:
        _foreign = current  # installed by someone else since: keep calling it
    fns = [*_subscribers.values(), *([_foreign] if _foreign is not None else [])]
    new: Recorder | None
    if not fns:
        new = None
    elif len(fns) == 1:
        new = fns[0]
    elif len(fns) == 2:
        a, b = fns

        def new(action: str, resource: Any, ptr: int, size: int, stream: Any, block: Any) -> None:
            a(action, resource, ptr, size, stream, block)
            b(action, resource, ptr, size, stream, block)
    else:
        many = tuple(fns)

        def new(action: str, resource: Any, ptr: int, size: int, stream: Any, block: Any) -> None:
            for f in many:
                f(action, resource, ptr, size, stream, block)
    _installed = new
    _history.set_recorder(new)
