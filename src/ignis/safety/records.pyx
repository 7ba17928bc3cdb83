"""The sanitizer's record store: access records as C structs, and the loops over them.

A foreign extent (memory another allocator hands out) keeps the records of the accesses
that may still race (``RecordList``); a freed lifetime's records wait in the graveyard
(``Graveyard``) until the host has waited for them or a new lifetime at those addresses
inherits them. Every check of an access walks these records, so they are C structs: a record
costs no Python object, and a walk compares C integers and reads the clocks (``Clock``: C
arrays of stream identity -> epoch) without a Python frame or a dictionary lookup. A record
becomes a Python object (``_Rec``) only when something outside reads it: a report, a test,
the Ignis blocks' own records. The extents themselves are found by their base address in a
C table (``AddrMap``) that also keeps each address's last generation.

What each walk decides is the sanitizer's rule, written here once and described where
``Sanitizer`` calls it (sanitizer.py): ``scan`` (the race check of one access, dropping
the records it supersedes), ``retire_passed`` (records the host passed never race again),
``retire_into`` (a lifetime's records at its free), ``Graveyard.inherit`` (the records a new
lifetime over freed addresses starts with).
"""

cimport cython
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.set cimport PySet_Contains
from libc.stdlib cimport free, malloc, realloc
from libc.limits cimport LLONG_MIN
from libc.string cimport memcpy, memmove, memset

import operator
from typing import Iterator

from .frames import format_frames

_KINDS = ("read", "write", "free")


@cython.no_gc
@cython.final
cdef class _Rec:
    """One access, as a Python object: the stream (its identity ``sid`` and how reports name it,
    ``stream_id``), the clock ``epoch``, ``kind`` ("read", "write" or "free"), the absolute byte
    span [``lo``, ``hi``) with its stride pattern (``per``, ``ch``), the operation ``op``, its
    ``frames``, and the extent (``block``: its base) and ``gen``eration it touched."""

    def __init__(self, sid: int, stream_id: object, epoch: int, kind: str, lo: int, hi: int, op: str,
                 frames: object, gen: object, block: int, per: int = 0, ch: int = 0) -> None:
        self.sid, self.stream_id, self.epoch, self.kind = sid, stream_id, epoch, kind
        self.lo, self.hi, self.op, self.frames, self.gen, self.block = lo, hi, op, frames, gen, block
        self.per, self.ch = per, ch

    def stream_name(self) -> str:
        s = self.stream_id
        return f"stream #{s}" if isinstance(s, int) else s

    def describe(self) -> dict:
        return {"stream": self.stream_id, "stream_name": self.stream_name(), "kind": self.kind,
                "range": (self.lo - self.block, self.hi - self.block), "block": self.block,
                "generation": self.gen, "op": self.op,
                "stack": format_frames(self.frames) if self.frames is not None else "  (stack not captured)"}

    def line(self) -> str:
        lo, hi = self.lo - self.block, self.hi - self.block
        what = f"bytes [{lo}, {hi})" + (f" (every {self.per} bytes, {self.ch} of them)" if self.per else "")
        return (f"{self.kind} of {what} of block {self.block:#x} (generation {self.gen}) "
                f"by {self.op} on {self.stream_name()}")

    def __repr__(self) -> str:
        return f"<record: {self.line()}>"


cpdef _Rec _new_rec(long long sid, object stream_id, long long epoch, str kind, long long lo, long long hi, str op,
                    object frames, object gen, long long block, long long per=0, long long ch=0):
    """A ``_Rec`` without the call of its ``__init__``."""
    cdef _Rec r = _Rec.__new__(_Rec)
    r.sid, r.stream_id, r.epoch, r.kind, r.lo, r.hi = sid, stream_id, epoch, kind, lo, hi
    r.op, r.frames, r.gen, r.block, r.per, r.ch = op, frames, gen, block, per, ch
    return r


cdef bint spans_disjoint(long long rlo, long long rhi, long long rper, long long rch,
                         long long lo, long long hi, long long per, long long ch) noexcept:
    """Whether two overlapping spans, at least one strided, touch no common byte (the first one
    [rlo, rhi) every rper bytes rch of them, the second [lo, hi) every per bytes ch)."""
    cdef long long d
    if rper and per:
        if rper != per:
            return False
        d = (lo - rlo) % per
        return d >= rch and d + ch <= per
    if rper:  # the first strided, the second contiguous
        d = (lo - rlo) % rper
        return lo >= rlo and d >= rch and d + (hi - lo) <= rper
    d = (rlo - lo) % per  # the second strided, the first contiguous
    return rlo >= lo and d >= ch and d + (rhi - rlo) <= per


@cython.no_gc
@cython.final
cdef class Clock:
    """A vector clock: stream identity -> epoch, as a C array indexed by the identity (the
    sanitizer hands identities out from 1, one per stream it meets, so the array stays short).
    An identity it does not hold is at 0. A stream's own clock also notes the version of the
    host's clock it last joined (``seen``). From Python: ``clock[sid]``, ``get``, ``items()``
    (the entries above 0), ``len`` (their number) and ``dict(clock.items())``."""

    def __cinit__(self):
        self.seen = -1

    def __dealloc__(self):
        free(self.a)

    cdef int put(self, long long sid, long long v) except -1:
        """Set ``sid``'s entry to ``v``."""
        cdef Py_ssize_t n
        cdef long long *a
        if sid < 0 or sid >= 1 << 40:
            raise ValueError(f"ignis sanitizer: stream identity {sid} (identities are at least 0, and handed out "
                             f"one per stream)")
        if sid >= self.n:
            n = max(sid + 1, 2 * self.n, 8)
            a = <long long *>realloc(self.a, n * sizeof(long long))
            if a == NULL:
                raise MemoryError("ignis sanitizer: out of host memory for a stream's clock")
            memset(&a[self.n], 0, (n - self.n) * sizeof(long long))
            self.a, self.n = a, n
        self.a[sid] = v
        return 0

    cdef long long bump(self, long long sid) except -1:
        """Advance ``sid``'s entry by one; returns the new epoch."""
        cdef long long v = clock_at(self, sid) + 1
        self.put(sid, v)
        return v

    cdef bint join(self, Clock other) except -1:
        """Raise each entry to ``other``'s where that is later; whether any changed."""
        cdef Py_ssize_t i, m = other.n
        cdef bint changed = False
        while m > 0 and other.a[m - 1] == 0:
            m -= 1
        if m > self.n:
            self.put(m - 1, clock_at(self, m - 1))  # (grows the array first)
        for i in range(m):
            if self.a[i] < other.a[i]:
                self.a[i] = other.a[i]
                changed = True
        return changed

    cdef Clock copy(self):
        """A snapshot (an event's, where it was recorded)."""
        cdef Clock c = Clock.__new__(Clock)
        if self.n:
            c.a = <long long *>malloc(self.n * sizeof(long long))
            if c.a == NULL:
                raise MemoryError("ignis sanitizer: out of host memory for a clock's snapshot")
            memcpy(c.a, self.a, self.n * sizeof(long long))
            c.n = self.n
        return c

    def __getitem__(self, sid: int) -> int:
        return clock_at(self, sid)

    def get(self, sid: int, default: int = 0) -> int:
        v = self[sid]
        return v if v else default

    def items(self) -> list[tuple[int, int]]:
        return [(i, self.a[i]) for i in range(self.n) if self.a[i]]

    def __len__(self) -> int:
        return len(self.items())

    def __repr__(self) -> str:
        return f"<clock {dict(self.items())}>"


cdef inline void _release(rec_t *r) noexcept:
    Py_XDECREF(r.label)
    Py_XDECREF(r.op)
    Py_XDECREF(r.frames)


cdef inline bint _drop(dropped_t *d, rec_t *r) noexcept:
    """Move ``r`` into ``d``, the records a compaction drops; their references are released
    by ``_drop_done``, once the caller's array is whole again (a deallocation may run Python
    code, a ``__del__``, that comes back into the sanitizer, which must then see no
    half-compacted array). False where no memory is left for it: the caller keeps the record
    then (keeping a record is always safe: it is ordered, or superseded by a later one)."""
    cdef rec_t *a
    cdef Py_ssize_t cap
    if d.n == d.cap:
        cap = 2 * d.cap
        if d.a == d.local:
            a = <rec_t *>malloc(cap * sizeof(rec_t))
            if a != NULL:
                memcpy(a, d.local, d.n * sizeof(rec_t))
        else:
            a = <rec_t *>realloc(d.a, cap * sizeof(rec_t))
        if a == NULL:
            return False
        d.a, d.cap = a, cap
    d.a[d.n] = r[0]
    d.n += 1
    return True


cdef inline void _drop_init(dropped_t *d) noexcept:
    d.a, d.n, d.cap = d.local, 0, 8


cdef inline void _drop_done(dropped_t *d) noexcept:
    """Release what ``d`` holds (the records' array is whole again)."""
    cdef Py_ssize_t i
    cdef rec_t *a = d.a
    cdef Py_ssize_t n = d.n
    d.a, d.n, d.cap = d.local, 0, 0  # (a release that comes back finds nothing here)
    for i in range(n):
        _release(&a[i])
    if a != d.local:
        free(a)


cdef inline bint _in(object rs, long long sid) except -1:
    """``sid in rs`` for a set of stream identities, or None (none)."""
    if rs is None:
        return False
    cdef object key = sid
    return PySet_Contains(rs, key) == 1


@cython.final
cdef class RecordList:
    """The records of one lifetime: an extent's (those it inherited from the graveyard, then its
    own accesses, in order), or a graveyard entry's (the lifetime's own records first, then the
    older ones it handed on, then its free). From Python: ``len``, indexing and iteration give
    ``_Rec`` objects (copies)."""

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            _release(&self.a[i])
        free(self.a)

    cdef int _grow(self) except -1:
        cdef Py_ssize_t cap = self.cap * 2 if self.cap else 4
        cdef rec_t *a = <rec_t *>realloc(self.a, cap * sizeof(rec_t))
        if a == NULL:
            raise MemoryError("ignis sanitizer: out of host memory for access records")
        self.a, self.cap = a, cap
        return 0

    cdef int push(self, long long sid, long long epoch, int kind, long long lo, long long hi, long long per,
                  long long ch, long long gen, long long block, object label, object op, object frames) except -1:
        if self.n == self.cap:
            self._grow()
        cdef rec_t *r = &self.a[self.n]
        r.sid, r.epoch, r.kind, r.lo, r.hi, r.per, r.ch = sid, epoch, kind, lo, hi, per, ch
        r.gen, r.block = gen, block
        Py_INCREF(label)
        Py_INCREF(op)
        Py_INCREF(frames)
        r.label, r.op, r.frames = <PyObject *>label, <PyObject *>op, <PyObject *>frames
        self.n += 1
        return 0

    cdef int push_copy(self, rec_t *r) except -1:
        if self.n == self.cap:
            self._grow()
        self.a[self.n] = r[0]
        Py_INCREF(<object>r.label)
        Py_INCREF(<object>r.op)
        Py_INCREF(<object>r.frames)
        self.n += 1
        return 0

    cdef _Rec view(self, Py_ssize_t i):
        cdef rec_t *r = &self.a[i]
        return _new_rec(r.sid, <object>r.label, r.epoch, _KINDS[r.kind], r.lo, r.hi, <object>r.op,
                        <object>r.frames, r.gen, r.block, r.per, r.ch)

    cdef int retire_passed(self, Clock host) except -1:
        """Drop the records the host has waited for: they can never race again (the rest keep
        their order)."""
        cdef Py_ssize_t i, k = 0
        cdef dropped_t gone
        _drop_init(&gone)
        for i in range(self.n):
            if clock_at(host, self.a[i].sid) >= self.a[i].epoch and _drop(&gone, &self.a[i]):
                continue
            if k != i:
                self.a[k] = self.a[i]
            k += 1
        self.n = k
        _drop_done(&gone)  # (the array is whole)
        return 0

    cdef _Rec scan(self, long long sid, long long lo, long long hi, long long per, long long ch, bint write,
                   Clock vc):
        """The first record that races with an access of [lo, hi) (stride ``per``, ``ch``) on
        stream ``sid``, whose clock is ``vc`` (a write when ``write``; the access is not a record
        yet), or None. Records the access supersedes are dropped: the same stream's within its
        span (a read drops only reads), and, for a contiguous write, every record within its
        span ordered before it."""
        cdef Py_ssize_t i, k
        cdef rec_t *r
        cdef bint drop = False, covered
        cdef _Rec conflict = None
        cdef dropped_t gone
        for i in range(self.n):
            r = &self.a[i]
            if r.hi <= lo or r.lo >= hi:
                continue
            covered = r.lo >= lo and r.hi <= hi and not per
            if r.sid == sid:
                if covered and (write or r.kind == K_READ):
                    drop = True  # superseded by this access on the same stream
                continue
            if clock_at(vc, r.sid) >= r.epoch:
                if covered and write:
                    drop = True  # ordered before this write, which covers it
                continue
            if (write or r.kind != K_READ) and conflict is None \
                    and not ((r.per or per) and spans_disjoint(r.lo, r.hi, r.per, r.ch, lo, hi, per, ch)):
                conflict = self.view(i)
        if drop:
            _drop_init(&gone)
            k = 0
            for i in range(self.n):
                r = &self.a[i]
                if r.lo >= lo and r.hi <= hi:
                    if write:
                        if (r.sid == sid or clock_at(vc, r.sid) >= r.epoch) and _drop(&gone, r):
                            continue
                    elif r.sid == sid and r.kind == K_READ and _drop(&gone, r):
                        continue
                if k != i:
                    self.a[k] = r[0]
                k += 1
            self.n = k
            _drop_done(&gone)  # (the array is whole)
        return conflict

    cdef bint used_elsewhere(self, long long sid, object rs) except -1:
        """Whether a record is of another stream than ``sid`` and not of one in ``rs``
        (record_stream streams: a set, or None)."""
        cdef Py_ssize_t i
        for i in range(self.n):
            if self.a[i].sid != sid and not _in(rs, self.a[i].sid):
                return True
        return False

    cdef _Rec retire_into(self, RecordList keep, long long sid, long long base, long long end, long long gen,
                          Clock host, Clock vc, object rs):
        """A lifetime's records at its free on stream ``sid`` (clock ``vc``, the free's epoch in
        it), put into ``keep`` for the graveyard; returns the first use of this lifetime on
        another stream not ordered before the free (None if none).

        Records the host passed, and those of record_stream streams ``rs`` (the allocator waits
        for them), are left out. The lifetime's own records are kept. An older lifetime's
        records (inherited) were checked against this one's first write; a lifetime that never
        wrote hands them on, less the older frees of its own stream within its bytes (the
        free's record, which the caller appends, races whatever they race)."""
        cdef Py_ssize_t i
        cdef rec_t *r
        cdef bint wrote = False
        cdef _Rec conflict = None
        cdef Py_ssize_t older = 0
        for i in range(self.n):
            r = &self.a[i]
            if clock_at(host, r.sid) >= r.epoch or _in(rs, r.sid):
                continue
            if r.block == base and r.gen == gen:
                keep.push_copy(r)
                wrote = wrote or r.kind == K_WRITE
                if conflict is None and r.sid != sid and clock_at(vc, r.sid) < r.epoch:
                    conflict = self.view(i)
            else:
                older += 1
        if older and not wrote:
            for i in range(self.n):
                r = &self.a[i]
                if r.block == base and r.gen == gen:
                    continue
                if clock_at(host, r.sid) >= r.epoch or _in(rs, r.sid):
                    continue
                if r.sid != sid or r.kind != K_FREE or r.lo < base or r.hi > end:
                    keep.push_copy(r)
        return conflict

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> _Rec:
        cdef Py_ssize_t j = i
        if j < 0:
            j += self.n
        if j < 0 or j >= self.n:
            raise IndexError(f"record {i} of {self.n}")
        return self.view(j)

    def __iter__(self) -> Iterator[_Rec]:
        return iter([self.view(i) for i in range(self.n)])

    def __repr__(self) -> str:
        return f"<{self.n} access records>"


@cython.final
cdef class Graveyard:
    """Freed lifetimes' records by extent (base, end), sorted by it: a new lifetime over those
    addresses inherits the ones the host has not passed. From Python: ``len``, iteration over
    its (base, end) keys in address order, ``keys()`` and ``values()`` (its ``RecordList``\ s)."""

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.n):
            Py_XDECREF(self.a[i].recs)
        free(self.a)

    cdef Py_ssize_t find(self, long long base, long long end) noexcept:
        """The index of the first entry at or after (base, end)."""
        cdef Py_ssize_t a = 0, b = self.n, m
        while a < b:
            m = (a + b) // 2
            if self.a[m].base < base or (self.a[m].base == base and self.a[m].end < end):
                a = m + 1
            else:
                b = m
        return a

    cdef int put(self, long long base, long long end, RecordList recs) except -1:
        """The entry of the extent [base, end) is ``recs`` now (it replaces any there: the new
        lifetime inherited it)."""
        cdef Py_ssize_t i = self.find(base, end), cap
        cdef grave_t *a
        Py_INCREF(recs)
        cdef PyObject *old
        if i < self.n and self.a[i].base == base and self.a[i].end == end:
            old = self.a[i].recs
            self.a[i].recs = <PyObject *>recs
            Py_XDECREF(old)  # (after: its records' deallocation may come back here)
            return 0
        if self.n == self.cap:
            cap = self.cap * 2 if self.cap else 16
            a = <grave_t *>realloc(self.a, cap * sizeof(grave_t))
            if a == NULL:
                Py_XDECREF(<PyObject *>recs)
                raise MemoryError("ignis sanitizer: out of host memory for the graveyard")
            self.a, self.cap = a, cap
        memmove(&self.a[i + 1], &self.a[i], (self.n - i) * sizeof(grave_t))
        self.a[i].base, self.a[i].end, self.a[i].recs = base, end, <PyObject *>recs
        self.n += 1
        if end - base > self.max_len:
            self.max_len = end - base
        return 0

    cdef int inherit(self, RecordList out, long long lo, long long hi, Clock host, long long wsid, long long wlo,
                     long long whi, Clock vc) except -1:
        """Append to ``out`` the records of freed extents over [lo, hi) the host has not passed,
        for the lifetime starting there. Where its first access is a contiguous write over
        [wlo, whi) on stream ``wsid`` (clock ``vc``; else wsid -1), the records that write
        supersedes are left out: the scan would drop them at once (those of its own stream and
        those ordered before it, within its span)."""
        cdef Py_ssize_t i, j
        cdef RecordList recs
        cdef rec_t *r
        if not self.n:
            return 0
        i = self.find(lo - self.max_len, LLONG_MIN)  # the first entry starting at or after lo - max_len
        while i < self.n:
            if self.a[i].base >= hi:
                break
            if self.a[i].end > lo:
                recs = <RecordList>self.a[i].recs
                for j in range(recs.n):
                    r = &recs.a[j]
                    if r.hi > lo and r.lo < hi and clock_at(host, r.sid) < r.epoch:
                        if wsid >= 0 and r.lo >= wlo and r.hi <= whi:
                            if r.sid == wsid or clock_at(vc, r.sid) >= r.epoch:
                                continue
                        out.push_copy(r)
            i += 1
        return 0

    cdef int prune(self, Clock host) except -1:
        """Drop the records the host has passed, and the entries left with none (one pass; the
        rest keep their order)."""
        cdef Py_ssize_t i, k = 0
        cdef RecordList recs
        cdef list dead = []
        i = 0
        while i < self.n:  # first each entry's records (whatever they free may come back here)
            (<RecordList>self.a[i].recs).retire_passed(host)
            i += 1
        for i in range(self.n):  # then the entries left empty, the graveyard whole before they go
            recs = <RecordList>self.a[i].recs
            if recs.n:
                if k != i:
                    self.a[k] = self.a[i]
                k += 1
            else:
                dead.append(recs)
                Py_XDECREF(self.a[i].recs)
        self.n = k
        return 0

    def __len__(self) -> int:
        return self.n

    def keys(self) -> list:
        return [(self.a[i].base, self.a[i].end) for i in range(self.n)]

    def values(self) -> list:
        return [<object>self.a[i].recs for i in range(self.n)]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"<graveyard of {self.n} freed extents>"


@cython.final
cdef class AddrMap:
    """Live objects by address, with the last generation handed out at each address: the
    sanitizer's foreign extents by base (an open-addressing table of C integers, where a dict
    would box each address and hash it as a Python integer on every access). An address, once
    seen, keeps its slot (its generation outlives its object), so nothing is ever deleted and
    no probe sequence breaks. From Python, a mapping of the live objects: ``m[base]``, ``get``,
    ``in``, ``len``, iteration over the addresses, ``keys()``, ``values()``, ``items()``; and
    ``gen_at(base)``."""

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self.cap):
            Py_XDECREF(self.a[i].val)
        free(self.a)

    cdef Py_ssize_t _slot(self, long long key) noexcept:
        """The slot of ``key``, or the empty slot where it would go (-1 while the table is empty)."""
        cdef Py_ssize_t mask, i
        if not self.cap:
            return -1
        mask = self.cap - 1
        i = _hash(key, self.shift)
        while self.a[i].key != key and self.a[i].key != LLONG_MIN:
            i = (i + 1) & mask
        return i

    cdef int _grow(self) except -1:
        cdef Py_ssize_t cap = self.cap * 2 if self.cap else 64, i, j, mask = cap - 1
        cdef int shift = self.shift - 1 if self.cap else 58  # (64 - log2 of the slots)
        cdef slot_t *a = <slot_t *>malloc(cap * sizeof(slot_t))
        cdef slot_t *old = self.a
        if a == NULL:
            raise MemoryError("ignis sanitizer: out of host memory for the table of extents")
        for i in range(cap):
            a[i].key, a[i].gen, a[i].val = LLONG_MIN, 0, NULL
        for i in range(self.cap):
            if old[i].key != LLONG_MIN:
                j = _hash(old[i].key, shift)
                while a[j].key != LLONG_MIN:
                    j = (j + 1) & mask
                a[j] = old[i]
        self.a, self.cap, self.shift = a, cap, shift
        free(old)
        return 0

    cdef object find(self, long long key):
        """The live object at ``key``, or None."""
        cdef Py_ssize_t i = self._slot(key)
        if i < 0 or self.a[i].val == NULL:
            return None
        return <object>self.a[i].val

    cdef long long gen_of(self, long long key) noexcept:
        """The last generation handed out at ``key`` (0: none)."""
        cdef Py_ssize_t i = self._slot(key)
        return self.a[i].gen if i >= 0 and self.a[i].key == key else 0

    cdef int put(self, long long key, object val, long long gen) except -1:
        """``val`` (None: nothing) is live at ``key`` now, and ``gen`` the last generation there."""
        cdef Py_ssize_t i
        cdef PyObject *old
        if key == LLONG_MIN:
            raise ValueError(f"ignis sanitizer: {key} is not an address")
        i = self._slot(key)
        if i < 0 or self.a[i].key != key:
            if 2 * (self.used + 1) > self.cap:
                self._grow()
                i = self._slot(key)
            self.a[i].key, self.a[i].val = key, NULL
            self.used += 1
        old = self.a[i].val
        self.a[i].gen = gen
        if val is None:
            self.a[i].val = NULL
        else:
            Py_INCREF(val)
            self.a[i].val = <PyObject *>val
            if old == NULL:
                self.live += 1
        if old != NULL:
            if val is None:
                self.live -= 1
            Py_XDECREF(old)  # (last: its deallocation may come back here)
        return 0

    cdef object take(self, long long key):
        """Remove the live object at ``key`` and return it (None if there was none); the
        generation stays."""
        cdef Py_ssize_t i = self._slot(key)
        cdef object val
        if i < 0 or self.a[i].val == NULL:
            return None
        val = <object>self.a[i].val  # (a reference of its own: the slot's goes)
        Py_XDECREF(self.a[i].val)
        self.a[i].val = NULL
        self.live -= 1
        return val

    def gen_at(self, base: int) -> int:
        """The last generation handed out at ``base`` (0: none)."""
        cdef long long b = addr_of(base)
        return self.gen_of(b) if b >= 0 else 0

    def get(self, base: object, default: object = None) -> object:
        cdef long long b = addr_of(base)
        v = self.find(b) if b >= 0 else None
        return default if v is None else v

    def __getitem__(self, base: object) -> object:
        cdef long long b = addr_of(base)
        v = self.find(b) if b >= 0 else None
        if v is None:
            raise KeyError(base)
        return v

    def __contains__(self, base: object) -> bool:
        cdef long long b = addr_of(base)
        return b >= 0 and self.find(b) is not None

    def __len__(self) -> int:
        return self.live

    def keys(self) -> list:
        return [self.a[i].key for i in range(self.cap) if self.a[i].val != NULL]

    def values(self) -> list:
        return [<object>self.a[i].val for i in range(self.cap) if self.a[i].val != NULL]

    def items(self) -> list:
        return [(self.a[i].key, <object>self.a[i].val) for i in range(self.cap) if self.a[i].val != NULL]

    def __iter__(self) -> Iterator[int]:
        return iter(self.keys())

    def __repr__(self) -> str:
        return f"<{self.live} live extents by address>"


cdef inline Py_ssize_t _hash(long long key, int shift) noexcept:
    """A slot for ``key`` among 2**(64 - shift): the top bits of a multiplicative hash, which
    every bit of the key moves."""
    return <Py_ssize_t>((<unsigned long long>key * 0x9E3779B97F4A7C15ULL) >> shift)


cpdef long long addr_of(object base) except -2:
    """``base`` as an address (any integer: ``int``, a subclass, NumPy's), or -1 where it is
    not one: not an integer, or outside [0, 2**63)."""
    cdef int overflow = 0
    cdef long long b
    if type(base) is not int:
        try:
            base = operator.index(base)
        except TypeError:
            return -1
    b = PyLong_AsLongLongAndOverflow(base, &overflow)
    return -1 if overflow or b < 0 else b
