# Typed fields of the resource base classes and the event pool (resource.pyx), for
# the compiled pool and tracking. Resources keep an instance dict too, so subclasses
# and adaptors can add attributes freely.

cdef class EventPool:
    cdef public object _backend
    cdef public object _ordinal
    cdef public list _free
    cdef public object _lock
    cdef public object generation
    cdef public object state


cdef class DeviceMemoryResource:
    cdef public object device
    cdef public object _backend
    cdef public object _generation
    cdef public object _closed
    cdef dict __dict__
    cdef object __weakref__


cdef class TrackedResource(DeviceMemoryResource):
    cdef public object _lock
    cdef public dict _live
    cdef public EventPool _events
    cdef public object cross_stream_waits
