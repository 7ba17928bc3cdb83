# Typed fields of the resource base classes and the event pool (resource.pyx), for
# the compiled pool and tracking. Resources keep an instance dict too, so subclasses
# and adaptors can add attributes freely.

from cpython.pythread cimport PyThread_type_lock, PyThread_acquire_lock, PyThread_release_lock, NOWAIT_LOCK, WAIT_LOCK
from ignis.memory.block cimport DeviceBlock
from ignis.runtime.stream cimport Stream


cdef extern from "pythread.h":
    ctypedef long long PY_TIMEOUT_T


cdef class ResourceLock:
    cdef PyThread_type_lock _h
    cdef bint _held

    cdef bint _acquire(self, PY_TIMEOUT_T us) except -1


# The compiled callers' acquire and release (no Python call): an uncontended acquire
# is one atomic operation; a contended one waits with the GIL released.
cdef inline void lock_take(ResourceLock lk) noexcept:
    if not PyThread_acquire_lock(lk._h, NOWAIT_LOCK):
        with nogil:
            PyThread_acquire_lock(lk._h, WAIT_LOCK)
    lk._held = True


cdef inline void lock_give(ResourceLock lk) noexcept:
    lk._held = False
    PyThread_release_lock(lk._h)


cdef class EventPool:
    cdef public object _backend
    cdef public object _ordinal
    cdef public list _free
    cdef public object _lock
    cdef public object generation
    cdef public object state

    cdef object take(self)


cdef class DeviceMemoryResource:
    cdef public object device
    cdef public object _backend
    cdef public object _generation
    cdef public object _closed
    cdef dict __dict__
    cdef object __weakref__


cdef class TrackedResource(DeviceMemoryResource):
    cdef public ResourceLock _lock
    cdef public dict _live
    cdef public EventPool _events
    cdef public Py_ssize_t cross_stream_waits

    cdef object _record_c(self, Stream stream)
    cdef object _wait_c(self, Stream stream, Stream other, object event)
    cdef int _order_release_c(self, DeviceBlock b) except -1
    cdef int _finish_locked(self, DeviceBlock b, object stream, object access) except -1
    cdef int _prepare_c(self, object block, Stream s, object access, object span) except -1
    cdef int _finish_c(self, object block, object stream, object access) except -1
