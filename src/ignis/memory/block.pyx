"""DeviceBlock: one allocation, its lifecycle and its cross-stream hazard record.

Compiled (typed fields in ``block.pxd``), because every allocation makes one and
every tracked use reads and writes its hazard record. The block's rules are here:
its state moves only through ``block_move`` (``DeviceBlock.transition`` from Python),
checked against the transition table in C; its hazard record is C-only, and "clean
on a stream" is one inline test (``block_clean_on``) that every fast path uses. The
other value types of the memory layer are in ``ignis.memory.types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidTransitionError
from .types import BlockId, BlockState

if TYPE_CHECKING:
    from ..runtime.stream import Stream

__all__ = ["DeviceBlock", "Generation", "next_generation"]

cdef extern from *:
    """
    static unsigned long long ignis_generations = 0;
    static inline unsigned long long ignis_next_generation(void) {
        return __atomic_add_fetch(&ignis_generations, 1, __ATOMIC_RELAXED);
    }
    """
    unsigned long long ignis_next_generation() noexcept nogil


cdef unsigned long long fresh_generation() noexcept nogil:
    """A fresh generation (see block.pxd): every allocation's, from one counter."""
    return ignis_next_generation()


def next_generation() -> int:
    """A fresh generation: larger than every one handed out before in this process (from any
    thread). ``Generation.next()`` wraps it."""
    return ignis_next_generation()


class Generation(int):
    """A generation number: process-wide and strictly increasing; every allocation gets a
    fresh one, so a reused address never looks like the old block. ``Generation.next()``
    returns a fresh, larger one."""

    __slots__ = ()

    @staticmethod
    def next() -> "Generation":
        """A fresh generation, larger than every one handed out before in this process."""
        return Generation(ignis_next_generation())

    def __repr__(self) -> str:
        return f"Generation({int(self)})"


# The BlockState of each code (block.pxd's BLOCK_*), and the code of each BlockState.
cdef tuple _STATES = (BlockState.LIVE, BlockState.RETIRED, BlockState.QUARANTINED, BlockState.FREED)
cdef object _ZERO = 0


cdef int _code(object state) except -1:
    for i in range(4):
        if _STATES[i] is state:
            return i
    raise TypeError(f"a block's state is a BlockState, not {type(state).__name__}")


cdef inline bint _allowed(int old, int new) noexcept:
    # types.TRANSITIONS, as codes (a test keeps the two the same)
    if old == BLOCK_LIVE:
        return new == BLOCK_RETIRED or new == BLOCK_QUARANTINED or new == BLOCK_FREED
    if old == BLOCK_RETIRED:
        return new == BLOCK_QUARANTINED or new == BLOCK_FREED
    if old == BLOCK_QUARANTINED:
        return new == BLOCK_RETIRED or new == BLOCK_FREED
    return False


cdef int block_move(DeviceBlock b, int new) except -1:
    """Move ``b`` to ``new`` along the transition table, or raise (see block.pxd)."""
    if not _allowed(b._state, new):
        raise InvalidTransitionError(f"block {b.ptr:#x} (generation {b.generation}, tag {b.tag!r})",
                                     _STATES[b._state].name, _STATES[new].name)
    b._state = new
    return 0

cdef class DeviceBlock:
    """One allocation, owned by the caller until handed back to the resource that made it.

    ``bytes`` may exceed the request (rounding); ``requested`` is what was asked.
    ``align`` is the guaranteed alignment (256 bytes, as cudaMalloc gives).
    Its cross-stream hazard record is C-only (see ``block.pxd`` and ``ignis.memory.resource``);
    ``hazard_record()`` shows it, ``clean_on()`` tests it. ``_impl`` belongs to the resource that
    made it. Every field is read-only from Python; the state moves with ``transition``. The sizes,
    the generation and the state are C values (each read makes a new ``int``: compare them with
    ``==``); ``alloc_stream`` must be a ``Stream``.

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
        if alloc_stream is None:  # (a typed field would take None)
            raise TypeError("a DeviceBlock's alloc_stream is the Stream its allocation is ordered on, not None")
        self.ptr = ptr
        self.alloc_stream = alloc_stream
        self.bytes = nbytes
        self.requested = requested
        self.tag = tag
        self.generation = generation
        self._state = BLOCK_LIVE
        # Hazard record: last writer stream, its event (0 = not recorded yet),
        # readers {stream: event or 0}. A new block counts as written by its
        # alloc stream, so a first use elsewhere waits for the allocation.
        self._write_stream = alloc_stream
        self._write_event = 0
        self._readers = None
        self._impl = impl

    @property
    def state(self) -> BlockState:
        """Where the block is in its life: a ``BlockState``."""
        return _STATES[self._state]

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
        block_move(self, _code(new))

    def _drop_impl(self) -> None:
        """The making resource lets go of its slot (``_impl``, read-only from Python): a FREED
        block keeps no link to the record that held it (the pair would live on as a cycle)."""
        self._impl = None

    def clean_on(self, stream: "Stream") -> bool:
        """Whether a use on ``stream`` needs no wait and no record: the last write was on
        ``stream``, nothing was recorded after it and no reader is pending.

        Args:
            stream: a ``Stream``.
        """
        return block_clean_on(self, stream)

    def hazard_record(self) -> "tuple[Stream | None, int, dict[Stream, int] | None]":
        """A copy of the cross-stream hazard record: ``(last_writer, its_event, readers)``.

        ``last_writer`` is the stream of the last write (None once the release was ordered, or
        while another block keeps the record); ``its_event`` the event recorded after it (0:
        none needed yet); ``readers`` the streams that read since, each with its event (0: none
        yet), or None.
        """
        return (self._write_stream, self._write_event, None if self._readers is None else dict(self._readers))

    def lend_record(self) -> None:
        """Mark the record as another block's (a guard's upstream block keeps it): the block is
        then never clean, so no fast path skips the resource that tracks the other block.
        For resources that wrap another's blocks, on a block they just made.

        Raises:
            ValueError: the block's own record holds a use already (lending it would forget
                that use, and the waits a later use needs after it).
        """
        if not block_clean_on(self, self.alloc_stream):
            raise ValueError(f"block {self.ptr:#x} has uses in its own record already: lend the record of a "
                             "block only before any use")
        block_lend_record(self)

    def __repr__(self) -> str:
        return (f"<DeviceBlock {self.ptr:#x} {self.bytes} B gen={self.generation} dev={self.device_ordinal} "
                f"stream=#{getattr(self.alloc_stream, 'id', '?')} tag={self.tag!r} {self.state.name}>")



cdef DeviceBlock new_block(object ptr, Stream alloc_stream, Py_ssize_t nbytes, Py_ssize_t requested, object tag,
                           unsigned long long generation, object impl):
    """A new LIVE block, as ``DeviceBlock.__init__`` makes it (see block.pxd)."""
    cdef DeviceBlock block = DeviceBlock.__new__(DeviceBlock)
    block.ptr = ptr
    block.alloc_stream = alloc_stream
    block.bytes = nbytes
    block.requested = requested
    block.tag = tag
    block.generation = generation
    block._state = BLOCK_LIVE
    block._write_stream = alloc_stream
    block._write_event = _ZERO
    block._readers = None
    block._impl = impl
    return block
