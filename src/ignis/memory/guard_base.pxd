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


# Fill nbytes of device memory at ptr with the byte value on a stream (guard_base.pyx):
# word-wide (memset_d32_async) where aligned, byte-wise heads and tails. Below FILL_SPLIT
# bytes an unaligned region is one byte-wise memset (the C free's poison splits the same way).
cdef enum:
    FILL_SPLIT = 64 << 10


# How a fill of n bytes at p splits (the one rule, for the backend's memsets here and the C free's
# driver calls in torch/_guard_fast.pyx): 0, one word-wide memset of n / 4 words (aligned, whole
# words); 1, one byte-wise memset of n bytes (unaligned and small); 2, a byte-wise head of
# head[0] bytes, words[0] words, a byte-wise tail of tail[0] bytes (either byte-wise part may be 0).
cdef inline int fill_plan(unsigned long long p, size_t n, size_t *head, size_t *words, size_t *tail) noexcept nogil:
    head[0] = <size_t>((4 - (p & 3)) & 3)
    if head[0] == 0 and (n & 3) == 0:
        words[0] = n >> 2
        tail[0] = 0
        return 0
    if n < FILL_SPLIT:
        return 1
    words[0] = (n - head[0]) >> 2
    tail[0] = n - head[0] - 4 * words[0]
    return 2

cdef int fill_bytes_c(object backend, unsigned long long ptr, unsigned int value, Py_ssize_t nbytes,
                      object handle) except -1


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
