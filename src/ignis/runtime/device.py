"""Devices and their state.

``Device(n)`` returns the one ``Device`` object for ordinal ``n`` on the
current backend. Its ``DeviceState`` carries the context ``generation``
(bumped by ``rebuild()``) and ``accepting_ops`` (false once ``shutdown()``
began); streams, events, blocks and GpuRefs remember the generation they
were made in and refuse to work across a rebuild.

Fork: in a child made by ``fork()`` after the parent used a device, the
parent's contexts are gone. An at-fork handler bumps the generation of every
device of such a backend (so every stream, event, block and resource made in
the parent is stale and takes its slow path) and marks the state forked, so
those checks raise ``ForkedProcessError`` (use the ``spawn`` or
``forkserver`` start method) instead of ``StaleHandleError``.
"""

from __future__ import annotations

import operator
import os
import threading
from typing import Any

from ..backends import Backend, DeviceProperties, get_backend
from ..errors import StaleHandleError
from . import current as _current
from .event import Event
from .stream import Stream

__all__ = ["Device", "DeviceState", "device_count"]


class DeviceState:
    """Generation counter and shutdown flag of one device. Thread-safe.

    Each ``Device`` has one (``device.state``); streams, events, blocks and
    ``GpuRef`` handles remember the ``generation`` they were made in and refuse
    to work once it changed.

    Args:
        device_id: the device's ordinal.

    Attributes:
        device_id: the device's ordinal.
        generation: the context generation, 0 at first, bumped by each ``Device.rebuild()``.
        accepting_ops: False once ``Device.shutdown()`` began.
        forked_from: in a child made by ``fork()`` after the parent used the device, the
            parent's pid (the context is gone); else None.
    """

    __slots__ = ("device_id", "generation", "accepting_ops", "forked_from", "_lock", "__weakref__")

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self.generation = 0
        self.accepting_ops = True
        self.forked_from: int | None = None  # in a forked child: the parent's pid (the context is gone)
        self._lock = threading.Lock()

    def bump_generation(self) -> int:
        """Add one to ``generation`` (a context rebuild) and return the new value."""
        with self._lock:
            self.generation += 1
            return self.generation

    def begin_shutdown(self) -> None:
        """Set ``accepting_ops`` to False: from now on the device refuses new work."""
        self.accepting_ops = False


_devices: dict[tuple[int, int], "Device"] = {}
_devices_lock = threading.Lock()


def device_count() -> int:
    """How many devices the current backend sees."""
    return get_backend().device_count()


def _ordinal_of(device: Any) -> int:
    """The ordinal ``device`` names: ``"cuda:N"`` (PyTorch's spelling), or an integer of
    another type (NumPy's); else a TypeError saying what is accepted."""
    if isinstance(device, str):
        kind, _, number = device.strip().partition(":")
        if kind == "cuda" and number.strip().isdigit():
            return int(number)
    elif not isinstance(device, bool) and hasattr(device, "__index__"):
        return operator.index(device)
    raise TypeError(f"a device is an int ordinal (0, 1, ...), 'cuda:N' or an ig.Device; got {device!r}")


class Device:
    """One device of the current backend. ``Device(n)`` always returns the same object for ``n``.

    ``with device:`` makes it the calling thread's current device for the block
    (what ``device=None`` means everywhere in Ignis); ``set_current()`` does so
    until changed.

    Args:
        ordinal: the device's number, ``0 <= ordinal < device_count()`` (default 0), as an
            int or as PyTorch writes it (``"cuda:1"``). A ``Device`` is returned as it is.

    Raises:
        TypeError: ``ordinal`` is neither an int nor ``"cuda:N"`` (a bool is refused too).
        ValueError: ``ordinal`` is out of range for the backend; the message gives the valid range.
        DriverError: the backend failed to initialize the device.
    """

    backend: Backend
    ordinal: int
    state: DeviceState

    def __new__(cls, ordinal: "int | Device" = 0) -> "Device":
        if isinstance(ordinal, Device):
            return ordinal
        backend = get_backend()
        if isinstance(ordinal, bool) or not isinstance(ordinal, int):
            ordinal = _ordinal_of(ordinal)
        key = (id(backend), ordinal)
        dev = _devices.get(key)
        if dev is not None:
            return dev
        with _devices_lock:
            dev = _devices.get(key)
            if dev is None:
                count = backend.device_count()
                if not 0 <= ordinal < count:
                    valid = f"0..{count - 1}" if count else "none"
                    raise ValueError(f"device ordinal {ordinal} is out of range: the {backend.name} "
                                     f"backend has {count} device(s) (valid: {valid})")
                backend.init_device(ordinal)
                dev = object.__new__(cls)
                dev.backend = backend
                dev.ordinal = ordinal
                dev.state = DeviceState(ordinal)
                dev._props = None
                dev._default_stream = None
                dev._lock = threading.Lock()
                dev._peers = {}  # peer ordinal -> (this generation, the peer's) when access was enabled
                _devices[key] = dev
        return dev

    # -- identity and properties ---------------------------------------------
    @property
    def properties(self) -> DeviceProperties:
        """The backend's ``DeviceProperties`` of this device (asked once, then cached)."""
        if self._props is None:
            self._props = self.backend.device_properties(self.ordinal)
        return self._props

    @property
    def name(self) -> str:
        """The device's name as the driver reports it (e.g. ``"NVIDIA H200"``)."""
        return self.properties.name

    @property
    def total_memory(self) -> int:
        """The device's total memory, in bytes."""
        return self.properties.total_memory

    @property
    def uuid(self) -> str:
        """The device's UUID, as a string."""
        return self.properties.uuid

    @property
    def capabilities(self) -> dict[str, bool]:
        """``{"vmm": ..., "memory_pools": ..., "posix_fd_ipc": ...}``."""
        return self.properties.capabilities

    @property
    def generation(self) -> int:
        """The current context generation (``state.generation``), bumped by ``rebuild()``."""
        return self.state.generation

    @property
    def accepting_ops(self) -> bool:
        """False once ``shutdown()`` began (``state.accepting_ops``)."""
        return self.state.accepting_ops

    def __index__(self) -> int:
        return self.ordinal

    def __repr__(self) -> str:
        return f"<ignis.Device {self.ordinal} ({self.backend.name}) generation={self.state.generation}>"

    # -- checks ------------------------------------------------------------
    def check_usable(self, what: str) -> None:
        """Raise unless work may be started on the device now: not in the child of a fork
        that inherited it, and not shutting down.

        Args:
            what: the operation, as the error names it.

        Raises:
            ForkedProcessError: the device belongs to the parent of this forked process.
            StaleHandleError: the device is shutting down.
        """
        self._check_usable(what)

    def _check_usable(self, what: str) -> None:
        if self.state.forked_from is not None:
            raise self.backend.forked_error(what)
        if not self.state.accepting_ops:
            raise StaleHandleError("device shutting down", what=f"device {self.ordinal} (cannot {what})",
                                   device_id=self.ordinal)

    # -- streams and events ----------------------------------------------------
    def create_stream(self, *, priority: int = 0) -> Stream:
        """A new stream on this device, owned by the caller (``close()`` it).

        Args:
            priority: the stream priority passed to the driver (0, the default, is normal;
                lower numbers are higher priority on CUDA).

        Raises:
            StaleHandleError: the device is shutting down.
            ForkedProcessError: this is a forked child of a process that used the device.
            DriverError: the driver failed to create the stream.
        """
        self._check_usable("create a stream")
        self.backend.set_current(self.ordinal)
        return Stream(self, self.backend.stream_create(self.ordinal, priority), owned=True)

    def create_event(self, *, timing: bool = False) -> Event:
        """A new, not yet recorded ``Event`` on this device (``Event(self, timing=timing)``).

        Args:
            timing: make the event able to measure time (``Event.elapsed_ms``).

        Raises:
            StaleHandleError: the device is shutting down.
            ForkedProcessError: this is a forked child of a process that used the device.
            DriverError: the driver failed to create the event.
        """
        return Event(self, timing=timing)

    @property
    def default_stream(self) -> Stream:
        """This device's Ignis default stream (made on first use, remade after a rebuild).
        Work that names no stream goes here."""
        s = self._default_stream
        if s is None or s._generation != self.state.generation or s._closed:
            with self._lock:
                s = self._default_stream
                if s is None or s._generation != self.state.generation or s._closed:
                    s = self.create_stream()
                    self._default_stream = s
        return s

    def set_current(self) -> "Device":
        """Make this device current for the calling thread until changed: what
        ``device=None`` means in Ignis, and the driver context CUDA libraries expect."""
        self.backend.set_current(self.ordinal)
        _current.set_device(self)
        return self

    def __enter__(self) -> "Device":
        """``with device:`` makes it the thread's current device for the block."""
        self.backend.set_current(self.ordinal)
        _current.push_device(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _current.pop_device()
        prev = _current.current_device()
        if prev is not self:
            prev.backend.set_current(prev.ordinal)

    # -- peers --------------------------------------------------------------------
    def can_access_peer(self, peer: "Device | int") -> bool:
        """Whether work on this device can be given direct access to ``peer``'s memory (NVLink or
        PCIe peer-to-peer, as the driver's ``cuDeviceCanAccessPeer`` says); False for itself.

        Args:
            peer: another ``Device`` (or its ordinal) of the same backend.

        Raises:
            ValueError: ``peer`` is out of range.
        """
        other = Device(peer)
        return other is not self and self.backend.device_can_access_peer(self.ordinal, other.ordinal)

    def enable_peer_access(self, peer: "Device | int") -> None:
        """Let work on this device read and write ``peer``'s memory directly, so copies between
        them go peer to peer. Once per pair, until either device's context is rebuilt (then it is
        enabled again on the next call).

        Args:
            peer: another ``Device`` (or its ordinal) of the same backend.

        Raises:
            ValueError: ``peer`` is out of range.
            DriverError: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED where ``can_access_peer(peer)`` is False.
        """
        other = Device(peer)
        gens = (self.state.generation, other.state.generation)
        if self._peers.get(other.ordinal) == gens:
            return
        self._check_usable("enable peer access")
        other._check_usable("enable peer access")
        self.backend.enable_peer_access(self.ordinal, other.ordinal)
        self._peers[other.ordinal] = gens

    # -- whole-device operations -------------------------------------------------
    def synchronize(self) -> None:
        """Block the host until all work on this device has finished.

        Raises:
            StaleHandleError: the device is shutting down.
            ForkedProcessError: this is a forked child of a process that used the device.
            DriverError: queued work failed (the driver's error for it).
        """
        self._check_usable("synchronize")
        self.backend.device_synchronize(self.ordinal)

    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes as the driver sees them."""
        return self.backend.mem_get_info(self.ordinal)

    def rebuild(self) -> int:
        """Reset the device's context and bump its generation. Every stream,
        event, block and handle made before becomes stale. Returns the new generation."""
        with self._lock:
            # Bump first: from here on every old stream and event knows it is stale
            # and never hands its dead handle back to the driver (not even from __del__).
            gen = self.state.bump_generation()
            old, self._default_stream = self._default_stream, None
            self.backend.rebuild_context(self.ordinal)
            del old
        return gen

    def shutdown(self) -> None:
        """Stop accepting work: finish what is queued, then refuse further operations."""
        if not self.state.accepting_ops:
            return
        try:
            self.backend.device_synchronize(self.ordinal)
        finally:
            self.state.begin_shutdown()



def _after_fork_in_child() -> None:
    """os.register_at_fork(after_in_child=...), run after the backends' handler: in a
    child of a parent that used its backend, every device's context is gone."""
    global _devices_lock
    _devices_lock = threading.Lock()
    for dev in list(_devices.values()):
        dev._lock = threading.Lock()
        state = dev.state
        state._lock = threading.Lock()
        if dev.backend._forked_from is not None and state.forked_from is None:
            state.forked_from = dev.backend._forked_from
            state.generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

_current.register_device_type(Device)
