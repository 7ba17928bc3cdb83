"""Streams: ordered queues of device work.

A ``Stream`` is made by ``Device.create_stream()`` (it owns its handle and
destroys it on ``close()``) or adopted with ``Stream.from_handle()`` (it
never destroys a foreign handle). Every use checks that the stream is open
and that its device's context has not been rebuilt since it was made.
``Stream`` objects are the stream identity the memory layer orders work by.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Callable

from ..errors import ClosedError, StaleHandleError
from . import current
from .event import Event

from .._cpython cimport ignis_finalizing

if TYPE_CHECKING:
    from .device import Device

__all__ = ["Stream"]

_ids = itertools.count(1)
# Weak callbacks run just before a stream is closed (the memory layer records a
# final event on it so memory cached for the stream stays usable elsewhere).
_close_hooks: list = []


def add_close_hook(method: Callable[["Stream"], None]) -> None:
    """Call the bound ``method(stream)`` before any stream closes, while its owner lives."""
    # (a weak reference to the owner, the method's name): compiled classes' bound
    # methods have no __func__, so weakref.WeakMethod cannot hold them.
    _close_hooks.append((weakref.ref(method.__self__), method.__name__))


cdef class Stream:
    """An ordered queue of device work on one device.

    Make one with ``Device.create_stream()`` or adopt a foreign handle with
    ``Stream.from_handle()``; the constructor is the layer both use. ``with
    stream:`` makes it the thread's current stream for the block.

    Args:
        device: the ``ig.Device`` the stream runs on.
        handle: the driver's stream handle (a positive int).
        owned: True if this object destroys ``handle`` on ``close()``; False for a foreign
            stream (never destroyed by Ignis).
        keepalive: any object to keep alive as long as the Stream (the foreign stream's owner).

    Attributes:
        id: a small process-unique number, for logs and reports.
        ordering: this stream's ordering policy (``"auto"`` / ``"manual"``), or None to follow
            the ``ig.ordering(...)`` block or the process-wide policy (set it with
            ``ig.set_ordering(p, stream)``).

    Raises:
        TypeError: ``device`` is not an ``ig.Device`` (``Stream()`` alone says how to get one).
        ValueError: ``handle`` is not a positive int.
    """

    # Fields: see stream.pxd.

    def __init__(self, device: "Device | None" = None, handle: "int | None" = None, *, owned: bool = False,
                 keepalive: object = None) -> None:
        if device is None and handle is None:
            raise TypeError("a Stream is made by its device, not by Stream(): device.create_stream() makes a new "
                            "one (ig.Device(0).create_stream()), device.default_stream and ig.current_stream() "
                            "are there already, and Stream.from_handle(handle, device) adopts a foreign one")
        if not current.is_device(device):
            raise TypeError(f"Stream(device, handle, owned=...) needs an ignis.Device, got {type(device).__name__}; "
                            "make a stream with device.create_stream(), or adopt a foreign handle with "
                            "Stream.from_handle(handle, device)")
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise ValueError(f"stream handle must be a positive int, got {handle!r}; make a stream with "
                             "device.create_stream()")
        self.device = device
        self.handle = handle
        self.id = next(_ids)  # process-unique, small: for logs and reports
        self._generation = device.state.generation
        self._closed = False
        self._owned = owned
        self._keepalive = keepalive
        self.ordering: str | None = None  # per-stream ordering policy override (safety layer)

    @classmethod
    def from_handle(cls, handle: int, device: "Device | int" = 0, *, owner: object = None) -> "Stream":
        """Adopt a stream made by someone else (PyTorch, CuPy, ...). The handle
        is never destroyed by Ignis; ``owner`` is kept alive as long as the Stream.

        Args:
            handle: the foreign stream's driver handle (a positive int).
            device: the ``ig.Device`` (or its ordinal) the stream belongs to.
            owner: an object to keep alive while the Stream lives (the foreign stream object).

        Raises:
            ValueError: ``handle`` is not a positive int, or ``device`` is out of range.
            StaleHandleError: the device is shutting down.
            ForkedProcessError: this is a forked child of a process that used the device.
        """
        dev = current.as_device(device)
        dev._check_usable("adopt a stream")
        if not isinstance(handle, int) or handle <= 0:
            raise ValueError(f"stream handle must be a positive int, got {handle!r}")
        return cls(dev, handle, owned=False, keepalive=owner)

    def live_handle(self) -> int:
        """The stream's driver handle, once it is checked that work may be queued on it: not
        closed, made in its device's current context, the device accepting work.

        Raises:
            ClosedError: the stream was closed.
            StaleHandleError: the device's context was rebuilt since, or it is shutting down.
            ForkedProcessError: in the child of a fork, on the parent's stream.
        """
        return self._check()

    @property
    def stale(self) -> bool:
        """True when the stream was made before its device's context was rebuilt (its handle
        is gone; make or adopt the stream again)."""
        return self._generation != self.device.state.generation

    def _check(self) -> int:
        """The live handle, or an error saying why it cannot be used."""
        if self._closed:
            raise ClosedError(f"{self!r}", "create a new stream with Device.create_stream()")
        state = self.device.state
        if state.generation != self._generation:
            if state.forked_from is not None:
                raise self.device.backend.forked_error(f"use {self!r}")
            raise StaleHandleError("context rebuilt", what="stream", generation=self._generation,
                                   current_generation=state.generation, device_id=self.device.ordinal)
        if not state.accepting_ops:
            raise StaleHandleError("device shutting down", what="stream", device_id=self.device.ordinal)
        return self.handle

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` was called (the same as ``closed``)."""
        return self._closed

    # -- operations --------------------------------------------------------
    def record(self, event: Event | None = None, *, timing: bool = False) -> Event:
        """Record an event (a new one unless ``event`` is given) at the current end of this stream.

        Args:
            event: an existing ``Event`` of this device to record again; None makes a new one.
            timing: for a new event, make it able to measure time (``Event.elapsed_ms``).

        Returns:
            The recorded ``Event``.

        Raises:
            ClosedError: the stream (or ``event``) was closed.
            StaleHandleError: the stream predates a context rebuild, or the device is shutting down.
            DriverError: the driver refused to create or record the event.
        """
        self._check()
        ev = event if event is not None else Event(self.device, timing=timing)
        return ev.record(self)

    def wait(self, other: "Event | Stream") -> None:
        """Make work queued on this stream from now on wait for ``other``
        (an event's latest record, or everything queued on another stream so far).
        Only this stream waits; the host does not.

        Args:
            other: an ``Event`` (its most recent record) or a ``Stream`` (all its work queued so
                far; waiting on this stream itself does nothing).

        Raises:
            TypeError: ``other`` is neither an Event nor a Stream.
            ClosedError: this stream or ``other`` was closed.
            StaleHandleError: either predates a context rebuild, or the device is shutting down.
            DriverError: the driver refused the wait.
        """
        handle = self._check()
        backend = self.device.backend
        if isinstance(other, Event):
            backend.stream_wait_event(handle, other._check())
        elif isinstance(other, Stream):
            if other is self:
                return
            with Event(other.device) as ev:
                ev.record(other)
                backend.stream_wait_event(handle, ev.handle)
        else:
            raise TypeError(f"Stream.wait expects an Event or a Stream, got {type(other).__name__}")

    def query(self) -> bool:
        """True when all work queued on this stream has finished.

        Raises:
            ClosedError: the stream was closed.
            StaleHandleError: the stream predates a context rebuild, or the device is shutting down.
        """
        return self.device.backend.stream_query(self._check())

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream has finished.

        Raises:
            ClosedError: the stream was closed.
            StaleHandleError: the stream predates a context rebuild, or the device is shutting down.
            DriverError: queued work failed (the driver's error for it).
        """
        self.device.backend.stream_synchronize(self._check())

    def launch_host_func(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on a host thread when the stream gets here; the stream
        waits for it. ``fn`` must not call Ignis or the driver.

        Args:
            fn: a callable taking no arguments.

        Raises:
            TypeError: ``fn`` is not callable.
            ClosedError: the stream was closed.
            StaleHandleError: the stream predates a context rebuild, or the device is shutting down.
        """
        if not callable(fn):
            raise TypeError(f"launch_host_func needs a callable, got {type(fn).__name__}")
        self.device.backend.launch_host_func(self._check(), fn)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: ``(version, handle)``."""
        return (0, self._check())

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Destroy the stream (queued work still completes). Idempotent."""
        if self._closed:
            return
        if _close_hooks and self.device.state.generation == self._generation:
            for entry in list(_close_hooks):
                owner = entry[0]()
                if owner is None:
                    _close_hooks.remove(entry)
                else:
                    try:
                        getattr(owner, entry[1])(self)
                    except Exception:
                        pass
        self._closed = True
        if self._owned and self.device.state.generation == self._generation:
            self.device.backend.stream_destroy(self.handle)

    def __enter__(self) -> "Stream":
        """``with stream:`` makes it the thread's current stream on its device (and its device
        current) for the block, as ``torch.cuda.stream(s)`` and CuPy's ``with s:`` do: Ignis
        work given ``stream=None`` runs on it. Closing the stream is ``close()``."""
        self._check()
        current.push_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        current.pop_stream(self)

    def __del__(self) -> None:
        try:
            owned, closed = self._owned, self._closed
        except AttributeError:  # __init__ refused its arguments: there is nothing to destroy
            return
        # ignis_finalizing() is a C test: at interpreter exit this module's globals (``sys``
        # among them) may be cleared before the last streams die.
        if owned and not closed and not ignis_finalizing():
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        try:
            state = "closed" if self._closed else "open"
            return f"<ignis.Stream #{self.id} handle={self.handle:#x} device={self.device.ordinal} {state}>"
        except (AttributeError, TypeError):  # __init__ refused its arguments (the fields are None)
            return "<ignis.Stream (not constructed)>"
