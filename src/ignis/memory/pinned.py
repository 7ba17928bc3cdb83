"""PinnedHostResource: pooled page-locked host memory for fast copies.

Buffers are cached by power-of-two capacity. A buffer released with the
streams that used it is reused only once events recorded on those streams
have completed (checked with a non-blocking query): a copy still reading or
writing it is never overtaken, and the host never waits on the hot path.

A driver call that fails leaves nothing lost: a ``deallocate`` whose event
record fails leaves the buffer held by the caller (not released, counters
unchanged, releasable again); a ``trim`` whose ``host_free`` (or wait) fails
keeps that buffer and the ones not reached yet cached and counted, and
raises, so a later ``trim`` frees them.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..backends import Backend, get_backend
from ..errors import DoubleFreeError, UseAfterFreeError
from ..runtime import Stream
from .resource import event_pool

__all__ = ["PinnedHostResource", "PinnedBuffer"]

_MIN = 4096


class PinnedBuffer:
    """A page-locked host buffer. ``array`` is a uint8 NumPy view of its first ``nbytes``.

    Made by ``PinnedHostResource.allocate``; ``with buffer:`` releases it at the
    end of the block.

    Args:
        ptr: the host address.
        nbytes: the usable size in bytes.
        capacity: the size of the underlying buffer in bytes (a power of two, at least 4096).
        resource: the ``PinnedHostResource`` it goes back to.

    Attributes:
        ptr: the host address.
        nbytes: the usable size in bytes.
        capacity: the underlying buffer's size in bytes.
    """

    __slots__ = ("ptr", "nbytes", "capacity", "_resource", "_released", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, capacity: int, resource: "PinnedHostResource") -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.capacity = capacity
        self._resource = resource
        self._released = False

    @property
    def array(self) -> np.ndarray:
        """The first ``nbytes`` bytes as a uint8 NumPy array over the pinned memory.

        Raises:
            UseAfterFreeError: the buffer was released.
        """
        if self._released:
            raise UseAfterFreeError(f"pinned buffer {self.ptr:#x} was released; allocate a new one",
                                    ptr=self.ptr)
        return np.ctypeslib.as_array((ctypes.c_ubyte * self.nbytes).from_address(self.ptr)) \
            if self.nbytes else np.empty(0, np.uint8)

    def release(self, *streams: Stream) -> None:
        """Hand the buffer back; it is reused after the work queued on ``streams`` so far.

        Args:
            *streams: the streams whose queued work may still use the buffer.

        Raises:
            DoubleFreeError: the buffer was already released.
            DriverError: an event record failed; the buffer stays held and can be released again.
        """
        self._resource.deallocate(self, *streams)

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._released:
            self.release()

    def __repr__(self) -> str:
        return f"<PinnedBuffer {self.ptr:#x} {self.nbytes}/{self.capacity} B>"


class PinnedHostResource:
    """Pooled page-locked host memory. Thread-safe.

    Buffers are cached by power-of-two capacity and reused once the work queued
    on the streams given at release has completed.

    Args:
        backend: the backend to allocate through; None for the current one.
    """

    def __init__(self, backend: Backend | None = None) -> None:
        self._backend = backend or get_backend()
        self._lock = threading.Lock()
        self._cache: dict[int, list[tuple[int, list]]] = {}  # capacity -> [(ptr, release events)]
        self._outstanding = 0
        self._cached = 0

    @staticmethod
    def _capacity(nbytes: int) -> int:
        return max(_MIN, 1 << (nbytes - 1).bit_length())

    def allocate(self, nbytes: int) -> PinnedBuffer:
        """A pinned buffer of ``nbytes`` usable bytes: a cached one whose last uses have
        completed, else a new one.

        Args:
            nbytes: the size in bytes (0 is allowed).

        Raises:
            ValueError: ``nbytes`` is not a non-negative int.
            DriverError: the driver could not allocate pinned memory.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"pinned allocation size must be a non-negative int, got {nbytes!r}")
        cap = self._capacity(max(nbytes, 1))
        with self._lock:
            bucket = self._cache.get(cap)
            if bucket:
                for i, (ptr, events) in enumerate(bucket):
                    if self._ready(events):
                        del bucket[i]
                        self._cached -= cap
                        self._outstanding += cap
                        # A new handle: one released earlier stays released (its use is an error).
                        return PinnedBuffer(ptr, nbytes, cap, self)
        ptr = self._backend.host_alloc(cap)
        with self._lock:
            self._outstanding += cap
        return PinnedBuffer(ptr, nbytes, cap, self)

    def _ready(self, events: list) -> bool:
        """True (and events recycled) when every use recorded at release has completed."""
        while events:
            ev, pool = events[-1]
            if pool.stale:  # its context was rebuilt: the work (and the event) are gone
                events.pop()
                continue
            if not self._backend.event_query(ev):
                return False
            pool.put(ev)
            events.pop()
        return True

    def deallocate(self, buf: PinnedBuffer, *streams: Stream) -> None:
        """Hand ``buf`` back; its memory is reused only after the work queued so far on
        ``streams``. A closed stream's work is waited for on the host.

        Args:
            buf: a ``PinnedBuffer`` from this resource.
            *streams: the streams whose queued work may still use it.

        Raises:
            DoubleFreeError: ``buf`` was already released.
            DriverError: an event record failed; ``buf`` stays held and can be released again.
        """
        with self._lock:
            if buf._released:
                raise DoubleFreeError(f"pinned buffer {buf.ptr:#x} was released twice", ptr=buf.ptr)
            buf._released = True
        events: list = []
        try:
            for s in streams:
                if s._closed or s._generation != s.device.state.generation:
                    if not s._closed:
                        continue  # a rebuilt context: its work is gone
                    self._backend.device_synchronize(s.device.ordinal)
                    continue
                pool = event_pool(s.device)
                ev = pool.get()
                try:
                    self._backend.event_record(ev, s.handle)
                except BaseException:
                    pool.put(ev)
                    raise
                events.append((ev, pool))
        except BaseException:
            # Not released after all: the caller still holds it and can release it again.
            for ev, pool in events:
                pool.put(ev)
            with self._lock:
                buf._released = False
            raise
        with self._lock:
            self._outstanding -= buf.capacity
            self._cached += buf.capacity
            self._cache.setdefault(buf.capacity, []).append((buf.ptr, events))

    @property
    def bytes_outstanding(self) -> int:
        """Bytes (by capacity) of buffers handed out and not yet released."""
        return self._outstanding

    @property
    def bytes_cached(self) -> int:
        """Bytes (by capacity) of released buffers kept for reuse."""
        return self._cached

    def trim(self) -> int:
        """Free cached buffers (waiting for their last uses). Returns bytes freed."""
        with self._lock:
            buckets, self._cache = self._cache, {}
            self._cached = 0
        freed = 0
        left: list[tuple[int, int, list]] = []  # what a failure leaves cached: (capacity, ptr, events)
        failure: BaseException | None = None
        for cap, bucket in buckets.items():
            for ptr, events in bucket:
                if failure is None:
                    try:
                        while events:
                            ev, pool = events[-1]
                            if not pool.stale:
                                self._backend.event_synchronize(ev)
                                pool.put(ev)
                            events.pop()
                        self._backend.host_free(ptr)
                        freed += cap
                        continue
                    except BaseException as exc:
                        failure = exc
                left.append((cap, ptr, events))
        if left:
            with self._lock:
                for cap, ptr, events in left:
                    self._cache.setdefault(cap, []).append((ptr, events))
                    self._cached += cap
        if failure is not None:
            raise failure
        return freed

    close = trim
