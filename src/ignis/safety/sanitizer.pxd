# Types for the compiled build of sanitizer.py (Cython's pure-Python mode): the
# records the race check scans on every access become extension types with fields
# at fixed offsets (byte ranges as C integers), the sanitizer itself an extension
# type whose state is read without an attribute lookup, and its internal steps C
# calls. sanitizer.py stays the one source.

cimport cython
from ignis.memory.resource cimport ReentrantLock


# Records and extents hold no reference that could lead back to them (strings, integers,
# stacks, lists of records): they stay out of the cyclic collector, which made records
# (one or more per access) count toward its runs. (The directive is on the classes in
# sanitizer.py: Cython ignores it here, in pure-Python mode.)
cdef class _Rec:
    cdef readonly long long sid
    cdef readonly object stream_id
    cdef readonly long long epoch
    cdef readonly str kind
    cdef readonly long long lo, hi
    cdef readonly str op
    cdef readonly object frames
    cdef readonly object gen
    cdef readonly long long block
    cdef readonly long long per, ch


cdef class _Extent:
    cdef readonly object base, end, gen
    cdef readonly long long sid
    cdef readonly list recs
    cdef readonly object written, frames, op, rs, held
    cdef readonly bint pinned
    cdef readonly long long hv
    cdef readonly bint lib


cpdef bint _disjoint(_Rec r, long long lo, long long hi, long long per, long long ch) except -1

@cython.locals(r=_Rec)
cdef _Rec _new_rec(long long sid, object stream_id, long long epoch, str kind, long long lo, long long hi, str op,
                   object frames, object gen, long long block, long long per=*, long long ch=*)

cdef long long _R, _W, _O, _NI, _P, _MW  # the mode bits, as C integers
cdef long long _ADDR_LAST           # the last address a record holds (2**63 - 1)

@cython.locals(r=_Rec, n=Py_ssize_t, h=cython.longlong)
cdef int _retire_passed(list recs, dict host) except -1

cdef Py_ssize_t _packed_count(bytes data) except -1

@cython.locals(a=Py_ssize_t, b=Py_ssize_t, m=Py_ssize_t, key=tuple, k0=cython.longlong)
cdef Py_ssize_t _first_from(list starts, long long lo) except -1

@cython.locals(a=Py_ssize_t, b=Py_ssize_t, m=Py_ssize_t, k0=cython.longlong, k1=cython.longlong,
               s0=cython.longlong, s1=cython.longlong)
cdef int _insert_sorted(list starts, tuple key) except -1

@cython.locals(r=_Rec, lo=cython.longlong, hi=cython.longlong, per=cython.longlong, ch=cython.longlong,
               sid=cython.longlong, drop=bint, covered=bint, n=Py_ssize_t, conflict=_Rec)
cdef _Rec _scan(list recs, _Rec rec, dict vc, bint write)

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
    cdef public object mode
    cdef readonly list reports
    cdef readonly dict _groups
    cdef readonly list notes
    cdef public object capture
    cdef public bint outputs_fresh
    cdef readonly object _backend
    cdef readonly bint _atexit
    cdef readonly dict _sids, _by_id, _names, _labels
    cdef readonly object _next_sid
    cdef readonly dict _clock, _seen, _events, _host
    cdef readonly long long _host_version
    cdef readonly dict _regions
    cdef readonly list _starts
    cdef readonly long long _max_len
    cdef readonly dict _live, _gen_at, _grave
    cdef readonly list _grave_starts
    cdef readonly long long _grave_max
    cdef readonly set pinned
    cdef readonly dict _capturing, _cap_events, _captured, _free_sites
    cdef readonly set _graph_mem
    cdef readonly dict _pool_threads
    cdef readonly long long checked, checked_foreign, syncs

    cdef long long _sid(self, object handle) except -1
    @cython.locals(vc=dict)
    cdef dict _vc_of(self, long long sid)
    cdef int _host_join(self, dict vc) except -1
    @cython.locals(r=_Rec)
    cdef _Rec _find_conflict(self, _Rec rec, dict vc, bint rw)
    @cython.locals(recs=list, r=_Rec)
    cdef int _insert(self, _Rec rec, tuple extent) except -1
    @cython.locals(r=_Rec, mine=list, older=list, keep=list, rec=_Rec, conflict=_Rec, wrote=bint, ep=cython.longlong,
                   sid=cython.longlong, h=cython.longlong, base=cython.longlong, end=cython.longlong)
    cdef tuple _retire(self, _Extent ext, object frames)
    @cython.locals(r=_Rec, out=list, starts=list, grave=dict, host=dict, i=Py_ssize_t, n=Py_ssize_t,
                   k0=cython.longlong, k1=cython.longlong, h=cython.longlong, c=cython.longlong, key=tuple,
                   recs=list)
    cdef list _inherit(self, long long lo, long long hi, long long wsid=*, long long wlo=*, long long whi=*,
                       dict vc=*)
    @cython.locals(ext=_Extent, r=_Rec, found=tuple)
    cdef tuple _freed(self, object base, object current=*)
    cdef object _add_rs(self, _Extent ext, long long sid, bint held)
    cdef object _drop_held(self, _Extent ext)
    @cython.locals(sid=cython.longlong, ep=cython.longlong, vc=dict, live=dict, host=dict, hv=cython.longlong,
                   ext=_Extent, rec=_Rec, recs=list, conflict=_Rec, mode=cython.longlong, per=cython.longlong,
                   ch=cython.longlong, write=bint, written=list, found=list, packed=bint, n=Py_ssize_t,
                   k=Py_ssize_t, buf=cython.p_char, p=cython.p_longlong, bad=bint, b=cython.longlong,
                   lo=cython.longlong, hi=cython.longlong, size=cython.longlong, e=cython.longlong)
    cdef list _foreign(self, object stream, str op, object frames, object items, bint synced, bint from_lib=*)
    cdef _Extent _first_sight(self, _Extent ext, object base, object size, long long mode, long long sid,
                              object frames, str op, long long lo=*, long long hi=*, long long per=*, dict vc=*)
