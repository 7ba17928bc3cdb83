"""Value types of the memory layer: generations, access kinds, block identity and state.

Rules:
- A ``Generation`` is process-wide and strictly increasing; every allocation
  gets a fresh one, so a reused address never looks like the old block.
- ``BlockId`` is the frozen, copyable identity ``(ptr, generation,
  alloc_stream, device_ordinal)``; resources validate it against their live
  map and raise ``UseAfterFreeError`` when it names memory that is gone.
- Block states change only along ``TRANSITIONS``; anything else raises
  ``InvalidTransitionError`` naming the block, its state and the attempt.
"""

from __future__ import annotations

import enum
import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from .._types import Access  # foundation; re-exported here, where it was defined before
from ..errors import InvalidTransitionError

if TYPE_CHECKING:
    from ..runtime import Stream

__all__ = ["Access", "AllocTag", "UNTAGGED", "Generation", "BlockId", "BlockState", "DeviceBlock",
           "TRANSITIONS", "StreamId"]

# next() on itertools.count is atomic under the GIL: concurrent callers get distinct values.
_next_generation = itertools.count(1).__next__


class Generation(int):
    """A generation number. ``Generation.next()`` returns a fresh, larger one."""

    __slots__ = ()

    @staticmethod
    def next() -> "Generation":
        """A fresh generation, larger than every one handed out before in this process."""
        return Generation(_next_generation())

    def __repr__(self) -> str:
        return f"Generation({int(self)})"


class AllocTag(str):
    """A caller's label for an allocation, shown in logs, statistics and reports.
    Any ``str`` is accepted where a tag is expected."""

    __slots__ = ()
    UNTAGGED: "AllocTag"


UNTAGGED = AllocTag("untagged")
AllocTag.UNTAGGED = UNTAGGED

# Streams are identified by the ``Stream`` objects themselves.
StreamId = Any


class BlockState(enum.Enum):
    """Where a ``DeviceBlock`` is in its life; it moves only along ``TRANSITIONS``.

    - ``LIVE``: handed out; usable on its alloc stream (or, elsewhere, after ordering).
    - ``RETIRED``: deallocated; its reuse waits for stream order.
    - ``QUARANTINED``: held back by a debug guard before reuse.
    - ``FREED``: returned to the system; any use is a bug.
    """

    LIVE = "live"                # handed out; usable on alloc_stream (or after ordering)
    RETIRED = "retired"          # deallocated; reuse waits for stream order
    QUARANTINED = "quarantined"  # held back by a debug guard before reuse
    FREED = "freed"              # returned to the system; any use is a bug


TRANSITIONS: dict[BlockState, frozenset[BlockState]] = {
    BlockState.LIVE: frozenset({BlockState.RETIRED, BlockState.QUARANTINED, BlockState.FREED}),
    BlockState.RETIRED: frozenset({BlockState.QUARANTINED, BlockState.FREED}),
    BlockState.QUARANTINED: frozenset({BlockState.RETIRED, BlockState.FREED}),
    BlockState.FREED: frozenset(),
}


class BlockId(NamedTuple):
    """The copyable identity of a block: ``(ptr, generation, alloc_stream, device_ordinal)``.

    Resources accept it wherever they take a block for tracking, and raise
    ``UseAfterFreeError`` when it names memory that is no longer that live block.
    """

    ptr: int
    generation: int
    alloc_stream: "Stream"
    device_ordinal: int

    @classmethod
    def from_block(cls, block: "DeviceBlock") -> "BlockId":
        """The identity of ``block`` (the same as ``block.id``).

        Args:
            block: a ``DeviceBlock``.
        """
        return cls(block.ptr, block.generation, block.alloc_stream, block.alloc_stream.device.ordinal)


class DeviceBlock:
    """One allocation, owned by the caller until handed back to the resource that made it.

    ``bytes`` may exceed the request (rounding); ``requested`` is what was asked.
    ``align`` is the guaranteed alignment (256 bytes, as cudaMalloc gives).
    The ``_w*`` / ``_rd`` slots hold the cross-stream hazard record (see
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

    __slots__ = ("ptr", "alloc_stream", "bytes", "requested", "tag", "generation", "state", "_ws", "_we",
                 "_rd", "_impl", "__weakref__")

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
        self._ws = alloc_stream
        self._we = 0
        self._rd = None
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


_LIVE = BlockState.LIVE
