# Typed fields of the resource base classes and the event pool (resource.pyx), for
# the compiled pool and tracking. Resources keep an instance dict too, so subclasses
# and adaptors can add attributes freely.

cimport cython
from posix.time cimport timespec
from ignis.memory.block cimport DeviceBlock
from ignis.runtime.stream cimport Stream


cdef extern from "pythread.h":
    ctypedef long long PY_TIMEOUT_T

cdef extern from "<semaphore.h>" nogil:
    ctypedef struct sem_t:
        pass
    int sem_init(sem_t *, int, unsigned int)
    int sem_destroy(sem_t *)
    int sem_trywait(sem_t *)
    int sem_wait(sem_t *)
    int sem_timedwait(sem_t *, const timespec *)
    int sem_post(sem_t *)


# A binary semaphore of its own (sem_post may come from any thread, as threading.Lock's
# release): an uncontended take is one atomic operation, without the clock read that
# PyThread_acquire_lock makes even when it does not wait.
cdef class ResourceLock:
    cdef sem_t _sem
    cdef bint _ready
    cdef bint _held

    cdef bint _acquire(self, PY_TIMEOUT_T us) except -1


# The compiled callers' acquire and release (no Python call): an uncontended acquire
# is one atomic operation; a contended one waits with the GIL released.
cdef inline void lock_take(ResourceLock lk) noexcept:
    if sem_trywait(&lk._sem) != 0:
        with nogil:
            while sem_wait(&lk._sem) != 0:
                pass  # interrupted by a signal: the compiled callers hold it briefly, wait on
    lk._held = True


cdef inline void lock_give(ResourceLock lk) noexcept:
    lk._held = False
    sem_post(&lk._sem)


# A reentrant lock over a ResourceLock (the sanitizer's): ``take`` and ``give`` are C calls
# from compiled callers; a thread that holds it takes it again without waiting (a finalizer
# or callback run inside a held section may call back in). The owner and depth are read and
# written with the GIL held.
@cython.final
cdef class ReentrantLock:
    cdef ResourceLock _lk
    cdef unsigned long _owner
    cdef Py_ssize_t _depth

    cpdef int take(self) except -1
    cpdef int give(self) except -1


cdef class EventPool:  # read-only from Python (resource.pyx the one writer)
    cdef readonly object _backend
    cdef readonly object _ordinal
    cdef readonly list _free
    cdef readonly object _lock
    cdef readonly object generation
    cdef readonly object state

    cdef object take(self)


# The base's fields are read-only from Python: its constructor, ``_serve_as`` (an adaptor takes
# its upstream's) and ``_mark_closed`` are their writers.
cdef class DeviceMemoryResource:
    cdef readonly object device
    cdef readonly object _backend
    cdef readonly object _generation
    cdef readonly object _closed
    cdef dict __dict__
    cdef object __weakref__


cdef class TrackedResource(DeviceMemoryResource):  # its own state: read-only from Python
    cdef readonly ResourceLock _lock
    cdef readonly dict _live
    cdef readonly EventPool _events
    cdef readonly Py_ssize_t cross_stream_waits

    cdef object _record_c(self, Stream stream)
    cdef object _wait_c(self, Stream stream, Stream other, object event)
    cdef int _order_release_c(self, DeviceBlock b) except -1
    cdef int _finish_locked(self, DeviceBlock b, object stream, object access) except -1
    cdef int _prepare_c(self, object block, Stream s, object access, object span) except -1
    cdef int _finish_c(self, object block, object stream, object access) except -1
