"""The current device and the current stream of each thread, as in PyTorch and CuPy.

- ``current_device()`` is the device that ``device=None`` means everywhere in
  Ignis: device 0 until the thread says otherwise, with ``with ig.Device(n):``
  (for the block) or ``ig.Device(n).set_current()`` (until changed).
- ``current_stream(device)`` is the stream that Ignis work on that device uses
  when given ``stream=None``: arrays made, copies and fills, launches. It is
  the device's default stream, or, inside ``with stream:``, that stream (which
  also makes its device current for the block, as ``torch.cuda.stream`` does).
  An array that was given a stream at creation keeps using it unless a
  ``with stream:`` block of this thread says otherwise.
- Both are per thread: a new thread starts on device 0 and default streams.

Fast paths read one process-wide counter, ``overrides[0]``, before anything
thread-local: while no thread has a current device other than 0 or a current
stream, it is 0 and the defaults cannot have changed. Layers above register
``on_first_override`` hooks to drop what they cached for the no-override case.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream

__all__ = ["current_device", "current_stream", "overrides", "on_first_override", "register_device_type",
           "as_device", "is_device"]

overrides = [0]  # how many overrides (a current device other than 0, or a current stream) are active
lock = threading.Lock()  # held while the count changes and while a layer refills a cache for count 0
_hooks: list[Callable[[], None]] = []
_tls = threading.local()
_Device: Any = None  # ig.Device, which ``ignis.runtime.device`` registers at import (register_device_type)


def register_device_type(cls: type) -> None:
    """Called once, by ``ignis.runtime.device`` at import: the class every ``device``
    argument is (the modules below it, streams and events, take devices without importing it)."""
    global _Device
    _Device = cls


def is_device(obj: object) -> bool:
    """Whether ``obj`` is an ``ig.Device``."""
    return isinstance(obj, _Device)


def as_device(device: "Device | int") -> "Device":
    """``device`` as an ``ig.Device`` (an ordinal gives that device)."""
    return device if isinstance(device, _Device) else _Device(device)


def on_first_override(hook: Callable[[], None]) -> None:
    """Call ``hook()`` (with ``lock`` held) whenever the override count leaves 0."""
    _hooks.append(hook)


def _add(n: int) -> None:
    with lock:
        was = overrides[0]
        overrides[0] = was + n
        if was == 0 and n > 0:
            for hook in _hooks:
                hook()


def _state() -> Any:
    t = _tls
    if not hasattr(t, "device"):
        t.device = None  # None: device 0
        t.device_stack = []
        t.streams = {}  # Device -> stack of streams entered with ``with stream:``
    return t


def current_device() -> "Device":
    """The thread's current device (what ``device=None`` means)."""
    if overrides[0]:
        d = getattr(_tls, "device", None)
        if d is not None:
            return d
    return _Device(0)


def current_stream(device: "Device | int | None" = None) -> "Stream":
    """The thread's current stream on ``device`` (default: the current device): the stream
    of the innermost ``with stream:`` block for it, else the device's default stream."""
    dev = current_device() if device is None else as_device(device)
    if overrides[0]:
        s = stream_override(dev)
        if s is not None:
            return s
    return dev.default_stream


def stream_override(dev: "Device") -> "Stream | None":
    """The stream a ``with stream:`` block of this thread made current on ``dev``, or None."""
    stacks = getattr(_tls, "streams", None)
    if stacks:
        stack = stacks.get(dev)
        if stack:
            return stack[-1]
    return None


def set_device(dev: "Device") -> None:
    """Make ``dev`` the thread's current device until changed (device 0 is no override)."""
    t = _state()
    before = t.device is not None
    t.device = None if dev.ordinal == 0 else dev
    _add(int(t.device is not None) - int(before))


def push_device(dev: "Device") -> None:
    t = _state()
    t.device_stack.append(t.device)
    before = t.device is not None
    t.device = None if dev.ordinal == 0 else dev
    _add(int(t.device is not None) - int(before))


def pop_device() -> None:
    t = _state()
    before = t.device is not None
    t.device = t.device_stack.pop()
    _add(int(t.device is not None) - int(before))


def push_stream(s: "Stream") -> None:
    push_device(s.device)
    _state().streams.setdefault(s.device, []).append(s)
    _add(1)


def pop_stream(s: "Stream") -> None:
    stack = _state().streams.get(s.device)
    if not stack or stack[-1] is not s:
        raise RuntimeError(f"{s!r} is not the innermost 'with stream:' block of this thread; blocks must nest")
    stack.pop()
    _add(-1)
    pop_device()
