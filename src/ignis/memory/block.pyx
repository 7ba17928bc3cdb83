"""DeviceBlock: one allocation, with its cross-stream hazard record.

Compiled (typed fields in ``block.pxd``), because every allocation makes one and
every tracked use reads and writes its hazard record. The other value types of
the memory layer are in ``ignis.memory.types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidTransitionError
from .types import TRANSITIONS, BlockId, BlockState

if TYPE_CHECKING:
    from ..runtime.stream import Stream

__all__ = ["DeviceBlock"]

cdef object _LIVE = BlockState.LIVE
cdef object _ZERO = 0

cdef class DeviceBlock:
    """One allocation, owned by the caller until handed back to the resource that made it.

    ``bytes`` may exceed the request (rounding); ``requested`` is what was asked.
    ``align`` is the guaranteed alignment (256 bytes, as cudaMalloc gives).
    The ``_write_stream`` / ``_write_event`` / ``_readers`` fields hold the cross-stream hazard record (see
    ``ignis.memory.resource``); ``_impl`` belongs to the resource that made it.

    Blocks are made by resources (``allocate``), not by users.

    Args:
        ptr: the device address.
        alloc_stream: the ``Stream`` the allocation is ordered on (and its deallocation).
        nbytes: the size in bytes (``bytes``).
        requested: the size asked for, in bytes.
        tag: the caller's label for the allocation.
        generation: the block's generation (fresh for every allocation).
        impl: the making resource's own data, or None.

    Attributes:
        ptr: the device address.
        alloc_stream: the ``Stream`` the allocation is ordered on.
        bytes: the size in bytes (may exceed ``requested``).
        requested: the size asked for, in bytes.
        tag: the caller's label.
        generation: the process-unique generation of this allocation.
        state: the ``BlockState``.
    """

    # Fields: see block.pxd.

    align = 256

    def __init__(self, ptr: int, alloc_stream: "Stream", nbytes: int, requested: int, tag: str,
                 generation: int, impl: Any = None) -> None:
        self.ptr = ptr
        self.alloc_stream = alloc_stream
        self.bytes = nbytes
        self.requested = requested
        self.tag = tag
        self.generation = generation
        self.state = _LIVE
        # Hazard record: last writer stream, its event (0 = not recorded yet),
        # readers {stream: event or 0}. A new block counts as written by its
        # alloc stream, so a first use elsewhere waits for the allocation.
        self._write_stream = alloc_stream
        self._write_event = 0
        self._readers = None
        self._impl = impl

    @property
    def device_ordinal(self) -> int:
        """The ordinal of the device the block is on."""
        return self.alloc_stream.device.ordinal

    @property
    def id(self) -> BlockId:
        """The block's copyable identity, a ``BlockId``."""
        return BlockId(self.ptr, self.generation, self.alloc_stream, self.alloc_stream.device.ordinal)

    def transition(self, new: BlockState) -> None:
        """Move to ``new`` along the transition table, or raise.

        Args:
            new: the ``BlockState`` to move to.

        Raises:
            InvalidTransitionError: ``TRANSITIONS`` does not allow the move from the current state.
        """
        if new not in TRANSITIONS[self.state]:
            raise InvalidTransitionError(f"block {self.ptr:#x} (generation {self.generation}, tag {self.tag!r})",
                                         self.state.name, new.name)
        self.state = new

    def __repr__(self) -> str:
        return (f"<DeviceBlock {self.ptr:#x} {self.bytes} B gen={self.generation} dev={self.device_ordinal} "
                f"stream=#{getattr(self.alloc_stream, 'id', '?')} tag={self.tag!r} {self.state.name}>")



cdef DeviceBlock new_block(object ptr, object alloc_stream, object nbytes, object requested, object tag,
                           object generation, object impl):
    """A new LIVE block, as ``DeviceBlock.__init__`` makes it (see block.pxd)."""
    cdef DeviceBlock block = DeviceBlock.__new__(DeviceBlock)
    block.ptr = ptr
    block.alloc_stream = alloc_stream
    block.bytes = nbytes
    block.requested = requested
    block.tag = tag
    block.generation = generation
    block.state = _LIVE
    block._write_stream = alloc_stream
    block._write_event = _ZERO
    block._readers = None
    block._impl = impl
    return block
