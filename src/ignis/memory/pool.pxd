# Typed fields of the pool and its free lists (pool.pyx): read-only from Python (telemetry and
# tests read them), written by pool.pyx alone.

from ignis._cpython cimport not_on_instance
from ignis.memory.block cimport DeviceBlock
from ignis.memory.resource cimport TrackedResource


cdef class _Segment:
    cdef readonly DeviceBlock block
    cdef readonly object ptr
    cdef readonly object size
    cdef readonly bint small


cdef class _Block:
    cdef readonly object ptr
    cdef readonly object size
    cdef readonly _Segment seg
    cdef readonly _Block prev
    cdef readonly _Block next
    cdef readonly bint free
    cdef readonly object stream


cdef class _SizeClass:
    cdef readonly dict bins
    cdef readonly list sizes


cdef class _FreeList:
    cdef readonly _SizeClass small
    cdef readonly _SizeClass large
    cdef readonly Py_ssize_t count
    cdef readonly bint dirty


cdef class PoolResource(TrackedResource):
    # The pool's state: C only (its compiled code the one reader and writer); the upstream
    # resource is readable from Python.
    cdef dict _free
    cdef object _state
    cdef object _live_bytes
    cdef readonly object upstream
    cdef dict _segments
    cdef object _reserved
    cdef dict _final

    cdef int _split_if_worth(self, _Block b, object size, bint small) except -1
    cdef DeviceBlock _allocate_c(self, object nbytes, object stream_, object tag)
    cdef int _deallocate_c(self, object block_) except -1


cdef inline bint pool_direct(object mr, str name) except -1:
    """``mr`` is a plain PoolResource whose ``name`` (allocate / deallocate) is its own: a
    compiled caller may call its compiled body (``_allocate_c`` / ``_deallocate_c``) directly."""
    return type(mr) is PoolResource and not_on_instance(mr, name)


cdef inline int pool_deallocate(object mr, object block) except -1:
    """``mr.deallocate(block)``, the pool's compiled body where it is a plain PoolResource."""
    if pool_direct(mr, "deallocate"):
        (<PoolResource>mr)._deallocate_c(block)
    else:
        mr.deallocate(block)
    return 0
