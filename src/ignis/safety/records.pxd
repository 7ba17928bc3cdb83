# The sanitizer's record store (records.pyx): the access records of foreign extents and of the
# graveyard as C structs, and the loops over them (the race scan, the retiring of records the
# host passed, a lifetime's retirement into the graveyard, the inheritance of a new lifetime).
# The sanitizer (sanitizer.py) decides what is checked and reports; this module holds the
# records and answers its questions without a Python object per record. ``_Rec`` is a record
# as a Python object: what reports describe, tests read, and the Ignis blocks' path keeps.

from cpython.object cimport PyObject

cdef enum:
    K_READ = 0
    K_WRITE = 1
    K_FREE = 2


ctypedef struct rec_t:
    long long sid          # the stream identity
    long long epoch        # its clock's entry when the access was queued
    long long lo, hi       # the absolute byte span
    long long per, ch      # its stride pattern (0, 0: contiguous)
    long long block        # the extent's base
    long long gen          # the extent's generation
    int kind               # K_READ, K_WRITE or K_FREE
    PyObject *label        # how reports name the stream (a reference)
    PyObject *op           # the operation's name (a reference)
    PyObject *frames       # its stack, or None (a reference)


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


cpdef _Rec _new_rec(long long sid, object stream_id, long long epoch, str kind, long long lo, long long hi, str op,
                    object frames, object gen, long long block, long long per=*, long long ch=*)

cdef bint spans_disjoint(long long rlo, long long rhi, long long rper, long long rch,
                         long long lo, long long hi, long long per, long long ch) noexcept

cdef long long clock_at(dict clock, long long sid) except? -1


cdef class RecordList:
    cdef rec_t *a
    cdef Py_ssize_t n, cap

    cdef int _grow(self) except -1
    cdef int push(self, long long sid, long long epoch, int kind, long long lo, long long hi, long long per,
                  long long ch, long long gen, long long block, object label, object op, object frames) except -1
    cdef int push_copy(self, rec_t *r) except -1
    cdef _Rec view(self, Py_ssize_t i)
    cdef int retire_passed(self, dict host) except -1
    cdef _Rec scan(self, long long sid, long long lo, long long hi, long long per, long long ch, bint write,
                   dict vc)
    cdef bint used_elsewhere(self, long long sid, object rs) except -1
    cdef _Rec retire_into(self, RecordList keep, long long sid, long long base, long long end, long long gen,
                          dict host, dict vc, object rs)


ctypedef struct grave_t:
    long long base, end
    PyObject *recs         # a RecordList (a reference)


cdef class Graveyard:
    cdef grave_t *a
    cdef Py_ssize_t n, cap
    cdef readonly long long max_len   # the longest extent ever put (the search's reach)

    cdef int put(self, long long base, long long end, RecordList recs) except -1
    cdef int inherit(self, RecordList out, long long lo, long long hi, dict host, long long wsid, long long wlo,
                     long long whi, dict vc) except -1
    cdef int prune(self, dict host) except -1
    cdef Py_ssize_t find(self, long long base, long long end) noexcept
