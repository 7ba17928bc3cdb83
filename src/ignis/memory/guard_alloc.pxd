# The framework allocators' state and their compiled allocate and free (guard_alloc.pyx).
# The guard's own state is ignis.memory.guard_base's. The fields are read-only from Python
# (their containers are shared and mutable); ``State``'s methods are their Python writers.


cdef class State:
    cdef readonly object opts
    cdef readonly object lock
    cdef readonly dict guards
    cdef readonly dict streams
    cdef readonly dict blocks
    cdef readonly object torch
    cdef readonly object cupy
    cdef readonly object lib
    cdef readonly object problems
    cdef readonly object groups
    cdef readonly object tls
    cdef readonly list deferred
    cdef readonly object last_live
    cdef readonly object atexit
    cdef readonly object hooks
    cdef readonly object saved
    cdef readonly set rs_ptrs
    cdef readonly object tag
    cdef readonly dict capturing      # (device, stream handle) -> the graph pool it allocates into
    cdef readonly dict graph_blocks   # user pointer -> (device, pool, size) of CUDA graphs' memory
    cdef readonly dict graph_free     # (device, pool) -> {size: [pointers]} freed graph memory
    cdef readonly list after_capture  # frees of guarded blocks of a capturing stream, until it ends
    cdef readonly object graph_alloc  # (device, size) -> a pointer: memory for a graph
    cdef readonly object current_stream  # (device) -> the raw handle of the thread's current stream


cdef object alloc_c(object size, object device, object handle, object tag, object owner)
cdef int free_c(object ptr, object size, object device, object handle, object poisoned,
                bint later=*) except -1
