"""AsyncResource: the driver's stream-ordered memory pool (cuMemAllocAsync / cuMemFreeAsync).

Tracks cross-stream uses with events (see ``resource.py``). A deallocated
block is RETIRED and still counted in ``bytes_outstanding`` until
``reap_pending()`` synchronizes the streams with queued frees; then it is
FREED. ``trim()`` hands the pool's unused memory back to the system.
"""

from __future__ import annotations

from ..errors import UnsupportedError
from ..runtime import Device, Stream
from . import history as _history
from .resource import TrackedResource
from .types import UNTAGGED, BlockState, DeviceBlock

__all__ = ["AsyncResource"]


class AsyncResource(TrackedResource):
    """Stream-ordered allocation from the device's default memory pool."""

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        if not self.device.capabilities.get("memory_pools", False):
            raise UnsupportedError(f"stream-ordered memory pools on device {self.device.ordinal}",
                                   self._backend.name, "use DirectResource (or PoolResource(DirectResource()))")
        self._bytes = 0
        self._pending: dict[Stream, list[DeviceBlock]] = {}
        self._pending_bytes = 0

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        stream = self._admit(nbytes, stream)
        return self._driver_allocate(
            lambda: self._backend.mem_alloc_async(self.device.ordinal, nbytes, stream.handle), nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock) -> None:
        with self._lock:
            self._unregister(block)
            if self.device.state.generation != self._generation:
                block.state = BlockState.FREED  # the context that held it is gone
                return
            stream = block.alloc_stream
            try:
                if stream._closed:
                    # The alloc stream is gone: order the free after everything on the device.
                    self._backend.device_synchronize(self.device.ordinal)
                    self._backend.mem_free(self.device.ordinal, block.ptr)
                    block.state = BlockState.FREED
                    self._sanitize_free(block)
                    return
                self._order_release(block)
                self._backend.mem_free_async(self.device.ordinal, block.ptr, stream.handle)
            except BaseException:
                self._live[block.ptr] = block  # the driver refused: the block stays LIVE
                self._bytes += block.bytes
                raise
            block.state = BlockState.RETIRED
            self._pending.setdefault(stream, []).append(block)
            self._pending_bytes += block.bytes
        rec = _history.recorder
        if rec is not None:
            rec("free_requested", self, block.ptr, block.bytes, stream, block)
            # The driver's pool may hand the address out again at once, in stream
            # order, so for the trace the free is complete now (as in PoolResource).
            rec("free_completed", self, block.ptr, block.bytes, stream, block)
        self._sanitize_free(block)

    @property
    def bytes_outstanding(self) -> int:
        return self._bytes + self._pending_bytes

    def reap_pending(self) -> None:
        """Synchronize the streams that have queued frees, then count those bytes as freed."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for stream, blocks in pending.items():
            if not stream._closed and stream._generation == self.device.state.generation:
                self._backend.stream_synchronize(stream.handle)
            with self._lock:
                for b in blocks:
                    b.state = BlockState.FREED
                    self._pending_bytes -= b.bytes


    def trim(self, keep_bytes: int = 0) -> None:
        """Return the driver pool's unused memory to the system."""
        self._backend.mem_pool_trim(self.device.ordinal, keep_bytes)

    def memory_numbers(self) -> dict[str, int]:
        return {"live_bytes": self._bytes, "cached_bytes": self._pending_bytes, "largest_free_block": 0}
