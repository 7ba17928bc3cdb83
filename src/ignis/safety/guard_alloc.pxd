# The framework allocators' state and their compiled allocate and free (guard_alloc.pyx).
# The guard's own state is ignis.memory.guard_base's.


cdef class State:
    cdef public object opts
    cdef public object lock
    cdef public dict guards
    cdef public dict streams
    cdef public dict blocks
    cdef public object torch
    cdef public object cupy
    cdef public object lib
    cdef public object problems
    cdef public object groups
    cdef public object tls
    cdef public list deferred
    cdef public object last_live
    cdef public object atexit
    cdef public object hooks
    cdef public object saved
    cdef public set rs_ptrs
    cdef public object tag
    cdef public dict capturing      # (device, stream handle) -> the graph pool it allocates into
    cdef public dict graph_blocks   # user pointer -> (device, pool, size) of CUDA graphs' memory
    cdef public dict graph_free     # (device, pool) -> {size: [pointers]} freed graph memory
    cdef public list after_capture  # frees of guarded blocks of a capturing stream, until it ends
    cdef public object graph_alloc  # (device, size) -> a pointer: memory for a graph
    cdef public object current_stream  # (device) -> the raw handle of the thread's current stream


cdef object alloc_c(object size, object device, object handle, object tag, object owner)
cdef int free_c(object ptr, object size, object device, object handle, object poisoned,
                bint later=*) except -1
