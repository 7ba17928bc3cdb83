"""The DeviceMemoryResource contract and its cross-stream hazard tracking.

Contract (after seeds/004):
- ``allocate(nbytes, stream, tag)`` returns a LIVE ``DeviceBlock`` ordered on
  ``stream``; ``deallocate(block)`` hands it back, ordered on its alloc stream.
  A second deallocate raises ``DoubleFreeError``; a block from elsewhere,
  ``ValueError``.
- A deallocate that the driver refuses (its free, or an event record or wait
  that orders it) raises the driver's error and changes no counter: the
  block stays LIVE and usable with a sound hazard record (or, where its
  memory was already unmapped, stays this resource's), and a later
  deallocate frees it. Cached memory a resource fails to hand back stays
  cached. Nothing is leaked and no counter lies.
- Tracking (``prepare_block_use`` / ``finish_block_use`` / ``record_block_use``):
  a resource that cannot track raises ``StreamMisuseError``, never a silent
  success; a stale or unknown ``BlockId`` raises ``UseAfterFreeError``.

Hazard record, kept on each block (``TrackedResource``):
- the last writer (stream + event) and the readers since ({stream: event});
- READ waits on a write from another stream; WRITE / READ_WRITE also wait on
  every read from another stream; deallocate makes the alloc stream wait on
  every use from another stream before the memory can be reused.
- Uses on the block's alloc stream record nothing: their entry is "lazy" (event
  0) and an event is recorded only when another stream must wait for them.
  Uses on other streams record one event at finish, while that stream is
  certainly alive. So same-stream code makes no driver call at all.
- Events come from a per-device pool and go back when superseded (a wait
  captures an event's state when queued, so re-recording it later is safe).
- If a lazily-ordered alloc stream was closed meanwhile, ordering falls back
  to a device synchronization (correct, slow, and only on that misuse).
- Clean: a block whose last writer is stream S with no event recorded and no
  readers is clean on S (``block_clean_on``, memory/block.pxd; ``DeviceBlock.clean_on``).
  Then a use on S (read or write) needs no wait and changes nothing: whoever
  must wait for S later records its event at S's tail, after that use. Hot
  paths with the sanitizer off (``HOOKS.checker is None``, memory/hooks.pyx) may
  ask ``block_clean_on`` themselves and skip ``prepare_block_use`` /
  ``finish_block_use`` (the checks of the stream and of the block's life are then theirs).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.errno cimport errno, EINTR
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME
from libc.stdint cimport uintptr_t

from ..errors import (ClosedError, DoubleFreeError, DriverError, OutOfMemoryError, StaleHandleError, StreamMisuseError,
                      UseAfterFreeError)
from ..runtime import Device, current_device
from ..runtime.stream cimport Stream
from ..backends.direct cimport DirectCalls
from . import ordering as _ord
from .._types import Access
from .types import UNTAGGED, BlockId
from .block cimport (DeviceBlock, block_clean_on, block_drop_record, block_keep_read_event, block_keep_write_event,
                     block_live, block_note_read, block_note_write, block_restore_record, fresh_generation, new_block)
from .hooks cimport Hooks
from .hooks import HOOKS as _HOOKS

cdef extern from "Python.h":
    void *PyLong_AsVoidPtr(object) except? NULL

cdef extern from "pythread.h":
    PY_TIMEOUT_T PY_TIMEOUT_MAX

# The hooks the hot paths read on every call (``recorder``, ``checker``, ``any_manual`` can
# change at any time): C fields of one object.
cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields
cdef object _READ = Access.READ
cdef object _WRITE = Access.WRITE
cdef object _RW = Access.READ_WRITE
cdef object _AUTO = _ord.AUTO
cdef object _ZERO = 0


cdef inline bint _writes(object access) except -1:
    """``access.writes``, without the attribute lookup for the three members."""
    if access is _RW or access is _WRITE:
        return True
    if access is _READ:
        return False
    return bool(access.writes)


cdef inline bint _auto_order(object stream) except -1:
    """Under ``auto`` ordering for a use on ``stream`` (``ordering.policy``)."""
    if not _HK.any_manual:
        return True
    return _ord.policy(stream) == _AUTO

if TYPE_CHECKING:
    from ..backends import Backend

__all__ = ["DeviceMemoryResource", "TrackedResource", "EventPool", "check_request"]


cdef Stream _as_stream(object stream):
    """``stream`` as a Stream, or a TypeError that says what was expected."""
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis Stream (device.create_stream(), device.default_stream), "
                        f"got {type(stream).__name__}")
    return <Stream>stream


def check_request(nbytes: Any, stream: Any) -> None:
    """Validate an allocation request (called only on the error path or by
    resources without a faster inline check).

    Args:
        nbytes: the requested size; must be an int of at least 1.
        stream: the stream asked for; must be an ``ig.Stream``.

    Raises:
        TypeError: ``nbytes`` is not an int (a bool is refused), or ``stream`` is not a Stream.
        ValueError: ``nbytes`` is 0 or negative.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"allocation size must be an int number of bytes, got {type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"allocation size must be positive, got {nbytes} bytes")
    if nbytes == 0:
        raise ValueError("zero-byte allocation requested; ask for at least 1 byte "
                         "(an empty array needs no device memory)")
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}; "
                        "use device.default_stream or device.create_stream()")


# -- the driver calls of tracking ---------------------------------------------------
# Tracking queues its event records and stream waits through ``_queue``: straight to the
# driver through the backend's direct calls (``backend.direct_calls()``, a typed
# ``ignis.backends.direct.DirectCalls``: the backend decides from its own tables, gates and
# current context whether a call may go direct, and makes it with the GIL released, no
# Python call) while no recorder or sanitizer hook is installed (they hear every call);
# everything else, and any call the direct path did not make, goes through the backend's
# methods.

cdef unsigned long long _n_record = 0
cdef unsigned long long _n_wait = 0
cdef object _dc_backend = None     # the backend the direct calls below are its (bound once per backend)
cdef DirectCalls _dc = None


cdef int _queue(object backend, bint wait, object h, object ev) except -1:
    """Queue on stream handle ``h`` a record of event ``ev`` (or, ``wait``, a wait for it)."""
    global _dc, _dc_backend, _n_record, _n_wait
    cdef DirectCalls dc = _dc
    if _dc_backend is not backend:
        try:
            found = backend.direct_calls()
        except Exception:  # noqa: BLE001 - a backend without them: its methods only
            found = None
        dc = _dc = found if isinstance(found, DirectCalls) else None
        _dc_backend = backend
    if dc is not None and _HK.recorder is None and _HK.checker is None and dc.queue(wait, h, ev) == 0:
        if wait:
            _n_wait += 1
        else:
            _n_record += 1
        return 0
    if wait:
        backend.stream_wait_event(h, ev)
    else:
        backend.event_record(ev, h)
    return 0


def driver_calls() -> dict[str, int]:
    """The event records and stream waits that tracking queued straight to the driver
    (the cuda backend's direct path), since the process started; calls made through
    the backend's methods are not in it.

    Returns:
        ``{"event_record": n, "stream_wait_event": n}``.
    """
    return {"event_record": _n_record, "stream_wait_event": _n_wait}


cdef class ResourceLock:
    """The lock of a tracking resource: a plain (non-reentrant) lock like
    ``threading.Lock``, which the compiled allocator and tracking paths take and
    release without a Python call.

    ``with resource._lock:``, ``acquire(blocking=True, timeout=-1)``, ``release()``
    and ``locked()`` work as for ``threading.Lock``.
    """

    def __cinit__(self) -> None:
        self._ready = self._held = False
        if sem_init(&self._sem, 0, 1) != 0:
            raise OSError(errno, "cannot make a lock (sem_init): this platform has no unnamed POSIX semaphores")
        self._ready = True

    def __dealloc__(self) -> None:
        if self._ready:
            sem_destroy(&self._sem)
            self._ready = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock, waiting (with the GIL released) while another thread holds it.

        Args:
            blocking: False: take it only if it is free now.
            timeout: with ``blocking``, the most seconds to wait; -1 waits as long as it takes.

        Returns:
            True if the lock was taken.

        Raises:
            ValueError: a timeout with ``blocking=False``, or a negative timeout other than -1.
            OverflowError: the timeout is too large.
        """
        cdef PY_TIMEOUT_T us = -1
        cdef double t = timeout
        if not blocking:
            if t != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            us = 0
        elif t != -1:
            if t < 0:
                raise ValueError("timeout value must be a non-negative number")
            if t * 1e6 >= <double>PY_TIMEOUT_MAX:
                raise OverflowError("timeout value is too large")
            us = <PY_TIMEOUT_T>(t * 1e6)
        return self._acquire(us)

    cdef bint _acquire(self, PY_TIMEOUT_T us) except -1:
        """Take the lock, waiting up to ``us`` microseconds (-1: no limit) with the GIL
        released; a signal's handler runs meanwhile (its exception propagates)."""
        cdef int r = sem_trywait(&self._sem), err = 0
        cdef timespec deadline
        if r != 0 and us != 0:
            if us > 0:
                clock_gettime(CLOCK_REALTIME, &deadline)  # sem_timedwait's clock
                deadline.tv_sec += us // 1000000
                deadline.tv_nsec += (us % 1000000) * 1000
                if deadline.tv_nsec >= 1000000000:
                    deadline.tv_sec += 1
                    deadline.tv_nsec -= 1000000000
            while True:
                with nogil:
                    r = sem_wait(&self._sem) if us < 0 else sem_timedwait(&self._sem, &deadline)
                    err = errno
                if r == 0 or err != EINTR:
                    break
                PyErr_CheckSignals()  # a signal's handler runs; its exception propagates
        if r == 0:
            self._held = True
            return True
        return False

    def release(self) -> None:
        """Give the lock back (any thread may).

        Raises:
            RuntimeError: the lock is not held.
        """
        if not self._held:
            raise RuntimeError("release unlocked lock")
        lock_give(self)

    def locked(self) -> bool:
        """True while some thread holds the lock."""
        return self._held

    def __enter__(self) -> bool:
        return self._acquire(-1)

    def __exit__(self, *exc: object) -> None:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        lock_give(self)

    def __reduce__(self) -> NoReturn:
        raise TypeError("cannot pickle a ResourceLock")

    def __repr__(self) -> str:
        return f"<ignis ResourceLock {'locked' if self._held else 'unlocked'}>"


cdef class ReentrantLock:
    """A reentrant lock like ``threading.RLock`` whose ``take`` and ``give`` compiled callers
    reach without a Python call (``with lock:`` costs a few hundred nanoseconds more, in
    lookups and a Python call to ``__exit__``; the sanitizer takes its lock on every
    callback). The holder may take it again; each ``take`` needs one ``give``."""

    def __cinit__(self) -> None:
        self._lk = ResourceLock()
        self._owner = 0
        self._depth = 0

    cpdef int take(self) except -1:
        """Take the lock (again, if this thread holds it), waiting with the GIL released;
        a signal's handler runs while it waits (its exception propagates, the lock not taken)."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if self._depth and self._owner == me:
            self._depth += 1
            return 0
        if not self._lk._acquire(-1):  # an uncontended take is its sem_trywait
            raise RuntimeError("cannot take a ReentrantLock: waiting for it failed")
        self._owner = me
        self._depth = 1
        return 0

    cpdef int give(self) except -1:
        """Give back one ``take`` (the last one frees the lock).

        Raises:
            RuntimeError: this thread does not hold the lock.
        """
        if self._depth <= 0 or self._owner != PyThread_get_thread_ident():
            raise RuntimeError("cannot release a ReentrantLock this thread does not hold")
        self._depth -= 1
        if self._depth == 0:
            self._owner = 0
            lock_give(self._lk)
        return 0

    def held(self) -> bool:
        """True while this thread holds the lock."""
        return self._depth > 0 and self._owner == PyThread_get_thread_ident()

    def __enter__(self) -> None:
        self.take()

    def __exit__(self, *exc: object) -> None:
        self.give()

    def __reduce__(self) -> NoReturn:
        raise TypeError("cannot pickle a ReentrantLock")


cdef class EventPool:
    """Reusable timing-free events of one device and context generation.

    Tracking resources record their cross-stream events from it
    (``event_pool(device)`` gives the shared one). Not locked: its callers hold
    their resource's lock.

    Args:
        device: the ``ig.Device`` whose events it keeps.
    """

    # Fields: see resource.pxd.

    def __init__(self, device: Device) -> None:
        self._backend = device.backend
        self._ordinal = device.ordinal
        self._free: list[int] = []
        self._lock = threading.Lock()
        self.generation = device.state.generation
        self.state = device.state

    @property
    def stale(self) -> bool:
        """True once the context these events belong to was rebuilt (they are gone)."""
        return self.state.generation != self.generation

    def get(self) -> int:
        """A free event handle: a pooled one, else a new one from the backend.

        Raises:
            DriverError: the backend failed to create an event.
        """
        return self.take()

    cdef object take(self):
        if self._free:
            return self._free.pop()
        return self._backend.event_create(self._ordinal, False)

    def put(self, event: int) -> None:
        """Give back an event handle from ``get()`` for reuse.

        Args:
            event: the handle.
        """
        self._free.append(event)

    def close(self) -> None:
        """Destroy every pooled event (errors of the backend are ignored)."""
        while self._free:
            try:
                self._backend.event_destroy(self._free.pop())
            except Exception:
                pass


_pools: dict[tuple[int, int], EventPool] = {}
_pools_lock = threading.Lock()


def event_pool(device: Device) -> EventPool:
    key = (id(device), device.state.generation)
    pool = _pools.get(key)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = EventPool(device)
    return pool


# Every resource made in this process (weakly), for the at-fork handler below.
_resources: "weakref.WeakSet[DeviceMemoryResource]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """os.register_at_fork(after_in_child=...), after the runtime's handler: in a child
    whose devices' contexts are gone (the parent used them), every resource made in the
    parent is closed, so even an allocation its cache could serve takes the slow path,
    which raises ``ForkedProcessError``; its lock, perhaps held by a parent thread at the
    fork, is replaced."""
    for r in list(_resources):
        try:
            if r.device.state.forked_from is None:
                continue
            (<DeviceMemoryResource>r)._closed = True
            lock = getattr(r, "_lock", None)
            if isinstance(r, TrackedResource):  # its lock is a C field, read-only from Python
                (<TrackedResource>r)._lock = ResourceLock()
            elif isinstance(lock, ResourceLock):
                r._lock = ResourceLock()
            elif isinstance(lock, type(_pools_lock)):
                r._lock = threading.Lock()
        except Exception:  # noqa: BLE001 - a half-built resource: nothing to close
            pass


cdef class DeviceMemoryResource:
    """Base of every device memory resource. Thread-safe.

    Subclasses implement ``allocate`` / ``deallocate``; resources that track
    cross-stream uses derive from ``TrackedResource`` instead. The tracking
    methods here raise ``StreamMisuseError``: this base tracks nothing.

    Args:
        device: the ``ig.Device`` (or ordinal) it serves; None for the current device.

    Attributes:
        device: the ``ig.Device`` it serves.
    """

    def __init__(self, device: "Device | int | None" = None) -> None:
        self.device = current_device() if device is None else Device(device)
        self._backend: "Backend" = self.device.backend
        self._generation = self.device.state.generation
        self._closed = False
        _resources.add(self)

    # The base's state is read-only from Python; resources written in Python change it here.
    def _serve_as(self, DeviceMemoryResource upstream not None) -> None:
        """Take ``upstream``'s device, backend and context generation, open (an adaptor
        serves the memory of the resource it wraps)."""
        self.device = upstream.device
        self._backend = upstream._backend
        self._generation = upstream._generation
        self._closed = False

    def _mark_closed(self) -> None:
        """From now on this resource is closed (its ``close()`` does the rest)."""
        self._closed = True

    # -- the contract ------------------------------------------------------
    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        """A new LIVE block of at least ``nbytes`` bytes, ordered on ``stream``.

        The memory may be used on ``stream`` at once; a tracking resource also orders
        uses on other streams after the allocation.

        Args:
            nbytes: the size in bytes, at least 1.
            stream: the ``Stream`` the allocation is ordered on (the block's ``alloc_stream``);
                None for the device's default stream.
            tag: a label shown in logs, statistics and reports.

        Returns:
            The ``DeviceBlock``; hand it back with ``deallocate``.

        Raises:
            TypeError: ``nbytes`` is not an int, or ``stream`` is not a Stream.
            ValueError: ``nbytes`` is below 1, or ``stream`` is on another device.
            OutOfMemoryError: the memory is not there (with the device's and the resource's
                numbers).
            ClosedError: the resource or the stream was closed.
            StaleHandleError: the resource or the stream predates a context rebuild.
            ForkedProcessError: this is a forked child of a process that used the device.
        """
        raise NotImplementedError

    def deallocate(self, block: DeviceBlock) -> None:
        """Hand ``block`` back, ordered on its alloc stream (after the uses a tracking
        resource recorded on other streams). The block is no longer LIVE.

        Args:
            block: a LIVE ``DeviceBlock`` from this resource's ``allocate``.

        Raises:
            TypeError: ``block`` is not a DeviceBlock.
            DoubleFreeError: the block was already deallocated.
            ValueError: the block was not allocated by this resource.
            DriverError: the driver refused the free (or the event record or wait that
                orders it); the block stays LIVE and counted, and a later ``deallocate``
                can free it.
        """
        raise NotImplementedError

    @property
    def device_ordinal(self) -> int:
        """The ordinal of the device it serves."""
        return self.device.ordinal

    @property
    def bytes_outstanding(self) -> int:
        """Bytes live plus retired-but-not-yet-freed."""
        raise NotImplementedError

    def reap_pending(self) -> None:
        """Finish retired frees whose stream work is done and re-count; a no-op where nothing is pending."""

    @property
    def supports_block_use_tracking(self) -> bool:
        """True if the tracking methods (``prepare_block_use``...) work: the resource
        orders cross-stream uses of its blocks. False here."""
        return False

    def live_blocks(self) -> "list[DeviceBlock]":
        """The blocks this resource handed out that are not deallocated yet, a copy (for
        telemetry and tools); empty for a resource that keeps no such map (an adaptor)."""
        return []

    def holds(self, block: DeviceBlock) -> bool:
        """Whether ``block`` is a live block this resource handed out (one its ``deallocate``
        takes). An adaptor answers for its upstream.

        Args:
            block: a ``DeviceBlock``.
        """
        return any(b is block for b in self.live_blocks())

    def _no_tracking(self, op: str) -> StreamMisuseError:
        return StreamMisuseError(
            f"{op} is not supported by {type(self).__name__}: it does not track cross-stream uses. "
            "Allocate from a tracking resource (PoolResource or AsyncResource) or order the streams "
            "yourself with events", resource=type(self).__name__)

    def record_block_use(self, block: "DeviceBlock | BlockId", stream: Stream) -> None:
        """Note that work on ``stream`` touches the block, so its deallocation waits for
        that work. Refused here.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` whose work uses it.

        Raises:
            StreamMisuseError: always: this resource does not track cross-stream uses.
        """
        raise self._no_tracking("record_block_use")

    def note_use(self, block: DeviceBlock, stream: Stream, access: Access, span: tuple | None = None) -> None:
        """A use of ``block`` on its own stream, by a resource that does not track uses (its
        blocks are used on their own stream only): the sanitizer (``hooks.HOOKS.checker``)
        hears of it here, as it hears of a tracked use in ``prepare_block_use``; nothing
        without one. The memory layer is the one place that feeds the sanitizer a block's uses.

        Args:
            block: the ``DeviceBlock`` used.
            stream: the ``Stream`` the use is queued on.
            access: what the use does to the bytes (an ``Access``).
            span: ``(offset, nbytes, op)``: the bytes used and the operation's name; None for
                the whole block.
        """
        chk = _HK.checker
        if chk is not None:
            chk.access(block, stream, access, span)

    def prepare_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access,
                          span: tuple | None = None) -> None:
        """Queue on ``stream`` the waits that a use with ``access`` needs. Refused here.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` the use will be queued on.
            access: what the use does to the bytes (an ``Access``).
            span: ``(offset, nbytes, op)``: the bytes used and the operation's name, for the
                sanitizer; None for the whole block.

        Raises:
            StreamMisuseError: always: this resource does not track cross-stream uses.
        """
        raise self._no_tracking("prepare_block_use")

    def finish_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access) -> None:
        """Record the use just queued on ``stream``. Refused here.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` the use was queued on.
            access: what the use does to the bytes (an ``Access``).

        Raises:
            StreamMisuseError: always: this resource does not track cross-stream uses.
        """
        raise self._no_tracking("finish_block_use")

    # -- helpers -----------------------------------------------------------
    def _stream(self, stream: Stream | None) -> Stream:
        return self.device.default_stream if stream is None else stream

    def _check_alive(self) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__} on device {self.device.ordinal}")
        self._check_context()

    def _check_context(self, block: "DeviceBlock | BlockId | None" = None) -> None:
        """Raise ``StaleHandleError`` (or the backend's fork error) when this resource's context
        was rebuilt since it was made: its addresses may now be another allocation's. ``block``:
        the block of it being used, which the error names."""
        state = self.device.state
        if state.generation == self._generation:
            return
        name = type(self).__name__
        if state.forked_from is not None:
            raise self._backend.forked_error(f"use {name}" if block is None else f"use block {block.ptr:#x}")
        raise StaleHandleError("context rebuilt", what=name if block is None else f"block {block.ptr:#x} of {name}",
                               generation=self._generation, current_generation=state.generation,
                               device_id=self.device.ordinal)

    def _check_dealloc(self, block: DeviceBlock, live: dict) -> None:
        """Raise the right error for a block that is not live here."""
        if not isinstance(block, DeviceBlock):
            raise TypeError(f"deallocate expects a DeviceBlock, got {type(block).__name__}")
        if not block_live(block):
            raise DoubleFreeError(f"block {block.ptr:#x} ({block.bytes} B, tag {block.tag!r}, now "
                                  f"{block.state.name}) was already deallocated", generation=block.generation,
                                  ptr=block.ptr)
        raise ValueError(f"block {block.ptr:#x} (generation {block.generation}) was not allocated by this "
                         f"{type(self).__name__}; deallocate it through the resource that made it")

    def _oom(self, nbytes: int, cause: BaseException | None = None, **numbers: Any) -> OutOfMemoryError:
        while isinstance(cause, OutOfMemoryError) and cause.__cause__ is not None:
            cause = cause.__cause__  # report the driver's words, not a nested report
        try:
            free, total = self._backend.mem_get_info(self.device.ordinal)
        except Exception:
            free = total = None
        return OutOfMemoryError(nbytes, device=self.device.ordinal, device_total=total, device_free=free,
                                detail=str(cause) if cause else "", **numbers)

    # -- shared bookkeeping of resources that keep a live map, a byte count and a lock --
    def _register(self, ptr: int, stream: Stream, nbytes: int, requested: int, tag: str,
                  impl: Any = None) -> DeviceBlock:
        """A new LIVE block for memory just obtained: in the live map, counted, recorded."""
        block = new_block(ptr, stream, nbytes, requested, tag, fresh_generation(), impl)
        with self._lock:
            self._live[ptr] = block
            self._bytes += nbytes
        if _HK.recorder is not None:
            _HK.recorder("alloc", self, ptr, nbytes, stream, block)
        return block

    def _unregister(self, block: DeviceBlock) -> None:
        """Lock held: check ``block`` is live here (else the right error) and forget it."""
        if type(block) is not DeviceBlock or self._live.get(block.ptr) is not block:
            self._check_dealloc(block, self._live)  # raises: not a block, freed, or not from here
        del self._live[block.ptr]
        self._bytes -= block.bytes

    def _reregister(self, block: DeviceBlock) -> None:
        """Undo ``_unregister`` after the driver refused the free (the block stays LIVE)."""
        with self._lock:
            self._relive(block)

    def _relive(self, block: DeviceBlock) -> None:
        """Lock held: ``_reregister``'s work (the block's state never left LIVE: a resource
        moves it only once the free succeeded)."""
        self._live[block.ptr] = block
        self._bytes += block.bytes

    @staticmethod
    def _sanitize_free(block: DeviceBlock) -> None:
        """Let the sanitizer see a free, once the release ordering has been queued."""
        if _HK.checker is not None:
            _HK.checker.free(block)

    def _admit(self, nbytes: Any, stream: Any) -> Stream:
        """The stream an allocation goes on, after checking the request and the stream
        (PoolResource inlines the same checks on its hot path)."""
        if stream is None:
            stream = self.device.default_stream
        if type(nbytes) is not int or nbytes <= 0 or type(stream) is not Stream:
            check_request(nbytes, stream)
        if stream._closed or stream._generation != self._generation or stream.device is not self.device \
                or self._closed:
            self._check_stream(stream)
        return stream

    def _driver_allocate(self, alloc: Any, nbytes: int, stream: Stream, tag: str) -> DeviceBlock:
        """Run the driver allocation ``alloc()``; out of memory becomes OutOfMemoryError
        with the resource's numbers, and the new block is registered."""
        try:
            ptr = alloc()
        except DriverError as e:
            if e.name == "CUDA_ERROR_OUT_OF_MEMORY":
                raise self._oom(nbytes, e, **self.memory_numbers()) from e
            raise
        return self._register(ptr, stream, nbytes, nbytes, tag)

    def _check_stream(self, stream: Any) -> None:
        """The right error for a stream this resource cannot allocate on (slow path)."""
        if not isinstance(stream, Stream):
            check_request(1, stream)
        stream._check()
        self._check_alive()
        if stream.device is not self.device:
            raise ValueError(f"{stream!r} belongs to device {stream.device.ordinal}, but this "
                             f"{type(self).__name__} serves device {self.device.ordinal}")

    def memory_numbers(self) -> dict[str, int]:
        """``live_bytes``, ``cached_bytes``, ``largest_free_block`` for reports."""
        return {"live_bytes": self.bytes_outstanding, "cached_bytes": 0, "largest_free_block": 0}

    def close(self) -> None:
        """Refuse further allocations (``ClosedError``); live blocks can still be deallocated."""
        self._closed = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} device={self.device.ordinal}>"


cdef class TrackedResource(DeviceMemoryResource):
    """A resource that keeps a live map and the per-block hazard record.

    Its tracking methods order cross-stream uses of its blocks (see the module's
    description); subclasses implement ``allocate`` / ``deallocate``.

    Args:
        device: the ``ig.Device`` (or ordinal) it serves; None for the current device.

    Attributes:
        cross_stream_waits: how many stream waits tracking has queued (a statistic).
    """

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        self._lock = ResourceLock()
        self._live: dict[int, DeviceBlock] = {}
        self._events = event_pool(self.device)
        self.cross_stream_waits = 0  # statistics: waits queued by tracking

    @property
    def supports_block_use_tracking(self) -> bool:
        """True: this resource orders cross-stream uses of its blocks."""
        return True

    def live_blocks(self) -> "list[DeviceBlock]":
        """The blocks this resource handed out that are not deallocated yet, a copy."""
        with self._lock:
            return list(self._live.values())

    def holds(self, block: DeviceBlock) -> bool:
        """Whether ``block`` is a live block this resource handed out.

        Args:
            block: a ``DeviceBlock``.
        """
        return type(block) is DeviceBlock and self._live.get((<DeviceBlock>block).ptr) is block

    # -- events ------------------------------------------------------------
    def _record(self, stream: Stream) -> int:
        """An event at the current end of ``stream``; 0 when the stream is gone
        (then the device is synchronized, so everything before is complete)."""
        return self._record_c(_as_stream(stream))

    cdef object _record_c(self, Stream stream):
        dstate = stream.device.state
        if stream._closed or (stream._generation is not dstate.generation and stream._generation != dstate.generation):
            self._backend.device_synchronize(self.device.ordinal)
            return 0
        ev = self._events.take()
        try:
            _queue(self._backend, False, stream.handle, ev)
        except BaseException:
            self._events._free.append(ev)
            raise
        return ev

    def _wait(self, stream: Stream, other: Stream, event: int) -> int:
        """Make ``stream`` wait for ``other`` at ``event`` (recorded now if 0). Returns the event.
        If the wait fails, an event recorded here goes back to the pool (the caller keeps its own)."""
        return self._wait_c(_as_stream(stream), _as_stream(other), event)

    cdef object _wait_c(self, Stream stream, Stream other, object event):
        if not event:
            event = self._record_c(other)
            if not event:
                return 0
            try:
                _queue(self._backend, True, stream.handle, event)
            except BaseException:
                self._events._free.append(event)
                raise
        else:
            _queue(self._backend, True, stream.handle, event)
        self.cross_stream_waits += 1
        return event

    def _resolve(self, block: "DeviceBlock | BlockId") -> DeviceBlock:
        b = self._live.get(block.ptr)
        if b is None or b.generation != block.generation:
            raise UseAfterFreeError(
                f"block {block.ptr:#x} is not live in this {type(self).__name__} (freed, reused or never "
                f"allocated here); the memory may now belong to another allocation",
                generation=block.generation, ptr=block.ptr,
                live_generation=None if b is None else b.generation)
        return b

    # -- tracking ----------------------------------------------------------
    def prepare_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access,
                          span: tuple | None = None) -> None:
        """Queue on ``stream`` the waits that ``access`` needs (under ``auto`` ordering).
        Call before enqueuing the work. ``span`` = (offset, nbytes, op) narrows what
        the sanitizer checks.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` the use will be queued on.
            access: what the use does to the bytes (an ``Access``).
            span: ``(offset, nbytes, op)`` for the sanitizer; None for the whole block.

        Raises:
            UseAfterFreeError: the block is not live here (freed, reused or never allocated here).
            ValueError: ``stream`` is a stream of another device.
            ClosedError: the stream was closed.
            StaleHandleError: the stream predates a context rebuild.
            RaceError: the sanitizer is on in ``raise`` mode and the use races an earlier one.
            OutOfBoundsError: the sanitizer is on in ``raise`` mode and ``span`` leaves the block.
            DriverError: an event record or wait failed.
        """
        self._prepare_c(block, _as_stream(stream), access, span)

    cdef int _prepare_c(self, object block, Stream s, object access, object span) except -1:
        """``prepare_block_use`` after its argument conversion (compiled callers call it directly)."""
        cdef DeviceBlock b
        cdef dict rd
        cdef ResourceLock lk = self._lock
        if s.device is not self.device:
            raise self._foreign_stream(block, s)
        g = s.device.state.generation
        if s._closed or (s._generation is not g and s._generation != g):
            s._check()  # a closed or stale stream: its handle must not reach the driver
        if self._generation is not g and self._generation != g:
            self._check_context(block)  # a block of a rebuilt context: its memory is gone
        lock_take(lk)
        try:
            b = self._live.get((<DeviceBlock>block).ptr if type(block) is DeviceBlock else block.ptr)
            if b is not block and (b is None or b.generation != block.generation):
                b = self._resolve(block)  # raises UseAfterFreeError
            ws = b._write_stream
            if (ws is not s and ws is not None) or (b._readers and _writes(access)):
                if _auto_order(s):
                    if ws is not None and ws is not s:
                        block_keep_write_event(b, self._wait_c(s, <Stream>ws, b._write_event))
                    if b._readers and _writes(access):
                        rd = b._readers
                        for o, ev in rd.items():
                            if o is not s:
                                block_keep_read_event(b, <Stream>o, self._wait_c(s, <Stream>o, ev))
        finally:
            lock_give(lk)
        checker = _HK.checker
        if checker is not None:
            checker.access(b, s, access, span)
        return 0

    def _foreign_stream(self, block: Any, s: Stream) -> ValueError:
        """The error for a use of this device's memory queued on another device's stream (its
        events and waits cannot join the two: the driver refuses an event of one device on a
        stream of another)."""
        tag = getattr(block, "tag", None)
        return ValueError(
            f"memory of device {self.device.ordinal} (block {block.ptr:#x}{f', tag {tag!r}' if tag else ''}) "
            f"cannot be used on {s!r}, a stream of device {s.device.ordinal}: use a stream of device "
            f"{self.device.ordinal} (the array's own, or device.create_stream()), or copy the data to device "
            f"{s.device.ordinal} first (an array there, then copy_ from this one)")

    def finish_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access) -> None:
        """Record the use just enqueued on ``stream``. Call after enqueuing the work.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` the use was queued on.
            access: what the use did to the bytes (an ``Access``).

        Raises:
            UseAfterFreeError: the block is not live here.
            DriverError: the event record failed.
        """
        self._finish_c(block, stream, access)

    cdef int _finish_c(self, object block, object stream, object access) except -1:
        """``finish_block_use`` (compiled callers call it directly)."""
        cdef DeviceBlock b
        cdef ResourceLock lk = self._lock
        lock_take(lk)
        try:
            b = self._live.get((<DeviceBlock>block).ptr if type(block) is DeviceBlock else block.ptr)
            if b is not block and (b is None or b.generation != block.generation):
                b = self._resolve(block)  # raises UseAfterFreeError
            self._finish_locked(b, stream, access)
        finally:
            lock_give(lk)
        return 0

    cdef int _finish_locked(self, DeviceBlock b, object stream, object access) except -1:
        cdef Stream s
        if stream is b.alloc_stream:
            if block_clean_on(b, stream):
                return 0  # clean on this stream: nothing to record (see "Clean" above)
            s = b.alloc_stream
            ev = _ZERO  # on the alloc stream no event is needed until another stream waits
        else:
            s = _as_stream(stream)
            ev = self._record_c(s)
        if _writes(access):
            return block_note_write(b, s, ev, self._events._free)  # supersedes every earlier use
        return block_note_read(b, s, ev, self._events._free)

    def record_block_use(self, block: "DeviceBlock | BlockId", stream: Stream) -> None:
        """Note that work on ``stream`` touches the block, so its deallocation
        waits for that work (queues no wait now). The same as ``finish_block_use``
        with ``Access.READ``.

        Args:
            block: the ``DeviceBlock`` or its ``BlockId``.
            stream: the ``Stream`` whose work uses it.

        Raises:
            UseAfterFreeError: the block is not live here.
            DriverError: the event record failed.
        """
        self.finish_block_use(block, stream, _READ)

    def _order_release(self, DeviceBlock b) -> None:
        """Make the alloc stream wait for every recorded use from another stream,
        then return the block's events to the pool. Caller holds the lock.

        If a driver call fails, the hazard record stays whole (events recorded so far
        are kept in it, none goes back to the pool) and the error propagates: the
        caller can put the block back as it was (``_restore_live``)."""
        self._order_release_c(b)

    cdef int _order_release_c(self, DeviceBlock b) except -1:
        cdef Stream a = b.alloc_stream
        cdef dict rd
        cdef list free
        ws = b._write_stream
        order = _auto_order(a)
        if order and a._closed and ((ws is not None and ws is not a) or b._readers):
            # The alloc stream is gone, so nothing can be queued on it: wait for
            # every use on the host instead (a rare path).
            self._backend.device_synchronize(self.device.ordinal)
            order = False
        if order:
            if ws is not None and ws is not a:
                block_keep_write_event(b, self._wait_c(a, <Stream>ws, b._write_event))
            if b._readers:
                rd = b._readers
                for o, ev in rd.items():
                    if o is not a:
                        block_keep_read_event(b, <Stream>o, self._wait_c(a, <Stream>o, ev))
        return block_drop_record(b, self._events._free)

    @staticmethod
    def _reset_record_after_release(DeviceBlock b) -> None:
        """A block whose release was ordered (``_order_release`` returned) but whose free
        then failed: its alloc stream already waits for every earlier use, so it counts as
        last written there (no event yet), which orders any later use after all of them."""
        block_restore_record(b)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
