"""VmmResource: device memory that another process can map (seeds/002).

Design:
- Every allocation is its own physical allocation (``vmm_create``, exportable
  as a POSIX file descriptor), rounded up to the allocation granularity that
  the driver reports (queried once, never assumed), reserved, mapped and made
  accessible to the device. ``block.bytes`` is the rounded size;
  ``bytes_outstanding`` counts exactly those bytes.
- The resource keeps each block's physical handle, so ``export_fd(block)``
  can hand out a new file descriptor for it at any time while it is live.
  The driver's export runs once per block; its fd is kept (closed when the
  block is freed) and every export returns a duplicate of it.
- Cross-stream uses are tracked (``TrackedResource``). ``deallocate`` orders
  the block's alloc stream after every recorded use on other streams, then
  synchronizes it before unmapping: an unmap does not order itself against
  queued work, and a kernel reading unmapped memory faults the context. So a
  free here costs a host synchronization (this resource is for memory to be
  shared, not for the hot allocate / free path). Under ``manual`` ordering
  every stream that used the block is synchronized instead.
- Freeing the exporter's block unmaps it here and releases its handle; the
  physical memory lives on while an importer maps it or an exported fd is
  open (as the driver specifies).
- A free the driver refuses loses nothing. ``deallocate`` releases the handle,
  unmaps, then frees the addresses, each step once (``VmmMapping`` remembers
  which are done). A failure before the unmap leaves the block LIVE and
  usable (its hazard record sound, counters unchanged); a failure after it
  (freeing the addresses) leaves the block unusable (``UseAfterFreeError``)
  but still counted and still this resource's. Either way the error is
  raised and a later ``deallocate`` of the block finishes the free.

Rules: sizes, streams and states are checked as in every resource
(``DoubleFreeError``, ``ValueError`` for foreign blocks); a device without
VMM or POSIX-fd handles raises ``UnsupportedError`` at construction.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DriverError, UnsupportedError, UseAfterFreeError
from ..runtime import Device, Stream
from .hooks import HOOKS as _HOOKS
from . import ordering as _ord
from .resource import TrackedResource, check_request
from .types import UNTAGGED, BlockState
from .block import DeviceBlock

if TYPE_CHECKING:
    from ..backends import Backend

__all__ = ["VmmResource", "VmmMapping", "map_range", "unmap_range", "synchronize_streams", "release_streams",
           "unmap_block", "release_mapped_block"]


def _cleanup(exc: BaseException, fn: Callable[..., Any], *args: Any) -> None:
    """Undo a step while ``exc`` propagates; a failing undo is noted on ``exc``, not raised over it."""
    try:
        fn(*args)
    except Exception as undo:  # noqa: BLE001 - the first error is the one to report
        if hasattr(exc, "add_note"):
            exc.add_note(f"while unwinding, {getattr(fn, '__name__', fn)} also failed: {undo}")


def map_range(backend: "Backend", ordinal: int, handle: int, nbytes: int, alignment: int) -> int:
    """Reserve ``nbytes`` of device addresses, map ``handle`` there and give
    ``ordinal`` read-write access. Returns the address; leaves nothing behind on failure."""
    ptr = backend.vmm_reserve(ordinal, nbytes, alignment)
    try:
        backend.vmm_map(ptr, nbytes, handle, 0)
    except BaseException as exc:
        _cleanup(exc, backend.vmm_free_address, ptr, nbytes)
        raise
    try:
        backend.vmm_set_access(ordinal, ptr, nbytes)
    except BaseException as exc:
        _cleanup(exc, backend.vmm_unmap, ptr, nbytes)
        _cleanup(exc, backend.vmm_free_address, ptr, nbytes)
        raise
    return ptr


def unmap_range(backend: "Backend", ptr: int, nbytes: int) -> None:
    """Unmap a range made by ``map_range`` and free its addresses. Synchronize first."""
    try:
        backend.vmm_unmap(ptr, nbytes)
    except BaseException as exc:
        _cleanup(exc, backend.vmm_free_address, ptr, nbytes)
        raise
    backend.vmm_free_address(ptr, nbytes)


class VmmMapping:
    """A VMM block's driver objects: its allocation handle (None once released, or
    for an import, whose handle is released at once) and whether it is still mapped."""

    __slots__ = ("handle", "mapped")

    def __init__(self, handle: "int | None") -> None:
        self.handle = handle
        self.mapped = True


def unmap_block(backend: "Backend", block: DeviceBlock, on_unmapped: "Callable[[], None] | None" = None) -> None:
    """Release ``block``'s handle, unmap it and free its addresses: the steps not done
    yet, each marked done on ``block._impl`` (a ``VmmMapping``) as it succeeds, so a
    failed free can be finished by calling this again. Synchronize first."""
    m: VmmMapping = block._impl
    if m.handle is not None:
        backend.vmm_release(m.handle)  # allowed while mapped: the memory goes at the unmap
        m.handle = None
    if m.mapped:
        backend.vmm_unmap(block.ptr, block.bytes)
        m.mapped = False
        if on_unmapped is not None:
            on_unmapped()
    backend.vmm_free_address(block.ptr, block.bytes)


def release_mapped_block(mr: Any, block: DeviceBlock, on_unmapped: "Callable[[], None] | None" = None) -> None:
    """Deallocate a mapped block of ``mr`` (a VmmResource, or IPC's imports): wait for its
    queued uses (a host synchronization), then unmap it and release what backs it, step by
    step. If the driver refuses a step, a block still mapped is LIVE again (usable, counted)
    and one already unmapped stays counted in ``mr._unmapped``; either way a later call
    finishes it. ``mr`` provides ``_lock``, ``_unmapped``, ``_bytes``, ``_unregister``,
    ``_relive``, ``_reset_record_after_release`` and ``_sanitize_free``."""
    if not isinstance(block, DeviceBlock):
        mr._check_dealloc(block, mr._live)  # raises TypeError
    with mr._lock:
        stale = mr.device.state.generation != mr._generation
        if mr._unmapped and mr._unmapped.get(block.ptr) is block:
            del mr._unmapped[block.ptr]  # finish a free that failed after the unmap
            mr._bytes -= block.bytes
            streams: "list[Stream]" = []
        else:
            mr._unregister(block)
            try:
                streams = [] if stale else release_streams(mr, block)
            except BaseException:
                mr._relive(block)
                raise
    try:
        if not stale:  # a rebuilt context already took the memory with it
            if block._impl.mapped:
                synchronize_streams(mr.device, streams)
            unmap_block(mr._backend, block, on_unmapped)
    except BaseException:
        with mr._lock:
            if block._impl.mapped:  # still usable: LIVE again
                mr._reset_record_after_release(block)
                mr._relive(block)
            else:                   # gone from the device, not yet from the resource
                mr._unmapped[block.ptr] = block
                mr._bytes += block.bytes
        raise
    block.transition(BlockState.FREED)
    mr._sanitize_free(block)


def synchronize_streams(device: Device, streams: "list[Stream]") -> None:
    """Wait for the work queued on ``streams``; a closed or stale stream is covered
    by one device synchronization."""
    backend = device.backend
    for s in streams:
        if s._closed or s._generation != device.state.generation:
            backend.device_synchronize(device.ordinal)
            return
    for s in streams:
        backend.stream_synchronize(s.handle)


def release_streams(resource: TrackedResource, b: DeviceBlock) -> "list[Stream]":
    """Order ``b``'s release (``_order_release``; caller holds the resource lock) and
    return the streams to synchronize before its memory may be unmapped."""
    a = b.alloc_stream
    streams = [a]
    if _HOOKS.any_manual and _ord.policy(a) != _ord.AUTO:
        writer, _, readers = b.hazard_record()
        for s in (writer, *(readers or ())):
            if s is not None and s not in streams:
                streams.append(s)
    resource._order_release(b)
    return streams


class VmmResource(TrackedResource):
    """Exportable allocations (see the module docstring). ``granularity`` is the
    driver's allocation granularity for this device, in bytes.

    Args:
        device: the ``ig.Device`` (or ordinal) it serves; None for the current device.

    Raises:
        UnsupportedError: the device lacks virtual memory management or POSIX file
            descriptor handles.
    """

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        caps = self.device.capabilities
        missing = [what for key, what in (("vmm", "virtual memory management"),
                                          ("posix_fd_ipc", "POSIX file descriptor handles"))
                   if not caps.get(key, False)]
        if missing:
            raise UnsupportedError(f"exportable (VMM) allocations on device {self.device.ordinal} "
                                   f"(missing: {', '.join(missing)})", self._backend.name,
                                   "share memory another way (copy through the host), or use a device "
                                   "and driver with VMM and POSIX fd handles")
        self.granularity: int = self._backend.vmm_granularity(self.device.ordinal)
        self._bytes = 0
        self._export_fds: dict[int, int] = {}  # ptr -> the block's exported fd (closed at deallocate)
        self._unmapped: dict[int, DeviceBlock] = {}  # blocks whose free failed after their unmap

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        """A live block of ``nbytes`` rounded up to the granularity, usable at once."""
        stream = self._stream(stream)
        if type(nbytes) is not int or nbytes <= 0 or type(stream) is not Stream:
            check_request(nbytes, stream)
        self._check_alive()
        g = self.granularity
        size = -(-nbytes // g) * g
        backend, ordinal = self._backend, self.device.ordinal
        try:
            handle = backend.vmm_create(ordinal, size)
        except DriverError as e:
            if e.name == "CUDA_ERROR_OUT_OF_MEMORY":
                rec = _HOOKS.recorder
                if rec is not None:
                    rec("oom", self, 0, size, stream, None)
                raise self._oom(size, e, **self.memory_numbers()) from e
            raise
        try:
            ptr = map_range(backend, ordinal, handle, size, g)
        except BaseException as exc:
            _cleanup(exc, backend.vmm_release, handle)
            raise
        return self._register(ptr, stream, size, nbytes, tag, VmmMapping(handle))

    def deallocate(self, block: DeviceBlock) -> None:
        """Wait for the block's queued uses (a host synchronization), then release its
        handle and unmap it. If the driver refuses, see the module docstring."""
        release_mapped_block(self, block, lambda: self._close_export(block))
        self._close_export(block)
        rec = _HOOKS.recorder
        if rec is not None:
            rec("free_requested", self, block.ptr, block.bytes, block.alloc_stream, block)
            rec("free_completed", self, block.ptr, block.bytes, block.alloc_stream, block)

    def _close_export(self, block: DeviceBlock) -> None:
        with self._lock:
            fd = self._export_fds.pop(block.ptr, None)
        if fd is not None:
            os.close(fd)

    def export_fd(self, block: DeviceBlock) -> int:
        """A new POSIX file descriptor for ``block``'s memory (the caller closes it).
        Raises ``UseAfterFreeError`` unless the block is live in this resource."""
        with self._lock:
            if self._live.get(block.ptr) is not block:
                raise UseAfterFreeError(
                    f"block {block.ptr:#x} is not live in this VmmResource (freed, or allocated elsewhere); "
                    "only live blocks can be exported", generation=block.generation, ptr=block.ptr)
            fd = self._export_fds.get(block.ptr)
            if fd is None:  # the driver's export is slow (hundreds of us): once per block, then dup
                handle = block._impl.handle
                if handle is None:
                    raise UseAfterFreeError(
                        f"block {block.ptr:#x} cannot be exported: a deallocate that failed already released "
                        "its allocation handle; deallocate it again to finish the free", generation=block.generation,
                        ptr=block.ptr)
                fd = self._export_fds[block.ptr] = self._backend.vmm_export_fd(handle)
            return os.dup(fd)

    @property
    def bytes_outstanding(self) -> int:
        """Bytes of live blocks, and of blocks whose free failed after their unmap."""
        return self._bytes

    def memory_numbers(self) -> dict[str, int]:
        return {"live_bytes": self._bytes, "cached_bytes": 0, "largest_free_block": 0}

    def __repr__(self) -> str:
        return f"<VmmResource device={self.device.ordinal} granularity={self.granularity}>"
