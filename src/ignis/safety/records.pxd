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

cdef class Clock:
    cdef long long *a
    cdef Py_ssize_t n              # entries held: identities 0 .. n - 1 (the rest are at 0)
    cdef readonly long long seen   # a stream's clock: the host version it last joined (-1: none)

    cdef int put(self, long long sid, long long v) except -1
    cdef long long bump(self, long long sid) except -1
    cdef bint join(self, Clock other) except -1
    cdef Clock copy(self)


cdef inline long long clock_at(Clock c, long long sid) noexcept:
    """``sid``'s epoch in ``c`` (0 where it holds none)."""
    return c.a[sid] if <unsigned long long>sid < <unsigned long long>c.n else 0


# The records a compaction drops, released once the array is whole again (records.pyx: _drop).
ctypedef struct dropped_t:
    rec_t *a
    Py_ssize_t n, cap
    rec_t local[8]


cdef class RecordList:
    cdef rec_t *a
    cdef Py_ssize_t n, cap

    cdef int _grow(self) except -1
    cdef int push(self, long long sid, long long epoch, int kind, long long lo, long long hi, long long per,
                  long long ch, long long gen, long long block, object label, object op, object frames) except -1
    cdef int push_copy(self, rec_t *r) except -1
    cdef _Rec view(self, Py_ssize_t i)
    cdef int retire_passed(self, Clock host) except -1
    cdef _Rec scan(self, long long sid, long long lo, long long hi, long long per, long long ch, bint write,
                   Clock vc)
    cdef bint used_elsewhere(self, long long sid, object rs) except -1
    cdef _Rec retire_into(self, RecordList keep, long long sid, long long base, long long end, long long gen,
                          Clock host, Clock vc, object rs)


ctypedef struct grave_t:
    long long base, end
    PyObject *recs         # a RecordList (a reference)


cdef class Graveyard:
    cdef grave_t *a
    cdef Py_ssize_t n, cap
    cdef readonly long long max_len   # the longest extent ever put (the search's reach)

    cdef int put(self, long long base, long long end, RecordList recs) except -1
    cdef int inherit(self, RecordList out, long long lo, long long hi, Clock host, long long wsid, long long wlo,
                     long long whi, Clock vc) except -1
    cdef int prune(self, Clock host) except -1
    cdef Py_ssize_t find(self, long long base, long long end) noexcept


# The sanitizer's foreign extents by base address (records.pyx: AddrMap).
ctypedef struct slot_t:
    long long key          # an address (LLONG_MIN: an empty slot; no address is negative)
    long long gen          # the last generation handed out there
    PyObject *val          # the live object there (a reference), or NULL


cdef class AddrMap:
    cdef slot_t *a
    cdef Py_ssize_t cap, used       # slots, and those holding an address
    cdef int shift                  # 64 - log2(cap): the hash's top bits pick the slot
    cdef readonly Py_ssize_t live   # those holding a live object

    cdef Py_ssize_t _slot(self, long long key) noexcept
    cdef int _grow(self) except -1
    cdef object find(self, long long key)
    cdef long long gen_of(self, long long key) noexcept
    cdef int put(self, long long key, object val, long long gen) except -1
    cdef object take(self, long long key)

cpdef long long addr_of(object base) except -2
