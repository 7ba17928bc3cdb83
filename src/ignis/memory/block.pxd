# DeviceBlock (block.pyx): one allocation, its lifecycle and its cross-stream hazard record.
#
# The rules of a block live here and nowhere else:
# - its state moves only through ``block_move`` (the transition table, checked in C); Python
#   reads ``state`` and moves it with ``DeviceBlock.transition``;
# - its hazard record (_write_stream: the stream of the last write; _write_event: the event
#   recorded after it, 0 when none was needed yet; _readers: the readers since, stream -> event
#   or 0) is C-only. "Clean on S" is ``block_clean_on``; dropping a record, lending it to
#   another block and restoring it after a refused release are the functions below. The waits
#   a use needs are queued by the tracking resource (memory/resource.pyx), the only code that
#   records events in it.

cdef class DeviceBlock:
    cdef readonly object ptr
    cdef readonly object alloc_stream
    cdef readonly object bytes
    cdef readonly object requested
    cdef readonly object tag
    cdef readonly object generation
    cdef readonly object state
    cdef object _write_stream
    cdef object _write_event
    cdef object _readers
    cdef readonly object _impl          # the making resource's own data (its slot)
    cdef object __weakref__


# A fresh generation (a Python int): process-wide, strictly increasing, one atomic add in C.
cdef object fresh_generation()

# A new LIVE DeviceBlock with a clean hazard record (what ``DeviceBlock(...)`` makes, without
# the Python call), for the compiled allocators (memory/pool.pyx, torch/_guard_fast.pyx).
cdef DeviceBlock new_block(object ptr, object alloc_stream, object nbytes, object requested, object tag,
                           object generation, object impl)

# The one writer of ``state``: move ``b`` to ``new`` along the transition table, or raise
# InvalidTransitionError (nothing changes then).
cdef int block_move(DeviceBlock b, object new) except -1


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
# supersedes every earlier use (the tracking resource then records the writer). Inline: the
# tracked use's write path runs it.
cdef inline int block_drop_record(DeviceBlock b, list free) except -1:
    if b._write_event:
        free.append(b._write_event)
    if b._readers:
        for ev in (<dict>b._readers).values():
            if ev:
                free.append(ev)
    b._write_stream = None
    b._write_event = 0
    b._readers = None
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
