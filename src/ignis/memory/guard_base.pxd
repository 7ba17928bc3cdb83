# The guard's compiled core (guard_base.pyx): the typed fields of DebugGuardResource and
# DeferredGuardResource (ignis.memory.guard), the record of one allocation, the check batches
# of the deferred mode, and the allocate / free / release that both modes run. The framework
# allocators (ignis/torch/_guard_fast.pyx) call allocate_c and free_fast_c. The guards keep an
# instance dict too (DeviceMemoryResource).

from ignis.backends.direct cimport DirectCalls, copy_dtoh_fn, copy_htod_fn, memset32_fn
from ignis.memory.block cimport DeviceBlock
from ignis.memory.resource cimport DeviceMemoryResource, ReentrantLock, ResourceLock
from ignis.runtime.stream cimport Stream


from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC


cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX


# Nanoseconds of ``clock`` (the guard's diagnostic timers: guard_base.guard_timing and
# torch/_guard_fast.pyx's torch_guard_timing).
cdef inline unsigned long long now_ns(int clock=CLOCK_MONOTONIC) noexcept nogil:
    cdef timespec ts
    clock_gettime(clock, &ts)
    return <unsigned long long>ts.tv_sec * 1000000000ULL + <unsigned long long>ts.tv_nsec


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


cdef class _Quarantine:
    cdef dict _by_ptr
    cdef object _order
    cdef int put(self, object ptr, object record) except -1
    cdef object take_oldest(self)


cdef class _Guarded:
    cdef readonly DeviceBlock block
    cdef readonly DeviceBlock up
    cdef readonly object stack      # the allocation site (the hooks' stack capture), or None
    cdef public object rs         # streams Tensor.record_stream named (deferred mode), or None
    cdef public object reported   # the sides of it already reported (a damage is reported once), or None


cdef class _Slot:
    cdef readonly object jobs
    cdef readonly object jobs_ptr
    cdef readonly object jobs_dev
    cdef readonly object res
    cdef readonly object res_ptr
    cdef readonly object res_dev
    cdef readonly object event
    cdef unsigned long long *jobs_host   # jobs / res in host memory (pinned, or the arrays' data)
    cdef unsigned long long *res_host


cdef class _Batch:
    cdef readonly _Slot slot
    cdef readonly list items
    cdef readonly object stream


cdef class _Checker:
    cdef readonly GuardBase g
    cdef readonly object backend
    cdef readonly object device
    cdef readonly bint cuda
    cdef readonly ReentrantLock lock
    cdef readonly dict pending
    cdef readonly object inflight
    cdef readonly list free_slots
    cdef readonly list all_slots
    cdef readonly object fn
    cdef readonly Py_ssize_t frees
    cdef readonly Py_ssize_t batches
    cdef readonly Py_ssize_t jobs
    cdef readonly bint closed
    cdef readonly Py_ssize_t direct_batches   # batches whose copies and launches went straight to the driver
    # The driver's calls of a batch without the backend's methods (the cuda backend's direct
    # calls; None / NULL / 0: its methods only).
    cdef DirectCalls dc
    cdef unsigned long long fn_addr             # the check kernel's CUfunction (0: not known yet)
    cdef copy_htod_fn htod
    cdef copy_dtoh_fn dtoh
    cdef memset32_fn ms32

    cdef list _pending_on(self, object stream)
    cdef object _job_stream(self, _Guarded e)
    cdef _Slot _take_slot(self)
    cdef bint _done(self, _Slot slot) except -1
    cdef int _direct_steps(self, object h, _Slot slot, Py_ssize_t k, unsigned int gx) except -1
    cdef int _launch(self, object stream, list items) except -1
    cdef int _queue_free(self, Stream s, _Guarded e, list evicted) except -1


# The guard's state is read-only from Python: its compiled code is the one writer, and the
# Python half of the guard (guard.py) sets it through ``_configure``, ``_configure_deferred``
# and ``_count_bytes``; ``upstream`` is set with the rest of what it serves (``_serve_as``).
# Writable: two settings a program may change on a live guard, ``capture_stacks`` and
# ``ready_limit``. Of a record
# (_Guarded), the guard's Python half writes ``rs`` and ``reported``.
cdef class GuardBase(DeviceMemoryResource):
    # both modes
    cdef readonly object upstream
    cdef readonly ResourceLock _lock
    cdef readonly dict _live
    cdef readonly _Quarantine _quarantine
    cdef readonly Py_ssize_t _live_bytes
    cdef readonly Py_ssize_t _quarantined_bytes
    cdef readonly Py_ssize_t canary_bytes
    cdef readonly int poison
    cdef readonly int canary
    cdef readonly object quarantine_count
    cdef readonly object quarantine_bytes
    cdef public bint capture_stacks
    cdef readonly object stack_depth
    cdef readonly bint _tracks
    cdef readonly dict _formatted           # pool block address -> (its pool record, its size, user bytes)
    cdef readonly Py_ssize_t reused
    cdef readonly Py_ssize_t formatted_fresh
    cdef readonly Py_ssize_t resized
    # the deferred mode (None / 0 in the eager one)
    cdef readonly object _state
    cdef readonly Py_ssize_t batch
    cdef readonly dict _held_exit
    cdef readonly _Checker _checker
    cdef readonly bint _reuse
    cdef readonly dict _ready
    cdef readonly Py_ssize_t _ready_bytes
    cdef public Py_ssize_t ready_limit
    cdef readonly bint _ready_stale
    cdef readonly dict _unpoisoned          # stream -> [(ptr, user bytes)] freed, poison not queued yet
    cdef readonly Py_ssize_t _unpoisoned_n

    cdef Py_ssize_t _held_c(self, _Guarded e) except -1
    cdef Py_ssize_t _overflow_c(self) except -1
    cdef list _take_quarantine_c(self, Py_ssize_t k)
    cdef DeviceBlock allocate_c(self, object nbytes, object stream, object tag, object frames)
    cdef int free_fast_c(self, DeviceBlock block, bint poisoned, bint later=*) except -1
    cdef int _poison_due(self, object stream, object target=*) except -1
    cdef bint _ready_ok(self, object stream) except -1
    cdef Py_ssize_t _held_n(self, object nbytes) except -1
    cdef DeviceBlock _take_ready(self, object stream, object nbytes, object tag)
    cdef bint _keep_ready(self, DeviceBlock up, object nbytes, object tag, bint force) except -1
