# Typed fields of Stream, for the compiled hot paths that cimport it (memory/pool.pyx,
# memory/resource.pyx): reading a stream's handle, device, generation or closed flag
# there is a field load, not an attribute lookup.

cdef class Stream:
    cdef readonly object handle
    cdef readonly object device
    cdef readonly object id
    cdef readonly object _generation
    cdef readonly object _closed
    cdef readonly object _owned
    cdef readonly object _keepalive
    cdef public object ordering
    cdef object __weakref__
