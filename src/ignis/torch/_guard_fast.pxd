# Typed fields of the guard's compiled hot path (_guard_fast.pyx): the record of one
# allocation, the check batches, the deferred guard's own state and the front end's state.

from ignis.memory.block cimport DeviceBlock
from ignis.memory.guard_base cimport GuardBase, _Guarded
from ignis.memory.resource cimport ReentrantLock
from ignis.runtime.stream cimport Stream


cdef class _Entry(_Guarded):
    cdef public object rs
    cdef public object reported


cdef class _Slot:
    cdef public object jobs
    cdef public object jobs_ptr
    cdef public object jobs_dev
    cdef public object res
    cdef public object res_ptr
    cdef public object res_dev
    cdef public object event
    cdef unsigned long long *jobs_host   # jobs / res in host memory (pinned, or the arrays' data)
    cdef unsigned long long *res_host


cdef class _Batch:
    cdef public _Slot slot
    cdef public list items
    cdef public object stream


cdef class _Checker:
    cdef public GuardCore g
    cdef public object backend
    cdef public object device
    cdef public bint cuda
    cdef public ReentrantLock lock
    cdef public dict pending
    cdef public object inflight
    cdef public list free_slots
    cdef public list all_slots
    cdef public object fn
    cdef public Py_ssize_t frees
    cdef public Py_ssize_t batches
    cdef public Py_ssize_t jobs

    cdef _Slot _take_slot(self)
    cdef int _launch(self, object stream, list items) except -1
    cdef int _queue_free(self, Stream s, _Entry e, list evicted) except -1


cdef class GuardCore(GuardBase):
    cdef public object _state
    cdef public Py_ssize_t batch
    cdef public object stack_depth
    cdef public dict _formatted
    cdef public dict _held_exit
    cdef public _Checker _checker
    cdef public Py_ssize_t reused
    cdef public Py_ssize_t formatted_fresh
    cdef public Py_ssize_t resized
    cdef public bint _reuse
    cdef public dict _ready
    cdef public Py_ssize_t _ready_bytes
    cdef public Py_ssize_t ready_limit
    cdef public bint _ready_stale
    cdef public dict _unpoisoned          # stream -> [(ptr, user bytes)] freed, poison not queued yet
    cdef public Py_ssize_t _unpoisoned_n

    cdef DeviceBlock _allocate(self, object nbytes, object stream, object tag, object frames)
    cdef int _free_fast(self, DeviceBlock block, bint poisoned, bint later=*) except -1
    cdef int _poison_due(self, object stream, object target=*) except -1
    cdef bint _ready_ok(self, object stream) except -1
    cdef Py_ssize_t _held_n(self, object nbytes) except -1
    cdef DeviceBlock _take_ready(self, object stream, object nbytes, object tag)
    cdef bint _keep_ready(self, DeviceBlock up, object nbytes, object tag, bint force) except -1


cdef class _State:
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
    cdef public object graph_alloc  # (device, size) -> a pointer: memory for a graph (_guard.py)
    cdef public object current_stream  # (device) -> the raw handle of the thread's current stream
