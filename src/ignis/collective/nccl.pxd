# Types for the compiled build of nccl.py (Cython's pure-Python mode): the engine is an
# extension type, so a call's way to NCCL (the poll of NCCL's asynchronous error, the match
# log's append, the enqueue, the ticket and the call in flight) reads the engine's fields at
# fixed offsets and the operation's C fields, instead of an instance dict and Python calls.
# nccl.py stays the one source; as plain Python it is the same class with a dict.
#
# Every field is public: the watchdog, the abort thread and the communicator read and write
# them from Python, and the diagnostics swap ``_match`` (scripts/diag_allreduce_cost.py).

cimport cython

from ignis.collective.communicator cimport _Op
from ignis.memory.resource cimport ResourceLock, lock_give, lock_take


@cython.locals(name=str)
cdef int _enqueue(object api, object h, _Op op, object st) except -1


cdef class NcclEngine:
    # What it is (set once by __init__ / init)
    cdef public object api, rank, world_size, device, health, timeout, checker, matcher, handle
    cdef public bint fp8
    # The hot path's state: the match log's append, the calls' tickets and those in flight
    cdef public object _match, _flight
    cdef readonly ResourceLock _lock  # (taken as C on the hot path: never replaced from Python)
    cdef public Py_ssize_t issued, _done
    cdef public double _unwatched_at, _polled
    # The watchdog's and the abort's
    cdef public bint _aborted
    cdef public object _abort_done, _stop, _watchdog, _stream, _pending, _retire_lock
    cdef object __weakref__

    @cython.locals(op=_Op, grouped=bint, ticket=Py_ssize_t, lock=ResourceLock)
    cpdef run(self, ops, stream, tuple targets=*)

    @cython.locals(now=double)
    cpdef poll(self, bint force=*)
