# Typed fields of DeviceBlock (block.pyx), for the compiled pool and tracking.
# _write_stream / _write_event / _readers are the cross-stream hazard record: the stream of
# the last write, the event recorded after it (0: none needed), the readers since (stream -> event).

cdef class DeviceBlock:
    cdef public object ptr
    cdef public object alloc_stream
    cdef public object bytes
    cdef public object requested
    cdef public object tag
    cdef public object generation
    cdef public object state
    cdef public object _write_stream
    cdef public object _write_event
    cdef public object _readers
    cdef public object _impl
    cdef object __weakref__


# A new LIVE DeviceBlock with a clean hazard record (what ``DeviceBlock(...)`` makes, without
# the Python call), for the compiled allocators (memory/pool.pyx, torch/_guard_fast.pyx).
cdef DeviceBlock new_block(object ptr, object alloc_stream, object nbytes, object requested, object tag,
                           object generation, object impl)
