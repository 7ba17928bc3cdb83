# Typed fields of Kernel (kernel.pyx), for the compiled launch (ignis/array/launch.pyx):
# reading a kernel's plan, argument count or name there is a field load, and it packs
# the parameters and queues the launch through the cdef methods below.

from libc.stdint cimport uint64_t
from ignis.runtime.stream cimport Stream


cdef class Kernel:
    cdef readonly object source
    cdef readonly object name
    cdef readonly object host_impl
    cdef readonly tuple options
    cdef readonly list specs
    cdef readonly Py_ssize_t nargs
    cdef readonly tuple array_args
    cdef readonly tuple plan
    cdef readonly tuple param_types
    cdef readonly object _last
    cdef readonly dict _compiled
    cdef readonly object _lock
    cdef bytes _codes
    cdef dict __dict__
    cdef object __weakref__

    cdef int _pack(self, tuple args, uint64_t *slots) except -1
    cdef int _pack_slow(self, Py_ssize_t i, object value, uint64_t *slot) except -1
    cdef int _queue(self, object device, Stream stream, tuple grid, tuple block, object shared_mem,
                    tuple args) except -1
