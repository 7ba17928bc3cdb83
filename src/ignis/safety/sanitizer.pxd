# Types for the compiled build of sanitizer.py (Cython's pure-Python mode): the
# records the race check scans on every access become extension types with fields
# at fixed offsets (byte ranges as C integers), the sanitizer itself an extension
# type whose state is read without an attribute lookup, and its internal steps C
# calls. sanitizer.py stays the one source.

cimport cython
from ignis.memory.resource cimport ReentrantLock


# Records and extents hold no reference that could lead back to them (strings, integers,
# stacks, lists of records): they stay out of the cyclic collector, which made records
# (one or more per access) count toward its runs.
@cython.no_gc
cdef class _Rec:
    cdef public long long sid
    cdef public object stream_id
    cdef public long long epoch
    cdef public str kind
    cdef public long long lo, hi
    cdef public str op
    cdef public object frames
    cdef public object gen
    cdef public long long block
    cdef public long long per, ch


@cython.no_gc
cdef class _Extent:
    cdef public object base, end, gen
    cdef public long long sid
    cdef public list recs
    cdef public object written, frames, op, rs, held
    cdef public bint pinned
    cdef public long long hv
    cdef public bint lib


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
    cdef dict __dict__              # an instance may have an entry point replaced (tests, recorders)
    cdef public ReentrantLock _lock
    cdef public bint active
    cdef public object mode
    cdef public list reports
    cdef public dict _groups
    cdef public list notes
    cdef public object capture
    cdef public bint outputs_fresh
    cdef public object _backend
    cdef public bint _atexit
    cdef public dict _sids, _by_id, _names, _labels
    cdef public object _next_sid
    cdef public dict _clock, _seen, _events, _host
    cdef public long long _host_version
    cdef public dict _regions
    cdef public list _starts
    cdef public long long _max_len
    cdef public dict _live, _gen_at, _grave
    cdef public list _grave_starts
    cdef public long long _grave_max
    cdef public set pinned
    cdef public dict _capturing, _cap_events, _captured, _free_sites
    cdef public set _graph_mem
    cdef public dict _pool_threads
    cdef public long long checked, checked_foreign

    cdef long long _sid(self, object handle) except -1
    @cython.locals(vc=dict)
    cdef dict _vc_of(self, long long sid)
    cdef int _host_join(self, dict vc) except -1
    @cython.locals(r=_Rec)
    cdef _Rec _find_conflict(self, _Rec rec, dict vc, bint rw)
    @cython.locals(recs=list, r=_Rec)
    cdef int _insert(self, _Rec rec, tuple extent) except -1
    @cython.locals(r=_Rec, mine=list, older=list, keep=list, rec=_Rec, conflict=_Rec, wrote=bint, ep=cython.longlong,
                   sid=cython.longlong, h=cython.longlong, base=cython.longlong)
    cdef tuple _retire(self, _Extent ext, object frames)
    @cython.locals(r=_Rec, out=list, starts=list, grave=dict, host=dict, i=Py_ssize_t, n=Py_ssize_t,
                   k0=cython.longlong, k1=cython.longlong, h=cython.longlong, c=cython.longlong, key=tuple,
                   recs=list)
    cdef list _inherit(self, long long lo, long long hi, long long wsid=*, long long wlo=*, long long whi=*,
                       dict vc=*)
    @cython.locals(ext=_Extent, r=_Rec, found=tuple)
    cdef tuple _freed(self, object base, object current=*)
    @cython.locals(sid=cython.longlong, ep=cython.longlong, vc=dict, live=dict, host=dict, hv=cython.longlong,
                   ext=_Extent, rec=_Rec, recs=list, conflict=_Rec, mode=cython.longlong, per=cython.longlong,
                   ch=cython.longlong, write=bint, written=list, found=list, packed=bint, n=Py_ssize_t,
                   k=Py_ssize_t, buf=cython.p_char, p=cython.p_longlong, bad=bint, b=cython.longlong,
                   lo=cython.longlong, hi=cython.longlong, size=cython.longlong, e=cython.longlong)
    cdef list _foreign(self, object stream, str op, object frames, object items, bint synced, bint from_lib=*)
    cdef _Extent _first_sight(self, _Extent ext, object base, object size, long long mode, long long sid,
                              object frames, str op, long long lo=*, long long hi=*, long long per=*, dict vc=*)
