# The tracked use of an array (tracking.pyx), for the compiled callers (array/launch.pyx):
# begin_use checks the array and queues the waits (the sanitizer checks bytes [off, off + n),
# n < 0: all); end_use records the use. A use clean on its stream costs neither.

cdef int begin_use(object arr, object stream, object access, object op, Py_ssize_t off,
                   Py_ssize_t n) except -1
cdef int end_use(object arr, object stream, object access) except -1
