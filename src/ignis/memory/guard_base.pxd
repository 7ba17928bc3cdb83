# Typed fields of DebugGuardResource and its record of one allocation (guard_base.pyx), for
# the compiled quarantine bookkeeping here and the deferred guard's compiled hot path
# (ignis/torch/_guard_fast.pyx). The guards keep an instance dict too (DeviceMemoryResource).

from ignis.memory.block cimport DeviceBlock
from ignis.memory.resource cimport DeviceMemoryResource, ResourceLock


cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX


# A quarantine bound (a non-negative int, however large) as a C size: one beyond every
# size counts as the largest, so the comparisons stay those of the Python ints.
cdef inline Py_ssize_t as_bound(object v) except? -1:
    try:
        return v
    except OverflowError:
        return PY_SSIZE_T_MAX


cdef class _Guarded:
    cdef public DeviceBlock block
    cdef public DeviceBlock up
    cdef public object stack


cdef class GuardBase(DeviceMemoryResource):
    cdef public object upstream
    cdef public ResourceLock _lock
    cdef public dict _live
    cdef public object _quarantine
    cdef public Py_ssize_t _live_bytes
    cdef public Py_ssize_t _quarantined_bytes
    cdef public Py_ssize_t canary_bytes
    cdef public int poison
    cdef public int canary
    cdef public object quarantine_count
    cdef public object quarantine_bytes
    cdef public bint capture_stacks
    cdef public bint _tracks

    cdef Py_ssize_t _held_c(self, _Guarded e) except -1
    cdef Py_ssize_t _overflow_c(self) except -1
    cdef list _take_quarantine_c(self, Py_ssize_t k)
