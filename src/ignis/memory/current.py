"""The per-device current resource.

``get_current_resource(device)`` returns what ``set_current_resource`` set,
or a default made on first use: ``PoolResource(AsyncResource(device))`` where
the device has stream-ordered memory pools, ``PoolResource(DirectResource(device))``
elsewhere. A default made before a context rebuild is replaced by a fresh one.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from ..runtime import Device, current_device
from .pool import PoolResource
from .resource import DeviceMemoryResource
from .upstream import default_upstream

__all__ = ["get_current_resource", "set_current_resource", "default_upstream", "on_resource_change"]

_current: dict[tuple[int, int], DeviceMemoryResource] = {}
epoch = 0  # bumped whenever a current resource changes (then on_resource_change's listeners run)
_listeners: list = []
_explicit: set[tuple[int, int]] = set()
_lock = threading.Lock()


def _key(device: "Device | int | None") -> tuple[Device, tuple[int, int]]:
    dev = current_device() if device is None else Device(device)
    return dev, (id(dev.backend), dev.ordinal)


def get_current_resource(device: "Device | int | None" = None) -> DeviceMemoryResource:
    """The resource that allocations on ``device`` use when none is named.

    What ``set_current_resource`` set, else a default made on first use (a
    ``PoolResource`` over ``default_upstream``), remade after a context rebuild.

    Args:
        device: an ``ig.Device`` or ordinal; None for the current device.

    Raises:
        ValueError: ``device`` is out of range.
    """
    dev, key = _key(device)
    mr = _current.get(key)
    if mr is not None and (mr._generation == dev.state.generation or key in _explicit):
        return mr
    with _lock:
        mr = _current.get(key)
        if mr is None or (mr._generation != dev.state.generation and key not in _explicit):
            mr = _current[key] = PoolResource(default_upstream(dev))
            _changed()
        return mr


def _changed() -> None:
    """A current resource changed: a new epoch, and the listeners told."""
    global epoch
    epoch += 1
    for fn in tuple(_listeners):
        fn()


def on_resource_change(fn: "Callable[[], None]") -> None:
    """Call ``fn()`` whenever a device's current resource changes (set, reset, a default made
    or replaced after a context rebuild, a fork's child), after the change. ``fn`` runs under
    this module's lock (in a fork's child, on its fresh lock's behalf, before any other thread
    runs): it must not call back into it.

    Args:
        fn: a function of no arguments.
    """
    if not callable(fn):
        raise TypeError(f"on_resource_change takes a function, not {type(fn).__name__}")
    _listeners.append(fn)


def set_current_resource(mr: DeviceMemoryResource | None, device: "Device | int | None" = None
                         ) -> DeviceMemoryResource | None:
    """Make ``mr`` the current resource of its device (or of ``device``); ``None``
    restores the default. Returns the previous resource.

    Args:
        mr: a ``DeviceMemoryResource``, or None for the default.
        device: the device to set it for; None: ``mr``'s device (the current device when
            ``mr`` is None).

    Returns:
        The resource that was set before (None if there was none yet).

    Raises:
        TypeError: ``mr`` is not a DeviceMemoryResource.
        ValueError: ``mr`` serves another device than ``device``.
    """
    if mr is not None and not isinstance(mr, DeviceMemoryResource):
        raise TypeError(f"expected a DeviceMemoryResource, got {type(mr).__name__}")
    if device is None and mr is not None:
        device = mr.device
    dev, key = _key(device)
    if mr is not None and mr.device is not dev:
        raise ValueError(f"{mr!r} serves device {mr.device.ordinal}, not device {dev.ordinal}")
    with _lock:
        prev = _current.get(key)
        if mr is None:
            _current.pop(key, None)
            _explicit.discard(key)
        else:
            _current[key] = mr
            _explicit.add(key)
        _changed()  # after the change: a cache made from what was read before is out of date
        return prev


def _after_fork_in_child() -> None:
    """os.register_at_fork(after_in_child=...): a fresh lock (a parent thread may have
    held this one), and a new epoch, so cached defaults are looked up again (and a
    child of a parent that used the device learns that at its first allocation)."""
    global _lock
    _lock = threading.Lock()
    _changed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
