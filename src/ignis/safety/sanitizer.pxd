# Types for the compiled build of sanitizer.py (Cython's pure-Python mode): the
# records the race check scans on every access become extension types with fields
# at fixed offsets, instead of instances whose every attribute is a dictionary or
# descriptor lookup, and the scan of an extent's records runs on them typed.
# sanitizer.py stays the one source.

cimport cython

cdef class _Rec:
    cdef public long long sid
    cdef public object stream_id
    cdef public long long epoch
    cdef public str kind
    cdef public object lo, hi
    cdef public str op
    cdef public object frames, gen, block
    cdef public long long per, ch


cdef class _Extent:
    cdef public object base, end, gen
    cdef public long long sid
    cdef public list recs
    cdef public object written, frames, op, rs
    cdef public bint pinned
    cdef public object hv


cpdef bint _disjoint(_Rec r, object lo, object hi, long long per, long long ch) except -1

@cython.locals(r=_Rec)
cdef _Rec _new_rec(long long sid, object stream_id, long long epoch, str kind, object lo, object hi, str op,
                   object frames, object gen, object block, long long per=*, long long ch=*)

@cython.locals(r=_Rec, keep=list)
cdef int _retire_passed(list recs, dict host) except -1

@cython.locals(r=_Rec, lo=object, hi=object, per=cython.longlong, ch=cython.longlong, sid=cython.longlong,
               drop=bint, covered=bint, keep=list, conflict=_Rec)
cdef _Rec _scan(list recs, _Rec rec, dict vc, bint write)
