# Types for the compiled build of sanitizer.py (Cython's pure-Python mode): extents become
# extension types with fields at fixed offsets, the sanitizer itself an extension type whose
# state is read without an attribute lookup, and its internal steps C calls. The records the
# race check walks on every access are C structs of the record store (records.pyx), called
# here as C. sanitizer.py stays the one source of the sanitizer's own logic.

cimport cython
from ignis.memory.resource cimport ReentrantLock
from ignis.safety.records cimport (_Rec, _new_rec, RecordList, Graveyard, Clock, AddrMap, addr_of, clock_at,
                                   spans_disjoint, K_READ, K_WRITE, K_FREE)


# Extents hold no reference that could lead back to them (strings, integers, stacks, their
# records): they stay out of the cyclic collector. (The directive is on the class in
# sanitizer.py: Cython ignores it here, in pure-Python mode.) Records are C structs of the
# record store (records.pxd).
cdef class _Extent:
    cdef readonly object base, end
    cdef readonly long long gen
    cdef readonly long long sid
    cdef readonly RecordList recs
    cdef readonly object written, frames, op, rs, held
    cdef readonly bint pinned
    cdef readonly long long hv
    cdef readonly bint lib


cpdef bint _disjoint(_Rec r, long long lo, long long hi, long long per, long long ch) except -1

cdef long long _R, _W, _O, _NI, _P, _MW  # the mode bits, as C integers
cdef long long _ADDR_LAST           # the last address a record holds (2**63 - 1)

cdef Py_ssize_t _packed_count(bytes data) except -1

@cython.locals(a=Py_ssize_t, b=Py_ssize_t, m=Py_ssize_t)
cdef bint _covered(list written, long long lo, long long hi) except -1

@cython.locals(w=list, i=Py_ssize_t, b=Py_ssize_t, m=Py_ssize_t, j=Py_ssize_t)
cdef int _mark(_Extent ext, long long lo, long long hi) except -1


cdef class Sanitizer:
    # State is read-only from Python (its compiled code the one writer; tests and diagnostics
    # read it). The three settings a front end switches are writable: ``mode``, ``capture``
    # and ``outputs_fresh``.
    cdef dict __dict__              # an instance may have an entry point replaced (tests, recorders)
    cdef readonly ReentrantLock _lock
    cdef readonly bint active
    cdef readonly object _mode
    cdef readonly list _reports
    cdef readonly dict _groups
    cdef readonly list notes
    cdef public object capture
    cdef public bint outputs_fresh
    cdef readonly object _drainer    # a front end's deferred calls (set_drainer)
    cdef readonly bint _draining
    cdef object _entered             # (with self._entered: _enter, then the lock given back)
    cdef object _caller
    cdef readonly object _backend
    cdef readonly bint _atexit
    cdef readonly dict _sids, _by_id, _names, _labels
    cdef readonly object _next_sid
    cdef readonly dict _clock, _events
    cdef readonly Clock _host
    cdef readonly long long _host_version
    cdef readonly dict _regions
    cdef readonly list _starts
    cdef readonly long long _max_len
    cdef readonly AddrMap _live
    cdef readonly Graveyard _grave
    cdef readonly set pinned
    cdef readonly dict _capturing, _cap_events, _captured, _free_sites
    cdef readonly set _graph_mem
    cdef readonly dict _pool_threads
    cdef readonly long long checked, checked_foreign, syncs, device_streams

    cdef long long _sid(self, object handle) except -1
    cdef int _drain(self) except -1
    cdef int _enter(self) except -1
    @cython.locals(vc=Clock)
    cdef Clock _vc_of(self, long long sid)
    cdef int _host_join(self, Clock vc) except -1
    @cython.locals(ext=_Extent, host=Clock)
    cdef int _prune(self) except -1
    @cython.locals(r=_Rec)
    cdef _Rec _find_conflict(self, _Rec rec, Clock vc, bint rw)
    @cython.locals(recs=list, r=_Rec, vc=Clock)
    cdef int _insert(self, _Rec rec, tuple extent) except -1
    @cython.locals(conflict=_Rec, keep=RecordList, ep=cython.longlong, sid=cython.longlong, vc=Clock,
                   base=cython.longlong, end=cython.longlong)
    cdef tuple _retire(self, _Extent ext, object frames)
    @cython.locals(ext=_Extent, found=tuple, b=cython.longlong)
    cdef tuple _freed(self, object base, object current=*, object stack=*)
    @cython.locals(gen=cython.longlong, ext=_Extent)
    cdef _Extent _begin_lifetime(self, object base, object end, long long sid, bint bump)
    cdef object _add_rs(self, _Extent ext, long long sid, bint held)
    cdef object _drop_held(self, _Extent ext)
    @cython.locals(sid=cython.longlong, ep=cython.longlong, vc=Clock, live=AddrMap, host=Clock, hv=cython.longlong,
                   ext=_Extent, rec=_Rec, recs=RecordList, conflict=_Rec, uninit=bint, mode=cython.longlong, per=cython.longlong,
                   ch=cython.longlong, write=bint, written=list, found=list, packed=bint, n=Py_ssize_t,
                   k=Py_ssize_t, buf=cython.p_char, p=cython.p_longlong, bad=bint, b=cython.longlong,
                   lo=cython.longlong, hi=cython.longlong, size=cython.longlong, e=cython.longlong)
    cdef list _foreign(self, object stream, str op, object frames, object items, bint synced, bint from_lib=*,
                       object thread=*)
    @cython.locals(ext=_Extent, b=cython.longlong, from_lib=bint)
    cpdef begin_lifetimes(self, object stream, str op, object frames, list items, int library=*)
    @cython.locals(end=cython.longlong)
    cdef _Extent _first_sight(self, _Extent ext, object base, object size, long long mode, long long sid,
                              object frames, str op, long long lo=*, long long hi=*, long long per=*, Clock vc=*,
                              bint from_lib=*)


cdef class _Entered:
    cdef Sanitizer san

