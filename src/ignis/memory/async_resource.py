"""AsyncResource: the driver's stream-ordered memory pool (cuMemAllocAsync / cuMemFreeAsync).

Tracks cross-stream uses with events (see ``resource.py``). A deallocated
block is RETIRED: its free is queued on its alloc stream, and its bytes stay
counted in ``bytes_outstanding`` (as ``cached_bytes`` in ``memory_numbers``)
only until the stream reaches the free; then it is FREED.

Reaping, without a host synchronization: every report (``bytes_outstanding``,
``memory_numbers()``, so out-of-memory messages and memory statistics too)
looks at each stream with queued frees: an idle stream (``stream_query``)
has done them all; otherwise the frees not yet covered by an event get one,
recorded now, and the events of earlier reports are queried (never waited
for), oldest first; the frees before a completed event are done. Deallocate does
the same every ``REAP_BATCH`` frees of a stream, so the record of queued frees
stays small in a program that never asks. A stream closed with uncovered
frees gets its event from a close hook; ``reap_pending()`` synchronizes the
streams with queued frees and finishes them all. A report whose event record
or query fails (a broken context) leaves the frees counted as queued: the
figures then over-state, never under-state, what is held.

A driver free that fails (``cuMemFreeAsync`` / ``cuMemFree``, or an event
record or wait that orders it) leaves the block LIVE, its hazard record
sound and every counter as it was, and raises the driver's error: a later
``deallocate`` can free it. ``trim()`` hands the pool's unused memory back
to the system.
"""

from __future__ import annotations

from collections import deque

from ..errors import UnsupportedError
from ..runtime import Device, Stream
from ..runtime.stream import add_close_hook
from .hooks import HOOKS as _HOOKS
from .resource import TrackedResource
from .types import UNTAGGED, BlockState
from .block import DeviceBlock

__all__ = ["AsyncResource", "REAP_BATCH"]

REAP_BATCH = 256  # frees of one stream between two events that mark them (in deallocate)


class _Queued:
    """Frees queued on one stream: ``fresh`` ones no event covers yet, then
    ``marked`` batches ``(event, blocks)``, oldest first, each complete once its
    event (recorded after them on the stream) has been reached."""

    __slots__ = ("fresh", "marked")

    def __init__(self) -> None:
        self.fresh: list[DeviceBlock] = []
        self.marked: deque[tuple[int, list[DeviceBlock]]] = deque()


class AsyncResource(TrackedResource):
    """Stream-ordered allocation from the device's default memory pool.

    Args:
        device: the ``ig.Device`` (or ordinal) it serves; None for the current device.

    Raises:
        UnsupportedError: the device has no stream-ordered memory pools.
    """

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        if not self.device.capabilities.get("memory_pools", False):
            raise UnsupportedError(f"stream-ordered memory pools on device {self.device.ordinal}",
                                   self._backend.name, "use DirectResource (or PoolResource(DirectResource()))")
        self._bytes = 0
        self._pending: dict[Stream, _Queued] = {}
        self._pending_bytes = 0
        add_close_hook(self._on_stream_close)

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        stream = self._admit(nbytes, stream)
        return self._driver_allocate(
            lambda: self._backend.mem_alloc_async(self.device.ordinal, nbytes, stream.handle), nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock) -> None:
        with self._lock:
            self._unregister(block)
            if self.device.state.generation != self._generation:
                block.transition(BlockState.FREED)  # the context that held it is gone
                return
            stream = block.alloc_stream
            try:
                if stream._closed:
                    # The alloc stream is gone: order the free after everything on the device.
                    self._backend.device_synchronize(self.device.ordinal)
                    self._backend.mem_free(self.device.ordinal, block.ptr)
                    block.transition(BlockState.FREED)
                    self._sanitize_free(block)
                    return
                self._order_release(block)
                self._backend.mem_free_async(self.device.ordinal, block.ptr, stream.handle)
            except BaseException:
                # The driver refused: the block stays LIVE and counted, usable, freeable again.
                self._reset_record_after_release(block)
                self._relive(block)
                raise
            block.transition(BlockState.RETIRED)
            q = self._pending.get(stream)
            if q is None:
                q = self._pending[stream] = _Queued()
            q.fresh.append(block)
            self._pending_bytes += block.bytes
            if len(q.fresh) >= REAP_BATCH:
                # Keep the record of queued frees short: one event per batch, queried, never waited for.
                self._reap_stream(stream, q)
        rec = _HOOKS.recorder
        if rec is not None:
            rec("free_requested", self, block.ptr, block.bytes, stream, block)
            # The driver's pool may hand the address out again at once, in stream
            # order, so for the trace the free is complete now (as in PoolResource).
            rec("free_completed", self, block.ptr, block.bytes, stream, block)
        self._sanitize_free(block)

    # -- queued frees ------------------------------------------------------------
    def _finish(self, blocks: list[DeviceBlock]) -> None:
        """Lock held: these frees are complete."""
        for b in blocks:
            b.transition(BlockState.FREED)
            self._pending_bytes -= b.bytes

    def _drop_queue(self, q: _Queued, events_valid: bool) -> None:
        """Lock held: every free of ``q`` is complete (or its context is gone)."""
        for ev, blocks in q.marked:
            self._finish(blocks)
            if events_valid:
                self._events.put(ev)
        q.marked.clear()
        self._finish(q.fresh)
        q.fresh = []

    def _reap_stream(self, stream: Stream, q: _Queued) -> bool:
        """Lock held. Cover ``q``'s fresh frees with an event, and finish the batches whose
        event was reached, with queries only. Returns False when ``q`` is empty now.
        A failing record or query leaves the frees counted as queued."""
        gen = self.device.state.generation
        if stream._generation != gen or self._generation != gen:
            self._drop_queue(q, False)  # a rebuilt context took the memory with it
            return False
        backend = self._backend
        try:
            if q.fresh and not stream._closed:
                if backend.stream_query(stream.handle):  # the stream is idle: every free on it is done
                    self._drop_queue(q, True)
                    return False
                ev = self._record(stream)
                q.marked.append((ev, q.fresh))
                q.fresh = []
            while q.marked:
                ev, blocks = q.marked[0]
                if ev and not backend.event_query(ev):
                    break
                q.marked.popleft()
                self._finish(blocks)
                if ev:
                    self._events.put(ev)
        except Exception:  # noqa: BLE001 - a broken context: the frees stay counted as queued
            pass
        return bool(q.fresh or q.marked)

    def _reap(self) -> None:
        """Lock held: ``_reap_stream`` for every stream with queued frees."""
        for stream, q in list(self._pending.items()):
            if not self._reap_stream(stream, q):
                del self._pending[stream]

    def _on_stream_close(self, stream: Stream) -> None:
        """Cover the frees still queued on a closing stream with a last event (after
        that, nothing can be recorded on it). Never blocks: this may run from the
        garbage collector while this thread holds the lock; then they wait for
        ``reap_pending()``."""
        if stream not in self._pending or not self._lock.acquire(blocking=False):
            return
        try:
            q = self._pending.get(stream)
            if q is not None and q.fresh:
                self._reap_stream(stream, q)
        finally:
            self._lock.release()

    def reap_pending(self) -> None:
        """Synchronize the streams that have queued frees, then count those bytes as freed.
        If a synchronization fails, its stream's frees (and those of the streams not yet
        reached) stay queued and counted, and the error is raised."""
        with self._lock:
            pending, self._pending = self._pending, {}
        error: BaseException | None = None
        for stream, q in pending.items():
            gen = self.device.state.generation
            live = stream._generation == gen and self._generation == gen
            if live and error is None:
                try:
                    if not stream._closed:
                        self._backend.stream_synchronize(stream.handle)
                    elif q.fresh or q.marked:
                        self._backend.device_synchronize(self.device.ordinal)
                except BaseException as exc:
                    error = exc
            with self._lock:
                if live and error is not None:
                    self._requeue(stream, q)
                else:
                    self._drop_queue(q, live)
        if error is not None:
            raise error

    def _requeue(self, stream: Stream, q: _Queued) -> None:
        """Lock held: put ``q`` back in front of frees queued on ``stream`` since."""
        now = self._pending.get(stream)
        if now is None:
            self._pending[stream] = q
            return
        now.marked.extendleft(reversed(q.marked))
        now.fresh[:0] = q.fresh  # a later event covers them too

    @property
    def bytes_outstanding(self) -> int:
        """Bytes live plus bytes whose free is still queued (completed frees are reaped first)."""
        if self._pending:
            with self._lock:
                self._reap()
        return self._bytes + self._pending_bytes

    @property
    def bytes_pending_free(self) -> int:
        """Bytes whose free is queued and not known to be complete (reaped first)."""
        if self._pending:
            with self._lock:
                self._reap()
        return self._pending_bytes

    def trim(self, keep_bytes: int = 0) -> None:
        """Return the driver pool's unused memory to the system.

        Args:
            keep_bytes: the bytes the pool may keep reserved.

        Raises:
            DriverError: the driver refused the trim.
        """
        self._backend.mem_pool_trim(self.device.ordinal, keep_bytes)

    def memory_numbers(self) -> dict[str, int]:
        with self._lock:
            if self._pending:
                self._reap()
            return {"live_bytes": self._bytes, "cached_bytes": self._pending_bytes, "largest_free_block": 0}
