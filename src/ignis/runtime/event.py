"""Events: points in a stream's work that the host or other streams can wait for.

An ``Event`` belongs to one device and one context generation; using it after
``close()`` raises ``ClosedError``, after a context rebuild ``StaleHandleError``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import ClosedError, StaleHandleError
from . import current as _current

if TYPE_CHECKING:
    from .device import Device
    from .stream import Stream

__all__ = ["Event"]


class Event:
    """A recorded point in a stream. Made by ``Stream.record()`` or ``Device.create_event()``.

    An event can be recorded again; waits and queries refer to its most recent
    record. ``with event:`` closes it at the end of the block.

    Args:
        device: the ``ig.Device`` the event belongs to.
        timing: make the event able to measure time (``elapsed_ms``).

    Raises:
        TypeError: ``device`` is not an ``ig.Device``.
        StaleHandleError: the device is shutting down.
        ForkedProcessError: this is a forked child of a process that used the device.
        DriverError: the driver failed to create the event.
    """

    __slots__ = ("handle", "device", "timing", "_generation", "_closed", "__weakref__")

    def __init__(self, device: "Device", *, timing: bool = False) -> None:
        if not _current.is_device(device):
            raise TypeError(f"Event(device) needs an ignis.Device, got {type(device).__name__}; use "
                            "device.create_event() or stream.record(), e.g. ig.Device(0).create_event()")
        device._check_usable("create an event")
        self.device = device
        self.timing = bool(timing)
        self._generation = device.state.generation
        self._closed = True  # until the handle exists, so __del__ does nothing
        self.handle = device.backend.event_create(device.ordinal, self.timing)
        self._closed = False

    # -- checks ------------------------------------------------------------
    def _check(self) -> int:
        if self._closed:
            raise ClosedError(f"{self!r}")
        state = self.device.state
        if state.generation != self._generation:
            if state.forked_from is not None:
                raise self.device.backend.forked_error(f"use {self!r}")
            raise StaleHandleError("context rebuilt", what="event", generation=self._generation,
                                   current_generation=state.generation, device_id=self.device.ordinal)
        return self.handle

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    # -- operations --------------------------------------------------------
    def record(self, stream: "Stream") -> "Event":
        """Record this event at the current end of ``stream``'s work.

        Args:
            stream: the ``Stream`` to record on (on the event's device).

        Returns:
            This event.

        Raises:
            ClosedError: the event or the stream was closed.
            StaleHandleError: the event or the stream predates a context rebuild (or the
                device is shutting down).
            DriverError: the driver refused the record.
        """
        self.device.backend.event_record(self._check(), stream._check())
        return self

    def query(self) -> bool:
        """True when the work before the most recent record has finished (or it was never recorded).

        Raises:
            ClosedError: the event was closed.
            StaleHandleError: the event predates a context rebuild.
        """
        return self.device.backend.event_query(self._check())

    def synchronize(self) -> None:
        """Block the host until the most recent record is reached.

        Raises:
            ClosedError: the event was closed.
            StaleHandleError: the event predates a context rebuild.
            DriverError: work before the record failed.
        """
        self.device.backend.event_synchronize(self._check())

    @property
    def is_done(self) -> bool:
        """``query()``: True when the work before the most recent record has finished."""
        return self.query()

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end``; both need ``timing=True``.

        Args:
            end: the later ``Event``; both must have been recorded and reached.

        Raises:
            ValueError: either event was made without ``timing=True``.
            ClosedError: either event was closed.
            StaleHandleError: either event predates a context rebuild.
            DriverError: the driver could not measure (e.g. an event not yet reached).
        """
        if not (self.timing and end.timing):
            raise ValueError("both events must be created with timing enabled to measure time "
                             "between them; use stream.record(timing=True)")
        return self.device.backend.event_elapsed_ms(self._check(), end._check())

    def close(self) -> None:
        """Destroy the event. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.device.state.generation == self._generation:
            self.device.backend.event_destroy(self.handle)

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            closed = self._closed
        except AttributeError:  # __init__ refused its arguments: there is nothing to destroy
            return
        if not closed and not sys.is_finalizing():
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        try:
            state = "closed" if self._closed else "open"
            return f"<ignis.Event {self.handle:#x} device={self.device.ordinal} {state}>"
        except AttributeError:
            return "<ignis.Event (not constructed)>"
