"""Reading a resource stack for telemetry: who does what, and what it holds now.

Design:
- A stack is walked through ``upstream``. Adaptors that only forward or count
  (budget, logging, statistics, tracking) are transparent; the first resource
  that is not is the stack's ``top`` (it hands blocks to the program); the
  first ``PoolResource`` (else the bottom resource, ``base``) is its
  ``allocator`` (it holds the memory; its numbers are the statistics).
- ``layout(allocator)`` is the allocator's memory right now: segments in
  address order, each cut into contiguous pieces (handed out, awaiting a
  free, or free). A pool's segments are its segments; any other resource's
  blocks are each a segment of their own (as a ``cudaMalloc`` would be).
- ``user_blocks(top)`` are the blocks the top hands out when it is not the
  allocator (a ``DebugGuardResource``: live and quarantined blocks, each
  inside an allocator block that also holds its guards; and, for the guard
  under the front ends, the allocator blocks its ready cache keeps, with no
  user block: memory the guard holds for reuse).

Rules: resource internals are read only here, only under the resource's own
lock, and never from inside a history event (pools report segment events
with their lock held).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..memory import DebugGuardResource, DeviceMemoryResource, PoolResource, ResourceAdaptor
from ..memory import pool as _pool
from ..memory.block import DeviceBlock

__all__ = ["SMALL_MAX", "SMALL_SEGMENT", "Roles", "Piece", "Segment", "roles", "layout", "user_blocks",
           "is_small", "live_context"]

SMALL_MAX: int = _pool._SMALL_MAX          # the pool's small size class: blocks up to this size
SMALL_SEGMENT: int = _pool._SMALL_SEGMENT  # the size of every small segment (large ones never have it)

ACTIVE = "active_allocated"
PENDING = "active_pending_free"   # PyTorch's name for "freed, waiting for its stream" (the viewer reads it)
INACTIVE = "inactive"


def is_small(block: DeviceBlock | None, size: int) -> bool:
    """The size class of a block of a resource that is not a pool (a pool files its blocks by
    segment: ``PoolResource.small_block``): by its size."""
    return size <= SMALL_MAX


@dataclass(frozen=True)
class Roles:
    """The parts of a resource stack, outermost first in ``chain``."""

    chain: tuple[DeviceMemoryResource, ...]
    top: DeviceMemoryResource
    allocator: DeviceMemoryResource
    base: DeviceMemoryResource
    pool: PoolResource | None
    guard: DebugGuardResource | None

    def describe(self) -> str:
        return " > ".join(type(r).__name__ for r in self.chain)


def roles(mr: DeviceMemoryResource) -> Roles:
    """Walk ``mr``'s stack and name its parts."""
    chain: list[DeviceMemoryResource] = []
    seen: set[int] = set()
    r: Any = mr
    while isinstance(r, DeviceMemoryResource) and id(r) not in seen:
        chain.append(r)
        seen.add(id(r))
        r = getattr(r, "upstream", None)
    top = next((r for r in chain if not _transparent(r)), chain[-1])
    pool = next((r for r in chain if isinstance(r, PoolResource)), None)
    guard = next((r for r in chain if isinstance(r, DebugGuardResource)), None)
    return Roles(tuple(chain), top, pool if pool is not None else chain[-1], chain[-1], pool, guard)


def _transparent(r: DeviceMemoryResource) -> bool:
    return isinstance(r, ResourceAdaptor) and not isinstance(r, DebugGuardResource)


def live_context(r: DeviceMemoryResource) -> bool:
    """False once the device context that ``r`` allocated in was rebuilt (its memory is gone)."""
    return getattr(r, "_generation", None) == r.device.state.generation


@dataclass
class Piece:
    """A contiguous range of a segment. ``block`` is the allocator's block for
    handed-out pieces (its ``tag`` and ``requested``), ``None`` for free ones."""

    ptr: int
    size: int
    state: str
    block: DeviceBlock | None = None

    @property
    def requested(self) -> int:
        return self.block.requested if self.block is not None else self.size


@dataclass
class Segment:
    ptr: int
    size: int
    small: bool
    stream: int                      # the stream handle it was allocated on
    pieces: list[Piece] = field(default_factory=list)


def layout(allocator: DeviceMemoryResource) -> list[Segment]:
    """The allocator's memory now, segments and pieces in address order."""
    if isinstance(allocator, PoolResource):
        return _pool_layout(allocator)
    live = [b for b in allocator.live_blocks() if isinstance(b, DeviceBlock)]
    # An AsyncResource's queued frees are not shown: the driver's pool may already
    # have handed the same addresses out again, in stream order.
    segs = [Segment(b.ptr, b.bytes, b.bytes <= SMALL_MAX, b.alloc_stream.handle, [Piece(b.ptr, b.bytes, ACTIVE, b)])
            for b in live]
    segs.sort(key=lambda s: s.ptr)
    return segs


def _pool_layout(pool: PoolResource) -> list[Segment]:
    out = []
    for s in pool.segments():
        seg = Segment(s["ptr"], s["size"], s["small"], s["stream_handle"])
        seg.pieces = [Piece(b["ptr"], b["size"], INACTIVE) if b["block"] is None
                      else Piece(b["ptr"], b["size"], ACTIVE, b["block"]) for b in s["blocks"]]
        out.append(seg)
    for seg in out:
        seg.pieces = _contiguous(seg)
    return out


def _contiguous(seg: Segment) -> list[Piece]:
    """Pieces sorted, with any range the pool tracks nowhere shown as free (so
    the pieces always tile the segment, as the viewer needs)."""
    pieces = sorted(seg.pieces, key=lambda p: p.ptr)
    out: list[Piece] = []
    at = seg.ptr
    for p in pieces:
        if p.ptr > at:
            out.append(Piece(at, p.ptr - at, INACTIVE))
        out.append(p)
        at = p.ptr + p.size
    if at < seg.ptr + seg.size:
        out.append(Piece(at, seg.ptr + seg.size - at, INACTIVE))
    return out


def user_blocks(top: DeviceMemoryResource) -> dict[int, tuple[DeviceBlock | None, str]]:
    """For a top that is not the allocator (a guard): allocator-block address ->
    (the block handed to the program, its state); (None, INACTIVE) for a block the
    guard's ready cache keeps."""
    if not isinstance(top, DebugGuardResource):
        return {}
    state = {"live": ACTIVE, "quarantined": PENDING, "ready": INACTIVE}
    return {up: (blk, state[kind]) for up, blk, kind in top.held_blocks()}
