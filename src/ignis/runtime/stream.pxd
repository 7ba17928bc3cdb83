# Typed fields of Stream, for the compiled hot paths that cimport it (memory/pool.pyx,
# memory/resource.pyx): reading a stream's handle, device, generation or closed flag
# there is a field load, not an attribute lookup.

cdef class Stream:
    cdef public object handle
    cdef public object device
    cdef public object id
    cdef public object _generation
    cdef public object _closed
    cdef public object _owned
    cdef public object _keepalive
    cdef public object ordering
    cdef object __weakref__
