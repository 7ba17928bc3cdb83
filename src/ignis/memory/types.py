"""Value types of the memory layer: access kinds, tags, block identity and state
(``Generation`` is the block module's, beside the one counter it reads).

Rules:
- ``BlockId`` is the frozen, copyable identity ``(ptr, generation,
  alloc_stream, device_ordinal)``; resources validate it against their live
  map and raise ``UseAfterFreeError`` when it names memory that is gone.
- Block states change only along ``TRANSITIONS``; anything else raises
  ``InvalidTransitionError`` naming the block, its state and the attempt.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

from .._types import Access  # foundation; re-exported here, where it was defined before

if TYPE_CHECKING:
    from ..runtime import Stream
    from .block import DeviceBlock

__all__ = ["Access", "AllocTag", "UNTAGGED", "BlockId", "BlockState",
           "TRANSITIONS", "StreamId"]



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
