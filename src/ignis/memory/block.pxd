# DeviceBlock (block.pyx): one allocation, its lifecycle and its cross-stream hazard record.
#
# The rules of a block live here and nowhere else:
# - its state is a C code (BLOCK_LIVE ...) that moves only through ``block_move`` (the
#   transition table, checked in C); Python reads ``state`` as a ``BlockState`` and moves it
#   with ``DeviceBlock.transition``;
# - its hazard record (_write_stream: the stream of the last write; _write_event: the event
#   recorded after it, 0 when none was needed yet; _readers: the readers since, stream -> event
#   or 0) is C-only and written only by the functions below: "clean on S" is
#   ``block_clean_on``; a use is noted with ``block_note_write`` / ``block_note_read``, an event
#   that a wait recorded is kept with ``block_keep_write_event`` / ``block_keep_read_event``;
#   dropping the record, lending it to another block and restoring it after a refused release
#   are the others. Which waits a use needs, and the events, are the tracking resource's
#   (memory/resource.pyx), the only code that records events.
#
# Fields are read-only from Python and typed: sizes, the generation (one atomic add, never a
# Python int on the allocation path) and the state are C values; the streams are ``Stream``s
# (``DeviceBlock(...)`` refuses anything else, None included) and the readers a dict.
# ``ptr`` stays a Python int: it is the key of every resource's live table, and holding the key
# once is cheaper than making it again at each lookup. ``_write_event`` stays a Python object:
# events move between the record and the resource's event pool, which keeps them as objects.

from ignis.runtime.stream cimport Stream


cdef enum:
    BLOCK_LIVE = 0          # the BlockState codes (block.pyx maps them to the enum)
    BLOCK_RETIRED = 1
    BLOCK_QUARANTINED = 2
    BLOCK_FREED = 3


cdef class DeviceBlock:
    cdef readonly object ptr
    cdef readonly Stream alloc_stream
    cdef readonly Py_ssize_t bytes
    cdef readonly Py_ssize_t requested
    cdef readonly object tag
    cdef readonly unsigned long long generation
    cdef int _state                     # a BLOCK_* code; Python reads ``state``
    cdef Stream _write_stream
    cdef object _write_event
    cdef dict _readers
    cdef readonly object _impl          # the making resource's own data (its slot)
    cdef object __weakref__


# A fresh generation: process-wide, strictly increasing, one atomic add in C.
cdef unsigned long long fresh_generation() noexcept nogil

# A new LIVE DeviceBlock with a clean hazard record (what ``DeviceBlock(...)`` makes, without
# the Python call), for the compiled resources (memory/pool.pyx, resource.pyx, guard_base.pyx).
cdef DeviceBlock new_block(object ptr, Stream alloc_stream, Py_ssize_t nbytes, Py_ssize_t requested, object tag,
                           unsigned long long generation, object impl)

# The one writer of ``state``: move ``b`` to ``new`` (a BLOCK_* code) along the transition
# table, or raise InvalidTransitionError (nothing changes then).
cdef int block_move(DeviceBlock b, int new) except -1


cdef inline bint block_live(DeviceBlock b) noexcept:
    return b._state == BLOCK_LIVE


# Clean on ``stream``: its last write was there, nothing was recorded after it and no reader is
# pending. A use on ``stream`` then needs no wait and changes nothing (memory/resource.pyx, "Clean").
cdef inline bint block_clean_on(DeviceBlock b, object stream) noexcept:
    return b._write_stream is stream and not b._write_event and b._readers is None


# Every use since the last write was on ``stream``, the last write included (an event may have
# been recorded after it for another stream's wait): releasing the block on ``stream`` needs no wait.
cdef inline bint block_only_on(DeviceBlock b, object stream) noexcept:
    return b._write_stream is stream and b._readers is None


# Hand the record's events to ``free`` (a pool's spare list) and empty it: the block's release
# is ordered (its alloc stream waits for every use), nothing needs ordering, or a write
# supersedes every earlier use (``block_note_write`` then notes the writer). Inline: the
# tracked use's write path runs it.
cdef inline int block_drop_record(DeviceBlock b, list free) except -1:
    if b._write_event:
        free.append(b._write_event)
    if b._readers:
        for ev in b._readers.values():
            if ev:
                free.append(ev)
    b._write_stream = None
    b._write_event = 0
    b._readers = None
    return 0

# A write on ``stream`` was queued, ``ev`` recorded after it (0: none needed yet, the write is
# on the alloc stream): it supersedes every earlier use, whose events go to ``free``.
cdef inline int block_note_write(DeviceBlock b, Stream stream, object ev, list free) except -1:
    block_drop_record(b, free)
    b._write_stream = stream
    b._write_event = ev
    return 0

# A read on ``stream`` was queued, ``ev`` recorded after it (0: none yet); the event of the
# stream's earlier read, if any, goes to ``free``.
cdef inline int block_note_read(DeviceBlock b, Stream stream, object ev, list free) except -1:
    cdef dict rd
    if b._readers is None:
        b._readers = {stream: ev}
        return 0
    rd = b._readers
    old = rd.get(stream)
    if old:
        free.append(old)
    rd[stream] = ev
    return 0

# A wait for the last write recorded (or reused) ``ev`` after it: later waits reuse it.
cdef inline void block_keep_write_event(DeviceBlock b, object ev) noexcept:
    b._write_event = ev

# A wait for ``stream``'s reads recorded (or reused) ``ev`` after them (``stream`` is a reader).
cdef inline int block_keep_read_event(DeviceBlock b, Stream stream, object ev) except -1:
    b._readers[stream] = ev
    return 0

# The record is another block's (a guard's upstream block keeps it): never clean on any stream,
# so every tracked use goes through the resource that tracks the other block.
cdef inline void block_lend_record(DeviceBlock b) noexcept:
    b._write_stream = None

# After a release was ordered (the record dropped) but the free was refused: the alloc stream
# already waits for every earlier use, so the block counts as last written there (no event).
cdef inline void block_restore_record(DeviceBlock b) noexcept:
    if b._write_stream is None and b._readers is None:
        b._write_stream = b.alloc_stream
        b._write_event = 0
