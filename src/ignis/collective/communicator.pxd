# Types for the compiled build of communicator.py (Cython's pure-Python mode): a
# collective's enqueue path (checks, the operation's descriptor, the tracked-access block,
# the engine's call) runs on C-typed fields and C calls between the communicator's own
# steps, instead of attribute lookups and Python calls. communicator.py stays the one source.

cimport cython

from ignis.array.nvarray cimport _TrackedAccess, access_block


# An operation holds no reference that could lead back to it (strings, integers, its plan,
# its ReduceOp): it stays out of the cyclic collector (one is made per call; the directive
# is on the class in communicator.py: Cython ignores it here, in pure-Python mode).
cdef class _Op:
    cdef readonly str name
    cdef readonly object seq, send_ptr, send_bytes, recv_ptr, recv_bytes, count, plan, op, red, root, dtype


cdef tuple _target(object a, _Op op)


@cython.final
cdef class Communicator:
    # The communicator's identity (read-only from Python), then its state: its own code is
    # the one writer, except the engine and the error poll, which diagnostics swap.
    cdef readonly object rank, world_size, device, stream, timeout
    cdef public object _engine, _poll
    cdef readonly object _health, _rdzv, _group, _p2p_sent, _p2p_recvd, _on_close, _scratch, _plans
    cdef readonly bint _owns_stream, _closed
    cdef readonly Py_ssize_t _seq
    # The plan of the last reduction asked (a loop of the same call asks for it each time).
    cdef object _last_dt, _last_red, _last_plan
    cdef object __weakref__

    cpdef _check_usable(self, str what)
    cpdef _array(self, a, str what, str role)
    cpdef _reduction(self, dt, op, str what)
    cpdef Py_ssize_t _next(self)
    @cython.locals(block=_TrackedAccess)
    cpdef _submit(self, _Op op, a, acc, b=*, acc_b=*)
