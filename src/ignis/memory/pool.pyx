"""PoolResource: a caching allocator over any upstream resource.

Design:
- Requests are rounded up to 512 bytes. Small requests (<= 1 MiB) are carved
  from 2 MiB segments; large ones from 20 MiB segments (<= 10 MiB) or from
  a segment of their own size rounded to 2 MiB.
- Free blocks live in per-stream free lists, each a sorted list of keys
  ``size << 64 | ptr`` (best fit is one bisect) plus a key -> block map.
- A block is split when the remainder is worth keeping (512 B small, 1 MiB
  large). Freed neighbours are coalesced lazily: when a request misses, and
  on ``trim()``; so the common free-then-allocate-the-same-size cycle makes
  no split and no merge.
- Reuse on the stream that freed a block needs nothing (stream order). Reuse
  on another stream records an event on the freeing stream and queues a wait
  on the new stream: never a host synchronization on the hot path.
- The pool tracks cross-stream uses itself (``TrackedResource``), whatever
  its upstream does; deallocate makes the alloc stream wait for the block's
  uses on other streams before the block goes back on its free list.
- On out-of-memory the pool returns its cache upstream and retries once.
- A refused free never loses memory: if ordering a block's release fails
  (an event record or wait), ``deallocate`` leaves the block LIVE and counted
  and raises; if the upstream refuses to free a segment (``trim``, ``close``,
  the out-of-memory retry), the segment stays cached with its free pieces and
  the error is raised, so a later ``trim`` can release it.
"""

from __future__ import annotations

import bisect
import os
import threading
import types
import warnings
from typing import Any

from ..errors import DriverError, OutOfMemoryError
from ..runtime import Device, current_device
from ..runtime.stream cimport Stream
from ..runtime.stream import add_close_hook
from .resource import DeviceMemoryResource, check_request
from .resource cimport TrackedResource, EventPool, ResourceLock, lock_take, lock_give
from .hooks cimport Hooks
from .hooks import HOOKS as _HOOKS
from .types import UNTAGGED
from .upstream import default_upstream
from .block cimport (BLOCK_FREED, BLOCK_RETIRED, DeviceBlock, block_drop_record, block_move, block_only_on,
                     block_restore_record, fresh_generation, new_block)

cdef extern from "Python.h":
    Py_ssize_t _as_ssize "PyLong_AsSsize_t"(object) noexcept
    void PyErr_Clear()

__all__ = ["PoolResource"]

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields
# Requests up to this many bytes take the compiled arithmetic (far beyond any device).
cdef enum:
    _C_SMALL_MAX = 1 << 20
cdef Py_ssize_t _SIZE_LIMIT = (<Py_ssize_t>1) << 60


cdef inline DeviceBlock _new_block(object ptr, Stream stream, object nbytes, object requested, object tag,
                                   object impl):
    """A new LIVE DeviceBlock with the next generation (block.pxd's ``new_block``)."""
    return new_block(ptr, stream, nbytes, requested, tag, fresh_generation(), impl)

_ALIGN = 512
_SMALL_MAX = 1 << 20
_SMALL_SEGMENT = 2 << 20
_LARGE_SEGMENT = 20 << 20
_LARGE_DIRECT = 10 << 20
_ROUND_LARGE = 2 << 20
_MIN_SPLIT_SMALL = _ALIGN
_MIN_SPLIT_LARGE = 1 << 20


cdef class _Segment:

    def __init__(self, block: DeviceBlock, size: int, small: bool) -> None:
        self.block = block
        self.ptr = block.ptr
        self.size = size
        self.small = small


cdef class _Block:
    """A range of a segment: handed out or free on one stream's list."""


    def __init__(self, ptr: int, size: int, seg: _Segment, prev: "_Block | None", nxt: "_Block | None",
                 stream: Stream) -> None:
        self.ptr = ptr
        self.size = size
        self.seg = seg
        self.prev = prev
        self.next = nxt
        self.free = False
        self.stream = stream


cdef class _SizeClass:
    """Free blocks of one size class: exact-size bins (LIFO) plus the sorted list
    of sizes that have (or recently had) a bin, for best fit."""


    def __init__(self) -> None:
        self.bins: dict[int, list[_Block]] = {}
        self.sizes: list[int] = []

    def best(self, size: int) -> list[_Block] | None:
        """The non-empty bin of the smallest size >= ``size``."""
        bins, sizes = self.bins, self.sizes
        i = bisect.bisect_left(sizes, size)
        empties = 0
        while i < len(sizes):
            b = bins[sizes[i]]
            if b:
                break
            empties += 1
            i += 1
        else:
            b = None
        if empties > 8:  # forget sizes whose bins stay empty
            self.sizes = [sz for sz in sizes if bins[sz]]
            for sz in [sz for sz, lst in bins.items() if not lst]:
                del bins[sz]
        return b


cdef class _FreeList:
    """Free blocks of one stream, by size class."""


    def __init__(self) -> None:
        self.small = _SizeClass()
        self.large = _SizeClass()
        self.count = 0
        self.dirty = False  # some free blocks may have free neighbours (coalescing pending)

    def add(self, _Block b) -> None:
        cls = self.small if b.seg.small else self.large
        lst = cls.bins.get(b.size)
        if lst is None:
            cls.bins[b.size] = [b]
            bisect.insort(cls.sizes, b.size)
        else:
            lst.append(b)
        b.free = True
        self.count += 1

    def remove(self, _Block b) -> None:
        (self.small if b.seg.small else self.large).bins[b.size].remove(b)
        b.free = False
        self.count -= 1

    def take(self, size: int, small: bool) -> _Block | None:
        cdef _Block b
        cls = self.small if small else self.large
        lst = cls.bins.get(size) or cls.best(size)
        if not lst:
            return None
        b = lst.pop()
        b.free = False
        self.count -= 1
        return b

    def best_size(self, size: int, small: bool) -> int | None:
        lst = (self.small if small else self.large).best(size)
        return lst[-1].size if lst else None

    @property
    def blocks(self) -> list[_Block]:
        return [b for cls in (self.small, self.large) for lst in cls.bins.values() for b in lst]

    def largest(self) -> int:
        return max((sz for cls in (self.small, self.large) for sz, lst in cls.bins.items() if lst), default=0)

    def __len__(self) -> int:
        return self.count


def _segment_size(size: int) -> tuple[int, bool]:
    if size <= _SMALL_MAX:
        return _SMALL_SEGMENT, True
    if size <= _LARGE_DIRECT:
        return _LARGE_SEGMENT, False
    return (size + _ROUND_LARGE - 1) // _ROUND_LARGE * _ROUND_LARGE, False


cdef class PoolResource(TrackedResource):
    """Caching allocator with per-stream free lists over ``upstream``.

    The default resource of every device (``ig.get_current_resource``). It tracks
    cross-stream uses itself, whatever ``upstream`` does, and reuses a block freed
    on another stream only behind an event wait (see the module's description).

    Args:
        upstream: the resource segments come from; None: ``AsyncResource`` where the
            device has stream-ordered memory pools, else ``DirectResource``.
        device: with no ``upstream``, the device (or ordinal) for the default upstream;
            None for the current device. The pool serves ``upstream``'s device.

    Attributes:
        upstream: the resource segments come from.
        num_alloc_retries: allocations retried after handing the cache back on out-of-memory.
        num_ooms: allocations that failed even after that retry.
        num_segment_allocs: segments obtained from ``upstream``.
        num_segment_frees: segments handed back to ``upstream``.
    """


    def __init__(self, upstream: DeviceMemoryResource | None = None, *, device: "Device | int | None" = None) -> None:
        if upstream is None:
            upstream = default_upstream(current_device() if device is None else Device(device))
        super().__init__(upstream.device)
        self.upstream = upstream
        self._state = self.device.state  # its generation moves when the context is rebuilt
        self._free: dict[Stream, _FreeList] = {}
        self._segments: dict[int, _Segment] = {}
        self._live_bytes = 0
        self._reserved = 0
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_segment_allocs = 0
        self.num_segment_frees = 0
        self._final: dict[Stream, int] = {}  # closed stream -> event recorded just before it closed
        add_close_hook(self._on_stream_close)

    # -- hot path ------------------------------------------------------------
    def allocate(self, nbytes: int, stream_: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        return self._allocate_c(nbytes, stream_, tag)

    cdef DeviceBlock _allocate_c(self, object nbytes, object stream_, object tag):
        """``allocate`` (the array layer calls it directly for a plain PoolResource)."""
        cdef Stream stream
        cdef _FreeList fl
        cdef _SizeClass cls
        cdef _Block b
        cdef list lst
        cdef DeviceBlock block
        cdef Py_ssize_t n, size
        cdef bint small
        cdef ResourceLock lk
        if stream_ is None:
            stream_ = self.device.default_stream
        if type(nbytes) is not int or type(stream_) is not Stream:
            check_request(nbytes, stream_)
        n = _as_ssize(nbytes)
        if n <= 0 or n > _SIZE_LIMIT:
            if n == -1:
                PyErr_Clear()  # out of Py_ssize_t range
            if nbytes <= 0:
                check_request(nbytes, stream_)
            return self._allocate_huge(nbytes, stream_, tag)
        stream = <Stream>stream_
        if stream._closed or (stream._generation is not self._generation and stream._generation != self._generation) \
                or stream.device is not self.device or self._closed:
            self._check_stream(stream)
        size = (n + 511) & ~(<Py_ssize_t>511)
        small = size <= _C_SMALL_MAX
        size_obj = size
        lk = self._lock
        lock_take(lk)
        try:
            fl = self._free.get(stream)
            b = None
            if fl is not None:
                cls = fl.small if small else fl.large
                lst = cls.bins.get(size_obj)
                if lst:  # the common case: a block of exactly this size, freed on this stream
                    b = lst.pop()
                    b.free = False
                    fl.count -= 1
                else:
                    b = fl.take(size_obj, small)
                    if b is not None:
                        self._split_if_worth(b, size_obj, small)
            if b is None:
                b = self._slow_take(size_obj, small, stream)
                self._split_if_worth(b, size_obj, small)
            block = _new_block(b.ptr, stream, b.size, nbytes, tag, b)
            self._live[b.ptr] = block
            self._live_bytes += b.size
        finally:
            lock_give(lk)
        rec = _HK.recorder
        if rec is not None:
            rec("alloc", self, b.ptr, b.size, stream, block)
        return block

    cdef int _split_if_worth(self, _Block b, object size, bint small) except -1:
        if b.size != size and b.size - size >= (_MIN_SPLIT_SMALL if small else _MIN_SPLIT_LARGE):
            self._split(b, size)
        return 0

    def _allocate_huge(self, nbytes: int, stream_: Stream, tag: str) -> DeviceBlock:
        """``allocate`` for a request beyond the compiled path's sizes (its arithmetic on
        Python ints): the same steps, which end in the upstream's out-of-memory error."""
        cdef Stream stream = <Stream>stream_
        cdef _FreeList fl
        cdef _Block b
        cdef DeviceBlock block
        if stream._closed or stream._generation != self._generation or stream.device is not self.device \
                or self._closed:
            self._check_stream(stream)
        size = (nbytes + 511) & -512
        small = size <= _SMALL_MAX
        with self._lock:
            fl = self._free.get(stream)
            b = fl.take(size, small) if fl is not None else None
            if b is None:
                b = self._slow_take(size, small, stream)
            self._split_if_worth(b, size, small)
            block = _new_block(b.ptr, stream, b.size, nbytes, tag, b)
            self._live[b.ptr] = block
            self._live_bytes += b.size
        rec = _HK.recorder
        if rec is not None:
            rec("alloc", self, b.ptr, b.size, stream, block)
        return block

    def deallocate(self, block_: DeviceBlock) -> None:
        self._deallocate_c(block_)

    cdef int _deallocate_c(self, object block_) except -1:
        """``deallocate`` (the array layer calls it directly for a plain PoolResource)."""
        cdef DeviceBlock block
        cdef _FreeList fl
        cdef _Block b
        cdef list lst
        cdef ResourceLock lk
        if type(block_) is not DeviceBlock:
            self._check_dealloc(block_, self._live)
        block = <DeviceBlock>block_
        lk = self._lock
        lock_take(lk)
        try:
            ptr = block.ptr
            if self._live.get(ptr) is not block:
                self._check_dealloc(block, self._live)
            del self._live[ptr]
            b = block._impl
            size = b.size
            self._live_bytes -= size
            g = self._state.generation
            if g is not self._generation and g != self._generation:
                block_move(block, BLOCK_FREED)
                return 0
            stream = block.alloc_stream
            if block_only_on(block, stream):
                block_drop_record(block, self._events._free)  # every use was on its own stream
            else:
                try:
                    self._order_release_c(block)
                except BaseException:
                    # A refused event record or wait: the block stays LIVE and counted.
                    block_restore_record(block)
                    self._live[ptr] = block
                    self._live_bytes += size
                    raise
            b.stream = stream
            fl = self._free.get(stream)
            if fl is None:
                fl = self._free[stream] = _FreeList()
            lst = (fl.small if b.seg.small else fl.large).bins.get(size)
            if lst is not None:
                lst.append(b)
                b.free = True
                fl.count += 1
            else:
                fl.add(b)
            if (b.prev is not None and b.prev.free) or (b.next is not None and b.next.free):
                fl.dirty = True
            block_move(block, BLOCK_RETIRED)
        finally:
            lock_give(lk)
        rec = _HK.recorder
        if rec is not None:
            rec("free_requested", self, ptr, size, stream, block)
            rec("free_completed", self, ptr, size, stream, block)  # reusable at once, in order
        checker = _HK.checker
        if checker is not None:
            checker.free(block)  # after the release ordering was queued
        return 0

    # -- slow paths (lock held) ---------------------------------------------------
    def _slow_take(self, size: int, small: bool, stream: Stream) -> _Block:
        if self._generation != self.device.state.generation or self._closed:
            self._check_alive()
        fl = self._free.get(stream)
        if fl is not None and fl.dirty:
            self._coalesce(fl)
            b = fl.take(size, small)
            if b is not None:
                return b
        b = self._steal(size, small, stream)
        if b is not None:
            return b
        return self._grow(size, small, stream)

    def _steal(self, size: int, small: bool, stream: Stream) -> _Block | None:
        """Best fit from another stream's free list, behind an event wait on ``stream``."""
        cdef _Block b
        cdef _FreeList fl
        best: tuple[int, _FreeList, Stream] | None = None
        for owner, fl in self._free.items():
            if owner is stream or not fl.count:
                continue
            if fl.dirty:
                self._coalesce(fl)
            found = fl.best_size(size, small)
            if found is not None and (best is None or found < best[0]):
                best = (found, fl, owner)
        if best is None:
            return None
        _, fl, owner = best
        b = fl.take(size, small)
        final = self._final.get(owner)
        if final is not None:
            self._backend.stream_wait_event(stream.handle, final)
            self.cross_stream_waits += 1
            if not fl.count:  # nothing left from the closed stream
                del self._free[owner]
                self._events.put(self._final.pop(owner))
        else:
            ev = self._wait_c(stream, <Stream>owner, 0)
            if ev:
                self._events.put(ev)
        b.stream = stream
        return b

    def _on_stream_close(self, stream: Stream) -> None:
        """Record a final event on a closing stream that still has cached blocks, so
        they can be reused on other streams behind a wait instead of a device sync."""
        # Never block here: a stream can be closed by the garbage collector while
        # this thread holds the pool's lock. Then the fallback (a device sync at
        # reuse) applies.
        if not self._lock.acquire(blocking=False):
            return
        try:
            fl = self._free.get(stream)
            if fl is None or not fl.count or stream in self._final:
                return
            ev = self._events.get()
            self._backend.event_record(ev, stream.handle)
            self._final[stream] = ev
        finally:
            self._lock.release()

    def _grow(self, size: int, small: bool, stream: Stream) -> _Block:
        seg_size, seg_small = _segment_size(size)
        try:
            up = self._upstream_allocate(seg_size, stream)
        except (OutOfMemoryError, DriverError) as e:
            if isinstance(e, DriverError) and e.name != "CUDA_ERROR_OUT_OF_MEMORY":
                raise
            # Free the cache and retry once.
            self.num_alloc_retries += 1
            self._release_cached()
            self.upstream.reap_pending()  # the OOM path may wait: let queued frees land
            try:
                up = self._upstream_allocate(seg_size, stream)
            except (OutOfMemoryError, DriverError) as e2:
                if isinstance(e2, DriverError) and e2.name != "CUDA_ERROR_OUT_OF_MEMORY":
                    raise
                self.num_ooms += 1
                rec = _HK.recorder
                if rec is not None:
                    rec("oom", self, 0, size, stream, None)
                raise self._oom(size, e2, **self._numbers_locked()) from e2
        seg = _Segment(up, seg_size, seg_small)
        self._segments[seg.ptr] = seg
        self._reserved += seg_size
        self.num_segment_allocs += 1
        rec = _HK.recorder
        if rec is not None:
            rec("segment_alloc", self, seg.ptr, seg_size, stream, up)
        return _Block(seg.ptr, seg_size, seg, None, None, stream)

    def _upstream_allocate(self, seg_size: int, stream: Stream) -> DeviceBlock:
        return self.upstream.allocate(seg_size, stream, "ignis.pool.segment")

    def _split(self, _Block b, size: int) -> None:
        cdef _FreeList fl
        rest = _Block(b.ptr + size, b.size - size, b.seg, b, b.next, b.stream)
        if b.next is not None:
            b.next.prev = rest
        b.next = rest
        b.size = size
        fl = self._free.get(b.stream)
        if fl is None:
            fl = self._free[b.stream] = _FreeList()
        fl.add(rest)

    def _coalesce(self, _FreeList fl) -> None:
        """Merge adjacent free blocks of this free list's stream."""
        cdef _Block b, nxt
        fl.dirty = False
        for b in fl.blocks:
            if not b.free or (b.prev is not None and b.prev.free and b.prev.stream is b.stream):
                continue  # merged already, or not the head of a free run
            nxt = b.next
            if nxt is None or not nxt.free or nxt.stream is not b.stream:
                continue
            fl.remove(b)
            while nxt is not None and nxt.free and nxt.stream is b.stream:
                fl.remove(nxt)
                b.size += nxt.size
                b.next = nxt.next
                if nxt.next is not None:
                    nxt.next.prev = b
                nxt = b.next
            fl.add(b)

    def _release_cached(self) -> int:
        """Return every segment with no live block upstream, whichever streams its
        free pieces are on. Lock held. Returns bytes released. If the upstream refuses
        a free, that segment and those not reached yet stay cached, and the error is
        raised once the segments released so far are accounted for."""
        free_by_seg: dict[_Segment, list[tuple[_Block, _FreeList]]] = {}
        for fl in self._free.values():
            for b in fl.blocks:
                free_by_seg.setdefault(b.seg, []).append((b, fl))
        released = 0
        failure: BaseException | None = None
        for seg, pieces in free_by_seg.items():
            if sum(b.size for b, _ in pieces) != seg.size:
                continue  # some of it is live
            up = seg.block
            owners = {b.stream for b, _ in pieces}
            try:
                for owner in owners:
                    if owner is up.alloc_stream:
                        continue
                    final = self._final.get(owner)
                    if final is not None and not up.alloc_stream._closed:
                        self._backend.stream_wait_event(up.alloc_stream.handle, final)
                    elif self.upstream.supports_block_use_tracking:
                        self.upstream.record_block_use(up, owner)
                    elif not owner._closed:
                        self._backend.stream_synchronize(owner.handle)
                self.upstream.deallocate(up)
            except BaseException as exc:
                # The upstream refused the free: the segment stays cached, its free pieces
                # where they were (reusable, and released by a later trim), the counters true.
                failure = exc
                break
            for b, fl in pieces:
                fl.remove(b)
            del self._segments[seg.ptr]
            self._reserved -= seg.size
            self.num_segment_frees += 1
            released += seg.size
            rec = _HK.recorder
            if rec is not None:
                rec("segment_free", self, seg.ptr, seg.size, up.alloc_stream, up)
        for owner in [o for o, fl in self._free.items() if not fl.count]:
            del self._free[owner]
            final = self._final.pop(owner, None)
            if final is not None:
                self._events.put(final)
        if failure is not None:
            raise failure
        return released

    # -- public queries and maintenance -------------------------------------------
    def trim(self) -> int:
        """Return all cached memory that no live block uses to the upstream resource.
        Returns the number of bytes released."""
        with self._lock:
            released = self._release_cached()
        trim_up = getattr(self.upstream, "trim", None)
        if trim_up is not None:
            trim_up()
        return released

    @property
    def bytes_outstanding(self) -> int:
        """Bytes of live blocks, by block size (requests rounded up to 512 bytes, or more where a
        cached block was not worth splitting)."""
        return self._live_bytes

    @property
    def bytes_reserved(self) -> int:
        """Bytes held from the upstream resource (live + cached)."""
        return self._reserved

    @property
    def bytes_cached(self) -> int:
        """Bytes held from the upstream resource that no live block uses (``bytes_reserved - bytes_outstanding``)."""
        return self._reserved - self._live_bytes

    def _numbers_locked(self) -> dict[str, int]:
        largest = max((fl.largest() for fl in self._free.values()), default=0)
        return {"live_bytes": self._live_bytes, "cached_bytes": self._reserved - self._live_bytes,
                "largest_free_block": largest}

    def memory_numbers(self) -> dict[str, int]:
        with self._lock:
            return self._numbers_locked()

    def reap_pending(self) -> None:
        self.upstream.reap_pending()

    def segments(self) -> list[dict[str, Any]]:
        """The pool's segments and their blocks, in address order (for snapshots, telemetry and
        tests). Each segment: ``ptr``, ``size``, ``small`` (carved for requests of 1 MiB or
        less), ``stream`` (the id of the stream it was allocated on) and ``stream_handle``,
        and ``blocks``: each ``ptr``, ``size``, ``free``, ``stream`` (an id) and, for a
        block handed out, ``block`` (the ``DeviceBlock``; None for a free one)."""
        with self._lock:
            blocks: dict[int, list] = {ptr: [] for ptr in self._segments}
            for live in self._live.values():
                blocks[live._impl.seg.ptr].append((live._impl, live))
            for fl in self._free.values():
                for b in fl.blocks:
                    blocks[b.seg.ptr].append((b, None))
            out = []
            for ptr, seg in self._segments.items():
                out.append({"ptr": ptr, "size": seg.size, "small": seg.small,
                            "stream": seg.block.alloc_stream.id, "stream_handle": seg.block.alloc_stream.handle,
                            "blocks": [{"ptr": b.ptr, "size": b.size, "free": b.free, "stream": b.stream.id,
                                        "block": blk}
                                       for b, blk in sorted(blocks[ptr], key=lambda e: e[0].ptr)]})
            return out

    def small_block(self, block: DeviceBlock) -> bool:
        """Whether ``block`` (one this pool handed out) was carved from a segment for small
        requests (1 MiB or less).

        Raises:
            ValueError: the block is not one of this pool's.
        """
        impl = block._impl if type(block) is DeviceBlock else None
        if type(impl) is not _Block or self._segments.get((<_Block>impl).seg.ptr) is not (<_Block>impl).seg:
            raise ValueError(f"{block!r} is not a block of this PoolResource")
        return (<_Block>impl).seg.small

    def close(self) -> None:
        """Release the cache upstream; live blocks stay valid until deallocated."""
        self.trim()
        super().close()

    def __repr__(self) -> str:
        return (f"<PoolResource device={self.device.ordinal} live={self._live_bytes} "
                f"reserved={self._reserved} upstream={type(self.upstream).__name__}>")


