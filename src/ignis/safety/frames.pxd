# The stack capture for compiled callers (frames.pyx).

cdef tuple capture_c(Py_ssize_t skip, Py_ssize_t limit)

cpdef bint last_from_library()
