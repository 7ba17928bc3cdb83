"""DirectResource: plain synchronous alloc / free, one driver call each.

It does not track cross-stream uses (as seeds/004 specifies): the tracking
methods raise ``StreamMisuseError``, so a launch or copy that needs tracking
refuses to start rather than silently racing. Use it as the upstream of a
``PoolResource`` (which tracks on its own) or where the caller orders
streams itself.
"""

from __future__ import annotations

import threading

from ..runtime import Device, Stream
from .hooks import HOOKS as _HOOKS
from .resource import DeviceMemoryResource
from .types import UNTAGGED, BlockState
from .block import DeviceBlock

__all__ = ["DirectResource"]


class DirectResource(DeviceMemoryResource):
    """``cuMemAlloc`` / ``cuMemFree``. The stream only labels the block.

    Args:
        device: the ``ig.Device`` (or ordinal) it serves; None for the current device.
    """

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        self._lock = threading.Lock()
        self._live: dict[int, DeviceBlock] = {}
        self._bytes = 0

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        stream = self._admit(nbytes, stream)
        return self._driver_allocate(lambda: self._backend.mem_alloc(self.device.ordinal, nbytes),
                                     nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock) -> None:
        with self._lock:
            self._unregister(block)
        if self.device.state.generation == self._generation:
            try:
                self._backend.mem_free(self.device.ordinal, block.ptr)
            except BaseException:
                self._reregister(block)
                raise
        block.transition(BlockState.FREED)
        self._sanitize_free(block)
        rec = _HOOKS.recorder
        if rec is not None:
            rec("free_requested", self, block.ptr, block.bytes, block.alloc_stream, block)
            rec("free_completed", self, block.ptr, block.bytes, block.alloc_stream, block)

    @property
    def bytes_outstanding(self) -> int:
        return self._bytes

    def live_blocks(self) -> "list[DeviceBlock]":
        """The blocks handed out and not deallocated yet, a copy."""
        with self._lock:
            return list(self._live.values())

    def holds(self, block: DeviceBlock) -> bool:
        """Whether ``block`` is a live block of this resource."""
        return self._live.get(getattr(block, "ptr", None)) is block
