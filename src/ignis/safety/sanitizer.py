"""The sanitizer: races between streams, uses after free and uninitialized reads,
found with vector clocks over byte ranges.

Design:

- Every stream has a vector clock (stream id -> epoch). Each checked
  operation on a stream advances the stream's own entry. An event record
  snapshots the recording stream's clock; a stream wait joins the event's
  snapshot into the waiting stream's clock; a host synchronization (stream /
  event / device synchronize, or a query that reports completion) joins into
  the host clock, which every stream joins before its next operation (work
  queued after the host saw X completes after X). Clocks are keyed by the
  driver's stream handle, so Ignis's work and a front end's (PyTorch) on one
  CUstream share one clock.
- The clocks are fed by trace handlers (``on_event_record``, ``on_stream_wait_event``,
  ``on_*_synchronize``). Enabling the sanitizer subscribes it to the backend's
  trace registry (``ignis.backends.trace``), so the backend's event, wait,
  synchronize, query and destroy operations call them; front ends call them
  from their own library's trace callbacks. Nothing is patched: disabled, the
  backend has no listener and each of those operations pays one test.
- Access records: byte range (optionally strided: a period and a chunk, so
  column halves of a matrix do not overlap), kind (read / write / free),
  stream and epoch, operation, generation and Python frames. A new access is
  checked against every overlapping record: two accesses conflict when one
  writes (or frees) and the earlier one is not ordered before the later (the
  later stream's clock has not reached the earlier's epoch). Records that the
  host clock has passed can no longer race and are dropped.
- Two homes for records. Ignis blocks: per block extent, found by address
  (``access`` / ``free``, called by the memory layer). Foreign extents: memory
  another allocator hands out (a PyTorch caching-allocator block, pinned host
  memory), keyed by base address, each with its own generation counter bumped
  on every allocation at that address (``extent_allocated`` / ``extent_freed``
  / ``foreign_access``). A freed extent's records (with the free itself) go to
  a graveyard and are copied into every extent allocated over those addresses,
  so the new owner's accesses are checked against the old owner's unordered
  uses (the reuse race); a graveyard entry is replaced when a lifetime at the
  same addresses is freed, and dropped once the host clock has passed it.
  ``record_stream`` streams are exempt: the allocator waits for them before it
  hands the memory out again.
- Uninitialized reads: an extent first seen as an op's output keeps the set of
  byte ranges written since its allocation; a read of bytes outside it is
  reported with the allocation site.
- CUDA graphs: while a stream captures (``capture_begin``), an access queued on it,
  or on a stream that joined the capture by waiting for an event recorded on a
  capturing stream, is recorded into the capture instead of checked: nothing runs
  then. Memory first seen as an output inside the capture is the graph's (its
  private pool: freed and reused within the capture without a word). At
  ``capture_end`` the records become one replay (each range once; a read of bytes
  the graph itself wrote earlier skips the uninitialized-read check), and the
  graph's memory still allocated starts a fresh lifetime that its replays write.
  Each ``replay`` checks that every other block the graph touches still holds the
  lifetime (generation) it held at capture (a block freed or reallocated since is
  reported with the capture's site, the replay's and the free's or new owner's),
  then applies the replay as one access on the replay stream.
- Stacks are captured as (code, line) pairs, formatted only for a report.
  Reports are grouped by kind and the pair of sites, with a count.
- Modes: ``raise`` (an error at the second access) or ``collect`` (reports
  kept in ``reports`` and printed at exit).
"""

from __future__ import annotations

import atexit
import itertools
import os
import struct
import sys
import threading
from bisect import bisect_left, bisect_right, insort
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

# The sanitizer runs compiled, as the rest of the package does: it calls its record store
# (records.pyx) through C methods that plain Python cannot reach. The plain-Python branches
# below (``_COMPILED`` false) remain only for reading the source as Python.
try:  # compiled, this is Cython's; as plain Python, its shadow module if installed (not required)
    import cython
    _COMPILED = cython.compiled
except ImportError:  # plain Python without Cython: its class decorators do nothing
    from .._cython_shim import cython
    _COMPILED = False

from ..errors import OutOfBoundsError, RaceError, UninitializedReadError
from ..memory.hooks import set_checker as _set_checker
from .._types import Access
from ..memory.block import DeviceBlock
from ..memory.resource import ReentrantLock
from .frames import capture_frames, format_frames, last_from_library, resolve, sites
from .records import AddrMap, Clock, Graveyard, RecordList, _new_rec, _Rec, addr_of

__all__ = ["Sanitizer", "sanitizer", "enable", "disable", "enabled", "is_enabled", "reports", "pack_items",
           "unpack_items", "user_frames", "UninitializedReadError", "READ", "WRITE", "OUTPUT", "NO_INIT_CHECK",
           "PINNED", "MAYBE_WRITE", "HOST"]


def user_frames() -> tuple:
    """The user's frames at the call into Ignis. Nothing is skipped by count: this module
    is compiled (it has no Python frames), and the walk drops Ignis's own Python frames,
    so the innermost user frame is the first one kept however the call got here."""
    return capture_frames(1)


# Mode bits of a foreign access (``foreign_access`` items). ``MAYBE_WRITE``: the operation may
# have written the bytes (a schema that does not say): they count as written afterwards, with
# no write record (a read's races are checked as a read's).
READ, WRITE, OUTPUT, NO_INIT_CHECK, PINNED, MAYBE_WRITE = 1, 2, 4, 8, 16, 32
# The same bits for the checks themselves: C integers in the compiled build (sanitizer.pxd),
# so testing an item's mode makes no Python object.
_R, _W, _O, _NI, _P, _MW = READ, WRITE, OUTPUT, NO_INIT_CHECK, PINNED, MAYBE_WRITE
HOST = None  # the stream of an access the host makes itself (a CPU op on pinned memory)
_INF = float("inf")
_ADDR_END = 1 << 63  # addresses are C long longs in the records
_ADDR_LAST = _ADDR_END - 1
# Packed items: each one (base, size, lo, hi, period, chunk, mode) as seven native int64s.
_PACKED = struct.Struct("=7q")  # 56 bytes


def pack_items(items: list[tuple]) -> bytes:
    """``foreign_access`` items packed (what the PyTorch front end's op observer hands over)."""
    return b"".join(_PACKED.pack(*it) for it in items)


def _packed_count(data: bytes) -> int:
    """How many items ``data`` packs (ValueError if its length is not a whole number of them)."""
    n = len(data)
    if n % 56:
        raise ValueError(f"ignis sanitizer: packed items are 56 bytes each (pack_items); got {n} bytes")
    return n // 56


def unpack_items(data: bytes) -> list[tuple]:
    """Packed ``foreign_access`` items as a list of 7-tuples."""
    _packed_count(data)
    return list(_PACKED.iter_unpack(data))


# Extents stay out of the cyclic collector (sanitizer.pxd says why). The directive works only
# here, on the class itself: Cython ignores it in the .pxd.
@cython.no_gc
@cython.cclass
class _Extent:
    """Memory tracked outside Ignis's blocks: one allocation's lifetime at ``base``.

    ``end`` is None until an access says how large it is (the allocator's trace
    gives only the address). ``written`` is None when every byte counts as
    written (or its history is unknown), else the sorted disjoint byte ranges
    (relative to ``base``) written since the allocation."""

    __slots__ = ("base", "end", "gen", "sid", "recs", "written", "frames", "op", "rs", "held", "pinned", "hv",
                 "lib")

    def __init__(self, base: int, end: int | None, gen: int, sid: int) -> None:
        self.base, self.end, self.gen, self.sid = base, end, gen, sid
        self.recs = RecordList()
        self.written: list[tuple[int, int]] | None = None
        self.frames: tuple | None = None
        self.op = "an allocation"
        self.rs: set[int] | None = None   # record_stream streams of this lifetime
        self.held: set[int] | None = None  # those of ``rs`` only a holder's reference stands for
        self.pinned = False
        self.hv = -1                       # the host clock's version when records were last pruned
        self.lib = False                   # a library's code allocated it (see foreign_access)


def _race_kind(first: str, second: str, same_gen: bool) -> str:
    if not same_gen:
        return "reuse race"
    if second == "free":
        return "use-after-free race"
    if first == "free":
        return "use-after-free race"
    if first == "write" and second == "read":
        return "read-after-write race"
    if first == "read":
        return "write-after-read race"
    return "write-after-write race"


def _disjoint(r: _Rec, lo: int, hi: int, per: int, ch: int) -> bool:
    """Whether two overlapping spans, at least one strided, touch no common byte."""
    return spans_disjoint(r.lo, r.hi, r.per, r.ch, lo, hi, per, ch)  # noqa: F821 (cimported: sanitizer.pxd)


def _covered(written: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether [lo, hi) lies inside one of the sorted disjoint ranges ``written``."""
    a, b = 0, len(written)
    while a < b:  # the first range starting after lo
        m = (a + b) // 2
        if written[m][0] <= lo:
            a = m + 1
        else:
            b = m
    return a > 0 and written[a - 1][1] >= hi


def _covered_ranges(ranges: list, lo: int, hi: int) -> bool:
    """Whether [lo, hi) lies within the union of ``ranges`` (unsorted (lo, hi) pairs)."""
    pos = lo
    for a, b in sorted(ranges):
        if a > pos:
            break
        if b > pos:
            pos = b
        if pos >= hi:
            return True
    return pos >= hi


def _mark(ext: _Extent, lo: int, hi: int) -> int:
    """Add [lo, hi) (relative to the base) to the written ranges, merging neighbours."""
    w = ext.written
    if w is None:
        return 0
    i, b = 0, len(w)
    while i < b:  # the first range starting at or after lo
        m = (i + b) // 2
        if w[m][0] < lo:
            i = m + 1
        else:
            b = m
    if i and w[i - 1][1] >= lo:
        i -= 1
    j = i
    while j < len(w) and w[j][0] <= hi:
        lo, hi = min(lo, w[j][0]), max(hi, w[j][1])
        j += 1
    w[i:j] = [(lo, hi)]
    if len(w) == 1 and lo <= 0 and hi >= ext.end - ext.base:
        ext.written = None
    return 0


class _Capture:
    """A CUDA graph's accesses: while it captures, and after (its replay).

    ``streams``: the stream identities capturing into it; ``records``: (op, frames, items)
    in capture order; ``mine``: bases of the graph's own memory (first seen as an output
    inside the capture) -> size, those still allocated; ``private``: every such base;
    ``gens``: other bases -> (the extent's generation at capture, or None when it had none
    there, and the address's last generation then); ``plan``: the replay's items; ``site``:
    the capture's top user frame, as reports name the graph."""

    __slots__ = ("streams", "records", "mine", "private", "gens", "frames", "plan", "site", "open", "first",
                 "recorded", "managed")

    def __init__(self, frames: Any) -> None:
        self.streams: set[int] = set()
        self.records: list[tuple[str, Any, list]] = []
        self.mine: dict[int, int] = {}
        self.private: set[int] = set()
        self.gens: dict[int, tuple[Any, int]] = {}
        self.frames = frames
        self.plan: list[tuple] = []
        self.site = ""
        self.open = True
        self.first: dict[int, tuple] = {}  # base -> (op, frames) of the captured op that used it first
        self.recorded = 0                   # accesses recorded while it captured
        self.managed = False                # its inputs are kept in place by its capturer (graph trees)


class _Entered:
    """``with sanitizer._entered:``: the sanitizer's ``_enter`` (its lock, then a front end's
    deferred calls), and its lock given back at the end."""

    def __init__(self, san: "Sanitizer") -> None:
        self.san = san

    def __enter__(self) -> None:
        self.san._enter()

    def __exit__(self, *exc: object) -> None:
        self.san._lock.give()


class Sanitizer:
    """One process-wide checker (``ignis.sanitizer``).

    Made once, at import, as ``ignis.sanitizer.sanitizer``; use the module's
    ``enable`` / ``disable`` / ``enabled`` / ``reports``.

    Attributes:
        active: True while checking.
        mode: ``"raise"`` or ``"collect"``.
        reports: the problems collected in ``collect`` mode, one per kind and pair of sites
            (each with a ``count``).
    """

    def __init__(self) -> None:
        # Taken by every callback: its take() and give() are C calls in the compiled build
        # (a ``with`` block costs several times as much); ``with`` serves the rest.
        self._lock = ReentrantLock()
        self.active = False
        self._mode = "raise"
        self._reports: list[Exception] = []
        self._groups: dict[tuple, Exception] = {}
        self.notes: list[Callable[[], str]] = []   # front ends' lines for the summary
        self.capture: Callable[[], Any] = user_frames     # how a foreign free takes its stack (a front end's cheaper way)
        # A front end that does not announce allocations (``extent_allocated``) sets this
        # when every extent first seen as an op's output is memory that op allocated: the
        # new lifetime then starts there, its unwritten bytes checked as announced ones are.
        self.outputs_fresh = False
        # A front end that defers its calls (``set_drainer``): run before anything else here.
        self._drainer: Callable[[], Any] | None = None
        self._draining = False
        self._entered = _Entered(self)  # ``with self._entered:``: ``_enter`` ... ``_lock.give()``
        self._caller = 0  # the thread of the foreign access being checked (0: the calling one)
        self._backend: Any = None
        self._reset()
        self._atexit = False

    def _reset(self) -> None:
        self._sids: dict[Any, int] = {}           # live stream handle (None: the host) -> stream identity
        self._by_id: dict[int, int] = {}          # ignis Stream.id -> identity (outlives the handle)
        self._names: dict[int, int] = {}          # identity -> ignis Stream.id (for reports)
        self._labels: dict[int, str] = {}         # identity -> how a foreign access names its stream
        self._next_sid = itertools.count(1)
        self._clock: dict[int, Clock] = {}         # identity -> its stream's clock (records.pyx)
        self._events: dict[int, Clock] = {}        # event handle -> the clock it snapshot where recorded
        self._host = Clock()                       # what the host has waited for
        self._host_version = 0
        self._regions: dict[tuple[int, int], list[_Rec]] = {}  # Ignis block extent -> records
        self._starts: list[tuple[int, int]] = []   # sorted extents
        self._max_len = 0
        self._live = AddrMap()                     # foreign extents by base address, and each address's generation
        self._grave = Graveyard()                 # freed foreign extents' records, by (base, end)
        self.pinned: set[int] = set()              # bases of pinned host extents with records
        self._capturing: dict[int, _Capture] = {}  # stream identity -> the CUDA graph it captures into
        self._cap_events: dict[int, _Capture] = {} # events recorded on capturing streams -> their capture
        self._captured: dict[int, int] = {}        # bases graphs touch -> how many graphs (frees note their stack)
        self._free_sites: dict[tuple, Any] = {}    # (base, generation) -> the frames of its free (captured bases)
        self._graph_mem: set[int] = set()          # bases of any graph's private pool (graphs may share a pool)
        self._pool_threads: dict[int, int] = {}    # threads allocating into a graph pool (outside a capture)
        self.device_streams = 0                    # stream handles other than the host's given identities
        self.checked = 0
        self.checked_foreign = 0
        # Host synchronizations seen (each, whether or not it ordered anything new): a front end
        # compares it around an op to tell that the op synchronized inside (.item(), a blocking copy).
        self.syncs = 0

    # -- clocks ------------------------------------------------------------
    def _sid(self, handle: Any) -> int:
        sid = self._sids.get(handle)
        if sid is None:
            sid = self._sids[handle] = next(self._next_sid)
            self._clock[sid] = Clock()  # (every entry at 0)
            if handle is HOST:
                self._labels[sid] = "the host (CPU)"
            else:
                self.device_streams += 1
                self._labels[sid] = "the default stream (0x0)" if handle == 0 else f"stream {handle:#x}"
        return sid

    # -- a front end's deferred calls ------------------------------------------
    def set_drainer(self, drainer: Callable[[], Any] | None) -> None:
        """Register the callable that runs a front end's deferred calls (None: no longer).

        A front end may hold back its calls into this sanitizer (an op's accesses, a free) and
        hand them over in batches: the sanitizer's code and state then stay in the CPU's caches
        from one call to the next, where one call per op finds them evicted by the framework's
        work in between. ``drainer`` makes those calls, in the order they were made, each as it
        would have been made then (its stack and its stream taken when it happened). Every
        entry point here runs it first, under the lock, so nothing is checked, reported or read
        out of order: a deferred call is only ever late, never reordered. One front end at a
        time defers (the PyTorch front end's op observer): a new drainer replaces the last."""
        with self._lock:
            self._drainer = drainer

    def _drain(self) -> None:
        """Under the lock: the deferred calls first (``set_drainer``). They call back in here
        and find it draining."""
        if self._drainer is not None and not self._draining:
            self._draining = True
            try:
                self._drainer()
            finally:
                self._draining = False

    def _enter(self) -> None:
        """Every entry point's start: take the lock, then make a front end's deferred calls
        (``set_drainer``), so that nothing is checked, reported or read before them. A new entry
        point takes the lock here (``_enter`` ... ``_lock.give()``, or ``with self._entered:``),
        never through ``_lock`` alone."""
        self._lock.take()
        try:
            self._drain()
        except BaseException:
            self._lock.give()
            raise

    def drain(self) -> None:
        """Run a front end's deferred calls now (``set_drainer``); nothing if there are none."""
        self._enter()
        self._lock.give()

    @property
    def reports(self) -> list:
        """The problems collected in ``collect`` mode, one per kind and pair of sites (each with
        a ``count``), deferred calls run first."""
        self.drain()
        return self._reports

    @property
    def mode(self) -> str:
        """``"raise"`` or ``"collect"``. Set: a front end's held calls are made first, in the mode
        they were made in."""
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._enter()
        try:
            self._mode = mode
        finally:
            self._lock.give()

    @property
    def free_stacks(self) -> bool:
        """Whether a foreign free can need its stack: a free races only uses on other streams
        than its own, and CUDA graphs note the frees of memory they replay on. A front end that
        defers a free takes its stack where it happens while this holds (else none)."""
        return self.device_streams > 1 or bool(self._captured)

    def set_stream_label(self, handle: int, label: str) -> None:
        """How reports name the stream ``handle`` in foreign accesses."""
        with self._entered:
            self._labels[self._sid(handle)] = label

    def _vc_of(self, sid: int) -> Clock:
        """The clock of stream identity ``sid``, after joining what the host has seen."""
        vc = self._clock[sid]
        if vc.seen != self._host_version:
            vc.join(self._host)
            vc.seen = self._host_version
        return vc

    def _host_join(self, vc: Clock) -> None:
        if self._host.join(vc):
            self._host_version += 1
            self._prune()

    def _prune(self) -> None:
        host = self._host
        dead = []
        for key, recs in self._regions.items():
            recs[:] = [r for r in recs if clock_at(host, r.sid) < r.epoch]
            if not recs:
                dead.append(key)
        for key in dead:
            del self._regions[key]
            del self._starts[bisect_left(self._starts, key)]
        self._grave.prune(host)  # (most of the graveyard dies at a synchronization: one pass)
        for base in list(self.pinned):
            ext = self._live.find(base)
            if ext is not None:
                ext.recs.retire_passed(host)
                if len(ext.recs):
                    continue
                self._live.take(base)
            self.pinned.discard(base)

    # -- trace handlers: the backend's trace registry and the front ends call these --
    def on_event_record(self, event: int, stream: int) -> None:
        """``event`` was recorded on ``stream``: it snapshots the stream's clock (on a capturing
        stream it is a node of the graph: a stream that waits for it joins the capture)."""
        self._enter()
        try:
            sid = self._sid(stream)
            if self._capturing and sid in self._capturing:
                self._cap_events[event] = self._capturing[sid]
                return
            if self._cap_events:
                self._cap_events.pop(event, None)
            self._events[event] = self._vc_of(sid).copy()
        finally:
            self._lock.give()

    def on_event_wait(self, event: int, stream: int) -> None:
        """``on_stream_wait_event`` in PyTorch's trace argument order (PyTorch's callback)."""
        self._enter()
        try:
            if self._cap_events:
                cap = self._cap_events.get(event)
                if cap is not None:
                    if cap.open:  # a fork of the capture: this stream captures into it too
                        sid = self._sid(stream)
                        cap.streams.add(sid)
                        self._capturing[sid] = cap
                    return
            snap = self._events.get(event)
            if snap is not None:
                self._vc_of(self._sid(stream)).join(snap)
        finally:
            self._lock.give()

    def on_stream_wait_event(self, stream: int, event: int) -> None:
        """``stream`` waits for ``event``: it joins the event's snapshot."""
        self.on_event_wait(event, stream)

    def on_stream_synchronize(self, stream: int) -> None:
        """The host waited for ``stream`` (or saw it idle)."""
        self._enter()
        try:
            self.syncs += 1
            self._host_join(self._vc_of(self._sid(stream)))
        finally:
            self._lock.give()

    def on_event_synchronize(self, event: int) -> None:
        """The host waited for ``event`` (or saw it complete)."""
        self._enter()
        try:
            self.syncs += 1
            snap = self._events.get(event)
            if snap is not None:
                self._host_join(snap)
        finally:
            self._lock.give()

    def on_device_synchronize(self, ordinal: int | None = None) -> None:
        """The host waited for every stream (of device ``ordinal``; all are joined, which
        only ever orders more)."""
        with self._entered:
            self.syncs += 1
            for vc in list(self._clock.values()):
                self._host_join(vc)

    def on_stream_destroyed(self, stream: int) -> None:
        """Trace handler: the stream handle ``stream`` was destroyed (a new stream may reuse it).

        Args:
            stream: the driver's stream handle.
        """
        with self._entered:
            self._sids.pop(stream, None)  # a new stream may get the same handle

    def on_event_destroyed(self, event: int) -> None:
        """Trace handler: the event handle ``event`` was destroyed (forget its clock snapshot).

        Args:
            event: the driver's event handle.
        """
        self._enter()
        try:
            self._events.pop(event, None)
        finally:
            self._lock.give()

    # -- backend observation (the trace registry of ignis.backends.trace) -------
    def _install(self, backend: Any) -> None:
        """Subscribe to ``backend``'s trace: its event, wait, synchronize, query and destroy
        operations call the handlers above. Nothing of the backend is replaced."""
        from ..backends import trace
        trace.subscribe(self, backend)
        self._backend = backend

    def _uninstall(self) -> None:
        b = self._backend
        if b is None:
            return
        from ..backends import trace
        trace.unsubscribe(self, b)
        self._backend = None

    # -- checks of Ignis blocks (called by the memory layer through its checker hook) --
    def access(self, block: DeviceBlock, stream: Any, access: Access, span: tuple | None) -> None:
        """Check a tracked use of an Ignis block (the memory layer calls it from
        ``prepare_block_use``), then record it.

        Args:
            block: the ``DeviceBlock`` used.
            stream: the ``Stream`` the use is queued on.
            access: what the use does to the bytes (an ``Access``).
            span: ``(offset, nbytes, op)`` (bytes relative to the block, and the operation's
                name), or None for the whole block.

        Raises:
            OutOfBoundsError: ``span`` reaches outside the block (``raise`` mode).
            RaceError: the use is not ordered after a conflicting earlier one (``raise`` mode).
        """
        if span is None:
            off, n, op = 0, block.bytes, "tracked use"
        else:
            off, n, op = span
        if n and (off < 0 or off + n > block.bytes):
            err = OutOfBoundsError(
                f"{op} on stream #{stream.id} touches bytes [{off}, {off + n}) of a {block.bytes}-byte block "
                f"{block.ptr:#x} (tag {block.tag!r}, generation {block.generation}): outside the block",
                generation=block.generation, ptr=block.ptr, tag=block.tag,
                side="before" if off < 0 else "after", offset=off if off < 0 else block.bytes)
            self._report(err, ("oob", block.ptr, off, n, op))
            return
        if not n:
            return
        kind = "write" if access.writes else "read"
        self._check(block, stream, kind, block.ptr + off, block.ptr + off + n, op, access.reads and access.writes)

    def free(self, block: DeviceBlock) -> None:
        """Check the free of an Ignis block on its alloc stream against earlier uses (the
        memory layer calls it once the release ordering is queued), then record it.

        Args:
            block: the ``DeviceBlock`` freed.

        Raises:
            RaceError: a use on another stream is not ordered before the free (``raise`` mode).
        """
        self._check(block, block.alloc_stream, "free", block.ptr, block.ptr + block.bytes, "free", False)

    def _check(self, block: DeviceBlock, stream: Any, kind: str, lo: int, hi: int, op: str, rw: bool) -> None:
        if hi >= _ADDR_END:  # records keep addresses as C integers (lo and hi lie in the block: access() checked)
            raise ValueError(f"ignis sanitizer: block {block.ptr:#x} ({op}, bytes [{lo:#x}, {hi:#x})) is not an "
                             f"address range below 2**63 (every device and host pointer is)")
        frames = user_frames()
        self._enter()
        try:
            self.checked += 1
            sid = self._by_id.get(stream.id)
            if sid is None:  # identities follow Stream objects, so a closed stream keeps its clock
                sid = self._by_id[stream.id] = self._sid(stream.handle)
            vc: Clock = self._vc_of(sid)
            self._names[sid] = stream.id
            rec = _new_rec(sid, stream.id, vc.bump(sid), kind, lo, hi, op, frames, block.generation, block.ptr)
            conflict = self._find_conflict(rec, vc, rw)
            self._insert(rec, (block.ptr, block.ptr + block.bytes))
        finally:
            self._lock.give()
        if conflict is not None:
            self._race(conflict, rec)

    def _find_conflict(self, rec: _Rec, vc: Clock, rw: bool) -> _Rec | None:
        lo, hi = rec.lo, rec.hi
        starts = self._starts
        i = bisect_left(starts, (lo - self._max_len, 0))
        while i < len(starts) and starts[i][0] < hi:
            key = starts[i]
            i += 1
            if key[1] <= lo:
                continue
            for r in self._regions[key]:
                if r.hi <= lo or r.lo >= hi or r.sid == rec.sid:
                    continue
                if r.kind == "read" and rec.kind == "read":
                    continue
                if clock_at(vc, r.sid) >= r.epoch:
                    continue
                if (r.per or rec.per) and _disjoint(r, lo, hi, rec.per, rec.ch):
                    continue
                return r
        return None

    def _insert(self, rec: _Rec, extent: tuple[int, int]) -> None:
        recs = self._regions.get(extent)
        if recs is None:
            recs = self._regions[extent] = []
            insort(self._starts, extent)
            self._max_len = max(self._max_len, extent[1] - extent[0])
        if rec.kind == "read":
            recs[:] = [r for r in recs if not (r.sid == rec.sid and r.kind == "read" and r.lo >= rec.lo
                                                and r.hi <= rec.hi)]
        elif not rec.per:
            vc = self._clock[rec.sid]
            recs[:] = [r for r in recs if not (r.lo >= rec.lo and r.hi <= rec.hi
                                                and clock_at(vc, r.sid) >= r.epoch)]
        recs.append(rec)

    def _block_at(self, addr: int) -> tuple[int, int] | None:
        """The Ignis block extent holding ``addr``, if the sanitizer has seen it (and not its free)."""
        starts = self._starts
        i = bisect_right(starts, (addr, _INF)) - 1
        while i >= 0 and addr - starts[i][0] < self._max_len:
            key = starts[i]
            if key[0] <= addr < key[1]:
                recs = self._regions[key]
                return key if recs and recs[-1].kind != "free" else None
            i -= 1
        return None

    # -- foreign extents: memory of another allocator (PyTorch's caching allocator) --
    def extent_allocated(self, base: int, stream: int) -> None:
        """An allocator handed out memory at ``base``, ordered on ``stream``: a new
        lifetime (and generation) there. Its size comes with its first access."""
        if addr_of(base) < 0:
            raise ValueError(f"ignis sanitizer: an allocation at {base!r} is not at an address: an address is an "
                             f"integer in [0, 2**63) (every device and host pointer is)")
        with self._entered:
            old = self._live.take(base)
            if old is not None and old.end is not None:  # its free was not seen: retire it quietly
                self._retire(old, None)
            sid = self._sid(stream)
            if self._capturing and sid in self._capturing:  # the graph's private pool
                cap = self._capturing[sid]
                cap.private.add(base)
                cap.mine[base] = 0
                self._graph_mem.add(base)
                return
            self._begin_lifetime(base, None, sid, True)
            if self._pool_threads and threading.get_ident() in self._pool_threads:
                self._graph_mem.add(base)

    def _begin_lifetime(self, base: int, end: int | None, sid: int, bump: bool) -> _Extent:
        """A new lifetime at ``base`` (its extent, made and put in the table, returned): at the
        address's next generation where ``bump``, else at its current one (pinned host memory,
        whose generation moves when it is dropped)."""
        gen = self._live.gen_of(base) + bump
        ext = _Extent(base, end, gen, sid)
        self._live.put(base, ext, gen)
        return ext

    def extent_freed(self, base: int, current: Any = None, frames: Any = ...) -> None:
        """The allocator took ``base`` back (a free ordered on its allocation stream):
        checked against uses on other streams, then kept until the addresses are reused.
        The free's stack is taken (``capture``) only when another stream used the memory.
        ``current``: the stream current where the free happened, when known. A block freed
        while another stream than its own is current is not checked at the free: PyTorch
        hands it only to its own stream's later work, which such code orders after its other
        streams (FSDP2's gradients, CUDA graph trees' warm-up); the new owner's first
        accesses are checked against the old uses instead (the reuse race).
        ``frames``: the free's stack, taken where it happened (or None), for a caller that
        hands the free over later (``set_drainer``); by default it is taken here when needed."""
        found = self._freed(base, current, frames)
        if found is not None:
            self._race(found[0], found[1])

    def _freed(self, base: Any, current: Any = None, stack: Any = ...) -> tuple | None:
        """``extent_freed``'s work, under the lock: (conflict, the free's record) if it races."""
        b = addr_of(base)
        if b < 0:  # (not an address: nothing lives there)
            return None
        self._enter()
        try:
            if self._capturing:
                for cap in self._capturing.values():
                    if base in cap.private:  # freed into the graph's pool, within the capture
                        cap.mine.pop(base, None)
                        return None
            ext = self._live.find(b)
            if ext is None or ext.pinned:
                return None
            if self._graph_mem and base in self._graph_mem:
                # A graph's pool keeps its memory for its graphs (their replays write it in their
                # stream's order): nothing to check, no lifetime to hand on.
                self._live.take(b)
                return None
            if self._captured and base in self._captured:  # a graph replays on it: keep the free's site
                self._free_sites[(base, ext.gen)] = self.capture() if stack is ... else stack
            self._live.take(b)
            if ext.end is None:  # never seen by an access (a library's workspace)
                return None
            sid = ext.sid
            frames = None
            quiet = current is not None and self._sids.get(current, -1) != sid
            if not quiet and ext.recs.used_elsewhere(sid, ext.rs):
                frames = self.capture() if stack is ... else stack
            found = self._retire(ext, frames)
        finally:
            self._lock.give()
        return found if not quiet else None

    def _retire(self, ext: _Extent, frames: Any) -> tuple[_Rec, _Rec] | None:
        """The end of ``ext``'s lifetime (its free on its allocation stream, ``frames`` its stack
        or None): its records go to the graveyard with the free's own record (see
        ``RecordList.retire_into`` for which are kept). Returns (the first use on another stream
        not ordered before the free, the free's record) when there is one, else None."""
        sid = ext.sid
        vc = self._vc_of(sid)
        ep = vc.bump(sid)
        base, end = ext.base, ext.end
        keep = RecordList()
        conflict = ext.recs.retire_into(keep, sid, base, end, ext.gen, self._host, vc, ext.rs)
        label = self._labels[sid]
        keep.push(sid, ep, K_FREE, base, end, 0, 0, ext.gen, base, label, "free", frames)  # noqa: F821 (sanitizer.pxd)
        self._grave.put(base, end, keep)  # it inherited the entry it replaces
        if conflict is None:
            return None
        return conflict, _new_rec(sid, label, ep, "free", base, end, "free", frames, ext.gen, base)

    def begin_lifetimes(self, stream: Any, op: str, frames: Any, items: list, library: int = 0) -> None:
        """The extents of ``items`` (``foreign_access``'s tuples) that no access has shown yet
        begin their lifetime on ``stream``, no byte touched: where their allocator put them.
        A collective reads and writes its buffers on its communication stream, but memory it is
        the first to touch (allocated below the dispatcher, where no op reported it) was handed
        out on the issuing stream, where it is freed and handed out again: its lifetime is the
        issuing stream's, or its free would race every later owner there. Extents already
        known are left as they are; an item's ``OUTPUT`` bit makes the lifetime fresh (its reads
        before a write are uninitialized), as at an op's first sight."""
        self._enter()
        try:
            sid = self._sid(stream)
            if self._capturing and sid in self._capturing:  # queued into a graph: its own rules
                return
            live = self._live
            from_lib = (last_from_library() if library < 0 else library) != 0  # (as foreign_access's)
            for it in items:
                b = addr_of(it[0])
                if b < 0:
                    continue
                ext = live.find(b)
                if ext is None or ext.end is None:
                    self._first_sight(ext, it[0], it[1], it[6] & ~(_R | _W | _MW), sid, frames, op, 0, 0, 0, None,
                                      from_lib)
        finally:
            self._lock.give()

    def extent_record_stream(self, base: int, stream: int, held: bool = False) -> None:
        """The memory at ``base`` is also used on ``stream`` (``Tensor.record_stream``): its
        free waits for that stream, so uses there do not race the free or a reuse.

        ``held``: not the allocator's promise but a holder's: something keeps a reference to
        the memory until the work on ``stream`` is done (PyTorch's collectives keep their
        tensors on their ``Work``), so no free comes before then, unless the memory is
        taken from under the holder (``extent_release``)."""
        self._enter()
        try:
            ext = self._live.get(base)
            if ext is not None:
                self._add_rs(ext, self._sid(stream), held)
        finally:
            self._lock.give()

    def _add_rs(self, ext: _Extent, sid: int, held: bool) -> None:
        """``extent_record_stream``'s change of ``ext`` (lock held; compiled, a C call with the
        extent typed, whose fields are read-only from Python)."""
        if ext.rs is None:
            ext.rs = set()
        if held:
            if sid not in ext.rs:
                if ext.held is None:
                    ext.held = set()
                ext.held.add(sid)
        elif ext.held is not None:
            ext.held.discard(sid)  # the allocator's promise now, whatever a holder does
        ext.rs.add(sid)

    def extent_release(self, base: int) -> None:
        """The memory at ``base`` is about to be freed from under its holders (a storage
        resized to 0 bytes, or moved, while a collective still uses it): the streams they
        held it for (``extent_record_stream(..., held=True)``) no longer delay the free, so
        their unfinished uses race it."""
        self._enter()
        try:
            ext = self._live.get(base)
            if ext is not None and ext.held:
                self._drop_held(ext)
        finally:
            self._lock.give()

    def _drop_held(self, ext: _Extent) -> None:
        """``extent_release``'s change of ``ext`` (lock held; a C call, as ``_add_rs``)."""
        ext.rs.difference_update(ext.held)
        ext.held = None

    def extent_dropped(self, base: int) -> None:
        """Forget a pinned host extent (its memory died; the host allocator orders its reuse)."""
        with self._entered:
            ext = self._live.get(base)
            if ext is not None and ext.pinned:
                self._live.put(base, None, ext.gen + 1)
            self.pinned.discard(base)

    def knows(self, base: int) -> bool:
        """Whether ``base`` is a foreign extent whose size is known."""
        self._enter()
        try:
            ext = self._live.get(base)
            return ext is not None and ext.end is not None
        finally:
            self._lock.give()

    def foreign_access(self, stream: Any, op: str, frames: Any, items: list | bytes, synced: bool = False,
                       library: int = -1, thread: int = 0) -> None:
        """One operation's accesses to foreign memory, queued on ``stream`` (a handle;
        ``HOST`` for the host itself). Each item is ``(base, size, lo, hi, period, chunk,
        mode)``: the extent's base and size (size is read only when the extent is new),
        the absolute byte span, its stride pattern (0, 0 when contiguous) and mode bits
        (``READ``, ``WRITE``, ``OUTPUT``: the op produced it, ``NO_INIT_CHECK``, ``PINNED``).
        ``items`` is a list of such tuples, or ``bytes`` holding them packed
        (``pack_items``: seven native int64s each, read in place when compiled).
        ``synced``: the host waited for the stream inside the operation (``.item()``), after
        its work was queued: the host clock covers it. ``library``: 1 when a library's code made
        the operation, 0 when not, -1 (default): as the capture of ``frames`` found
        (``frames.last_from_library``): memory a library allocated and reads itself is not checked
        for uninitialized reads (its warm-ups read placeholders on purpose). ``thread``: the
        identity of the thread that ran the operation (``threading.get_ident()``), for a caller
        that hands the call over later; 0 (default): this one."""
        found = self._foreign(stream, op, frames, items, synced, last_from_library() if library < 0 else library,
                              thread)
        if found:
            for first, rec in found:
                if isinstance(first, _Extent):
                    self._uninit(first, rec)
                else:
                    self._race(first, rec)

    def _foreign(self, stream: Any, op: str, frames: Any, items: list | bytes, synced: bool,
                 from_lib: bool = False, thread: int = 0) -> list | None:
        """``foreign_access``'s checks, under the lock: the problems found, for reporting after."""
        packed = type(items) is bytes
        if packed and not _COMPILED:
            items, packed = unpack_items(items), False
        if packed:
            n = _packed_count(items)
            buf = items
            p = cython.cast(cython.p_longlong, buf)
        else:
            n = len(items)
        for k in range(n):  # before anything changes: records keep addresses as C integers
            if packed:
                lo, hi = p[7 * k + 2], p[7 * k + 3]
                bad = p[7 * k] < 0 or p[7 * k + 1] < 0 or p[7 * k + 1] > _ADDR_LAST - p[7 * k] or lo < 0 or hi < lo
            else:  # (Python ints, of any size, until they are known to fit)
                it = items[k]
                ilo, ihi = it[2], it[3]
                bad = not (0 <= ilo <= ihi < _ADDR_END and 0 <= it[0] < _ADDR_END and 0 <= it[1] <= _ADDR_LAST - it[0])
            if bad:
                base_, size_, lo_, hi_ = ((p[7 * k], p[7 * k + 1], lo, hi) if packed else
                                          (items[k][0], items[k][1], ilo, ihi))
                raise ValueError(f"ignis sanitizer: {op} reports the byte span [{lo_:#x}, {hi_:#x}) of an extent of "
                                 f"{size_} bytes at {base_:#x}, which is not an address range "
                                 f"below 2**63 (every device and host pointer is)")
            if packed:  # the stride pattern: (0, 0), or a chunk of at most its period, at most the span
                per, ch = p[7 * k + 4], p[7 * k + 5]
                bad = not (0 <= ch <= per <= hi - lo) or (ch and not per)
            else:
                sp, sc = items[k][4], items[k][5]
                bad = not (0 <= sc <= sp <= ihi - ilo) or (sc and not sp)
            if bad:
                sp, sc, lo_, hi_ = (per, ch, lo, hi) if packed else (sp, sc, ilo, ihi)
                raise ValueError(f"ignis sanitizer: {op} reports the stride pattern ({sp}, {sc}) (a chunk of {sc} "
                                 f"bytes every {sp}) over the byte span [{lo_:#x}, {hi_:#x}): a pattern is (0, 0) "
                                 f"for contiguous bytes, else a chunk of at most its period, at most the span")
        found: list | None = None
        self._enter()
        try:
            sid = self._sid(stream)
            self._caller = thread  # (read by _first_sight: 0 is the calling thread)
            if self._capturing and sid in self._capturing:  # queued into a CUDA graph: nothing runs now
                self._capture_op(self._capturing[sid], op, frames, unpack_items(items) if packed else list(items))
                return None
            vc = self._clock[sid]
            if vc.seen != self._host_version:
                self._vc_of(sid)
            ep = vc.bump(sid)
            label = self._labels[sid]
            self.checked_foreign += n
            live, host, hv = self._live, self._host, self._host_version
            written = None
            for k in range(n):
                if packed:
                    b, size, lo, hi = p[7 * k], p[7 * k + 1], p[7 * k + 2], p[7 * k + 3]
                    per, ch, mode = p[7 * k + 4], p[7 * k + 5], p[7 * k + 6]
                else:
                    b, size, lo, hi, per, ch, mode = items[k]
                ext = live.find(b)
                if ext is None or ext.end is None:
                    ext = self._first_sight(ext, b, size, mode, sid, frames, op, lo, hi, per, vc, from_lib)
                    if ext is None:  # inside an Ignis block: checked there
                        c = self._on_block(sid, label, ep, vc, lo, hi, per, ch, mode, op, frames)
                        if c is not None:
                            found = (found or []) + [c]
                        continue
                else:
                    e = ext.end  # (as a C integer: the comparison makes no Python int)
                    if hi > e:
                        ext.end = hi
                if not mode & (_R | _W):
                    continue  # an allocation the op returned: no byte touched yet
                write = mode & _W
                recs = ext.recs
                conflict = None
                if len(recs):
                    if ext.hv != hv:  # the host moved on: records it passed can never race again
                        recs.retire_passed(host)
                        ext.hv = hv
                    conflict = recs.scan(sid, lo, hi, per, ch, write, vc)
                w = ext.written
                uninit = (w is not None and mode & _R and not mode & _NI and not (from_lib and ext.lib)
                          and not _covered(w, lo - b, hi - b))
                if conflict is not None or uninit:  # a report: the access as a record object
                    rec = _new_rec(sid, label, ep, "write" if write else "read", lo, hi, op, frames, ext.gen,
                                   b, per, ch)
                    if conflict is not None:
                        found = (found or []) + [(conflict, rec)]
                    if uninit:
                        found = (found or []) + [(ext, rec)]
                recs.push(sid, ep, K_WRITE if write else K_READ, lo, hi, per, ch, ext.gen, b, label, op,  # noqa: F821
                          frames)
                if w is not None and (write or mode & _MW):
                    if written is None:
                        written = []
                    written.append((ext, lo - b, hi - b))
            if written:
                for ext, a, b in written:
                    _mark(ext, a, b)
            if stream is HOST or synced:  # later work everywhere is ordered after this operation
                if clock_at(host, sid) < ep:
                    host.put(sid, ep)
                    self._host_version += 1
        finally:
            self._caller = 0
            self._lock.give()
        return found

    def _first_sight(self, ext: _Extent | None, base: int, size: int, mode: int, sid: int,
                     frames: tuple | None, op: str, lo: int = 0, hi: int = 0, per: int = 0,
                     vc: Clock | None = None, from_lib: bool = False) -> _Extent | None:
        if ext is None:
            if self._regions and not mode & _P and self._block_at(base) is not None:
                return None
            ext = self._begin_lifetime(base, None, sid, not mode & _P)
            if mode & _O and self.outputs_fresh and not mode & _P:  # allocated by this op
                if self._pool_threads and (self._caller or threading.get_ident()) in self._pool_threads:
                    self._graph_mem.add(base)  # into a graph's pool (a graph tree's warm-up)
                if not (self._graph_mem and base in self._graph_mem):  # (a pool's bytes: its graphs')
                    ext.written = []
                ext.frames, ext.op = frames, op
            else:
                ext.op = "memory allocated before the sanitizer started, or by another library"
            if mode & _P:
                ext.pinned = True
                self.pinned.add(base)
        elif mode & _O:  # a lifetime the trace announced, first seen as an op's output
            ext.written = []
            ext.frames, ext.op = frames, op
        else:  # first seen as an input: something invisible wrote it
            ext.op = f"an allocation first used by {op}"
        if mode & _O:
            ext.lib = from_lib  # (memory a library made and reads itself: no uninitialized-read check)
        end = base + max(size, 1)
        ext.end = end
        # Its records so far (none: nothing accessed it) are the graveyard's over its bytes, less
        # those its first access supersedes when that is a contiguous write over [lo, hi) on sid.
        if len(self._grave):
            if mode & _W and not per and vc is not None:
                self._grave.inherit(ext.recs, base, end, self._host, sid, lo, hi, vc)
            else:
                self._grave.inherit(ext.recs, base, end, self._host, -1, 0, 0, None)
        return ext

    def _on_block(self, sid: int, label: str, ep: int, vc: Clock, lo: int, hi: int, per: int,
                  ch: int, mode: int, op: str, frames: tuple | None) -> tuple | None:
        """A foreign access to an Ignis block's bytes (a tensor imported through DLPack)."""
        key = self._block_at(lo)
        if key is None:
            return None
        gen = self._regions[key][-1].gen
        rec = _new_rec(sid, label, ep, "write" if mode & _W else "read", lo, hi, op, frames, gen, key[0], per, ch)
        conflict = self._find_conflict(rec, vc, False)
        self._insert(rec, key)
        return None if conflict is None else (conflict, rec)

    # -- CUDA graphs ----------------------------------------------------------------
    def capture_begin(self, stream: int, frames: Any = None, managed: bool = False) -> _Capture:
        """``stream`` starts capturing a CUDA graph (``frames``: the capture's site): from now
        on what is queued on it is recorded into the returned capture (see the module's
        description), until ``capture_end``. ``managed``: the graph's inputs are kept in place
        by the code that captures it (CUDA graph trees): its replays check no generation."""
        with self._entered:
            sid = self._sid(stream)
            if sid in self._capturing:
                raise ValueError(f"ignis sanitizer: stream {stream:#x} is capturing already")
            cap = _Capture(frames)
            cap.managed = managed
            cap.streams.add(sid)
            where = resolve(frames)
            if where:
                cap.site = f"{os.path.basename(where[0][0])}:{where[0][1]}"
            self._capturing[sid] = cap
            return cap

    def pool_begin(self) -> None:
        """This thread allocates into a CUDA graph pool from now on, outside a capture (CUDA
        graph trees' warm-up): memory first seen as an output here is a graph pool's."""
        with self._entered:
            t = threading.get_ident()
            self._pool_threads[t] = self._pool_threads.get(t, 0) + 1

    def pool_end(self) -> None:
        """The end of this thread's ``pool_begin``."""
        with self._entered:
            t = threading.get_ident()
            n = self._pool_threads.get(t, 0) - 1
            if n > 0:
                self._pool_threads[t] = n
            else:
                self._pool_threads.pop(t, None)

    def capture_end(self, stream: int) -> _Capture | None:
        """``stream``'s capture ended: returns it, made ready to replay (None when the stream
        was not capturing)."""
        with self._entered:
            sid = self._sids.get(stream)
            cap = self._capturing.get(sid) if sid is not None else None
            if cap is None:
                return None
            for s in cap.streams:
                self._capturing.pop(s, None)
            for e in [e for e, c in self._cap_events.items() if c is cap]:
                del self._cap_events[e]
            cap.open = False
            self._plan(cap, sid)
            return cap

    def _capture_op(self, cap: _Capture, op: str, frames: Any, items: list) -> None:
        for it in items:
            base, size, mode = it[0], it[1], it[6]
            if base not in cap.first:
                cap.first[base] = (op, frames)
            if mode & _O and not mode & _P and base not in cap.gens:
                if base not in cap.private:
                    cap.private.add(base)
                    self._graph_mem.add(base)
                cap.mine[base] = max(size, cap.mine.get(base, 0))
            elif base in cap.private:
                if base in cap.mine and size > cap.mine[base]:
                    cap.mine[base] = size
            elif base not in cap.gens and base not in self._graph_mem:
                ext = self._live.get(base)
                gen = ext.gen if ext is not None and ext.end is not None else None
                cap.gens[base] = (gen, self._live.gen_at(base))
        cap.records.append((op, frames, items))
        cap.recorded += len(items)

    def _plan(self, cap: _Capture, sid: int) -> None:
        """The replay of a capture: each range once, in capture order; a read of bytes the graph
        wrote before it skips the uninitialized-read check. Then the graph's memory still
        allocated starts a fresh lifetime (its replays write it)."""
        written: dict[int, list] = {}
        seen: set = set()
        plan: list[tuple] = []
        for op, frames, items in cap.records:
            marks = []
            for base, size, lo, hi, per, ch, mode in items:
                mine = base in cap.private
                w = written.get(base)
                if mode & _R and not mode & _NI and w is not None and _covered_ranges(w, lo, hi):
                    mode |= _NI
                if not mine:
                    mode &= ~_O
                key = (base, lo, hi, per, ch, mode)
                if key not in seen and mode & (_R | _W | _O | _MW):
                    seen.add(key)
                    plan.append((base, size, lo, hi, per, ch, mode))
                if mode & (_W | _MW):
                    marks.append((base, lo, hi))
            for base, lo, hi in marks:
                written.setdefault(base, []).append((lo, hi))
        cap.plan = plan
        cap.records = []  # (the plan is all a replay needs)
        for base in cap.gens:
            self._captured[base] = self._captured.get(base, 0) + 1
        for base, size in cap.mine.items():  # the graph's own memory: garbage until the first replay
            if not size:
                continue
            old = self._live.take(base)
            if old is not None and old.end is not None:
                self._retire(old, None)
            ext = self._begin_lifetime(base, base + size, sid, True)
            ext.written = []
            ext.frames = cap.frames
            ext.op = f"the capture of the CUDA graph at {cap.site}" if cap.site else "a CUDA graph's capture"

    def replay(self, cap: _Capture, stream: int, frames: Any = None) -> None:
        """The graph ``cap`` is replayed on ``stream`` (``frames``: the replay's site): every block
        it touches outside its own memory must hold the lifetime it held at capture; then its
        accesses are made on ``stream``."""
        if cap.open or not cap.plan:
            return
        bad: list[tuple] = []
        if not cap.managed:
            with self._entered:
                live = self._live
                for base, (gen, at) in cap.gens.items():
                    # (a block no lifetime was known for at the capture has nothing to compare)
                    if gen is not None:
                        ext = live.get(base)
                        if ext is None or ext.gen != gen:
                            bad.append((base, gen, ext))
        label = f"a replay of the CUDA graph captured at {cap.site}" if cap.site else "a CUDA graph replay"
        items = cap.plan
        if bad:
            gone = {b for b, _, _ in bad}
            items = [it for it in items if it[0] not in gone]
            for base, gen, ext in bad:
                self._replay_after_free(cap, base, gen, ext, frames, label)
        if items:
            self.foreign_access(stream, label, frames, items, library=0)

    def _replay_after_free(self, cap: _Capture, base: int, gen: int, ext: Any, frames: Any, label: str) -> None:
        used = next((it for it in cap.plan if it[0] == base), None)
        lo, hi = (used[2] - base, used[3] - base) if used is not None else (0, 0)
        free_frames = self._free_sites.get((base, gen))
        if ext is not None and ext.end is not None:
            now = (f"reallocated to another tensor since (its new lifetime, generation {ext.gen}, began with "
                   f"{ext.op})")
            other = {"kind": "allocation", "op": ext.op, "block": base, "generation": ext.gen,
                     "stack": format_frames(ext.frames) if ext.frames is not None else "  (stack not captured)"}
        else:
            now = "freed since"
            other = {"kind": "free", "op": "free", "block": base, "generation": gen,
                     "stack": format_frames(free_frames) if free_frames is not None else "  (stack not captured)"}
        cop, cframes = cap.first.get(base, (label, cap.frames))
        replayed = {"kind": "replay", "op": label, "block": base, "generation": gen, "range": (lo, hi),
                    "stack": format_frames(frames) if frames is not None else "  (stack not captured)",
                    "captured_op": cop,
                    "capture_stack": format_frames(cframes) if cframes is not None else "  (stack not captured)"}
        detail = (f"{label} touches bytes [{lo}, {hi}) of block {base:#x} (generation {gen} when captured), "
                  f"which was {now}: the graph's kernels still use the old address\n"
                  f"captured ({cop}) at:\n{replayed['capture_stack']}\n"
                  f"replayed at:\n{replayed['stack']}\n"
                  f"{'freed at' if other['kind'] == 'free' else 'new owner allocated at'}:\n{other['stack']}\n"
                  "fix: keep every tensor a graph reads or writes alive and in place while the graph may be "
                  "replayed (copy new data into the captured tensors instead of replacing them)")
        err = RaceError(detail, first=other, second=replayed, kind="use after free by a CUDA graph replay")
        self._report(err, ("graph replay after free", cap.site, sites(frames), other["kind"]))

    # -- reports -------------------------------------------------------------------
    def _race(self, first: _Rec, rec: _Rec) -> None:
        same = first.block == rec.block and first.gen == rec.gen
        kind_name = _race_kind(first.kind, rec.kind, same)
        a, b = first.stream_name(), rec.stream_name()
        if isinstance(rec.stream_id, int):
            fix = "record an event after the earlier work and make the later stream wait on it (or use ordering 'auto')"
        elif self._sids.get(HOST) == rec.sid:
            fix = (f"wait on the host for {a} (an Event recorded after the copy, then event.synchronize(), or "
                   f"stream.synchronize()) before the host touches these bytes again")
        elif rec.kind == "free":
            fix = (f"make {b} wait for {a} before the free (a collective's: work.wait(); else wait_stream or "
                   f"an Event), or call tensor.record_stream() with {a} before the tensor is dropped")
        elif kind_name == "reuse race":
            fix = (f"the memory's previous owner was still in use on {a} when it was freed: record_stream() it "
                   f"on {a}, or make {b} wait for {a} before the new owner touches the memory")
        else:
            fix = f"make {b} wait for {a} between the two (wait_stream, or an Event recorded and waited on)"
        detail = (f"{rec.line()}\n  is not ordered after the earlier\n{first.line()}\n"
                  f"  (no event wait or synchronization between {a} and {b} covers it)\n"
                  f"earlier access:\n{first.describe()['stack']}\n"
                  f"later access:\n{rec.describe()['stack']}\n"
                  f"fix: {fix}")
        err = RaceError(detail, first=first.describe(), second=rec.describe(), kind=kind_name)
        self._report(err, (kind_name, first.op, sites(first.frames), rec.op, sites(rec.frames)))

    def _uninit(self, ext: _Extent, rec: _Rec) -> None:
        size = (ext.end or rec.hi) - ext.base
        alloc = {"kind": "allocation", "op": ext.op, "block": ext.base, "generation": ext.gen,
                 "range": (0, size), "stream": self._labels.get(ext.sid),
                 "stack": format_frames(ext.frames) if ext.frames is not None else "  (stack not captured)"}
        detail = (f"{rec.op} on {rec.stream_name()} reads bytes [{rec.lo - ext.base}, {rec.hi - ext.base}) of "
                  f"block {ext.base:#x} (generation {ext.gen}, {size} bytes), which nothing wrote since "
                  f"{ext.op} allocated it\nread at:\n{rec.describe()['stack']}\n"
                  f"allocated at:\n{alloc['stack']}\n"
                  "fix: write the bytes before reading them (torch.zeros instead of torch.empty, or fill them)")
        err = UninitializedReadError(detail, first=alloc, second=rec.describe())
        self._report(err, ("uninitialized read", ext.op, sites(ext.frames), rec.op, sites(rec.frames)))

    def add_report(self, err: Exception, key: tuple) -> None:
        """Add a problem another checker found (the guard, through the memory layer's checker
        slot) to this sanitizer's reports, grouped with those of equal ``key`` (a hashable
        tuple: the kind first, then what makes two reports the same problem); in raise mode,
        raise it."""
        if type(key) is not tuple:
            raise TypeError(f"add_report: key must be a tuple, got {type(key).__name__}")
        self._report(err, key)

    def _report(self, err: Exception, key: tuple) -> None:
        if self._mode != "collect":
            raise err
        with self._lock:
            g = self._groups.get(key)
            if g is not None:
                g.count += 1  # type: ignore[attr-defined]
                return
            err.count = 1  # type: ignore[attr-defined]
            self._groups[key] = err
            self._reports.append(err)

    # -- control ---------------------------------------------------------------
    def enable(self, mode: str = "raise", backend: Any = None) -> "Sanitizer":
        """Start checking (``mode`` "raise" or "collect") on ``backend`` (default: the current one)."""
        if mode not in ("raise", "collect"):
            raise ValueError(f"sanitizer mode must be 'raise' or 'collect', got {mode!r}")
        from ..backends import get_backend
        with self._entered:
            b = backend or get_backend()
            if self.active and self._backend is not b:
                self._uninstall()
                self._reset()
            if not self.active or self._backend is not b:
                self._install(b)
            self._mode = mode
            self.active = True
            _set_checker(self)
        if mode == "collect" and not self._atexit:
            atexit.register(self._print_at_exit)
            self._atexit = True
        return self

    def disable(self) -> None:
        """Stop checking and forget all state (reports are kept)."""
        with self._entered:
            _set_checker(None)
            self._uninstall()
            self._reset()
            self.active = False

    def clear(self) -> list:
        """Return and forget the collected reports."""
        with self._entered:
            out, self._reports = self._reports, []
            self._groups = {}
            return out

    def summary(self, raised: "Sequence[BaseException]" = ()) -> str:
        """What was checked and what was found, one report per pair of sites.

        Args:
            raised: errors that Ignis's checks raised to the program instead of reporting
                them here (a use after free stops the program in any mode); each is a problem
                found, counted and shown after the collected reports.
        """
        self.drain()
        checked = f"{self.checked} accesses checked"
        if self.checked_foreign:
            checked = f"{self.checked} Ignis accesses and {self.checked_foreign} foreign accesses checked"
        found = [*self._reports, *raised]
        lines = []
        if not found:
            lines.append(f"ignis sanitizer: no problems found ({checked})")
        else:
            total = sum(getattr(e, "count", 1) for e in found)
            note = f", {len(raised)} raised to the program" if raised else ""
            lines.append(f"ignis sanitizer: {len(found)} problem(s) found ({total} report(s), grouped by "
                         f"the pair of sites{note}; {checked})")
        lines += [n() for n in self.notes]
        for i, e in enumerate(found, 1):
            n = getattr(e, "count", 1)
            how = " (raised to the program)" if i > len(self._reports) else ""
            lines.append(f"--- {i}: {type(e).__name__}{how}{f' (seen {n} times)' if n > 1 else ''}: {e}")
        return "\n".join(line for line in lines if line)

    def _print_at_exit(self) -> None:
        self.drain()
        if self.active and self._mode == "collect" and self._reports:
            print(self.summary(), file=sys.stderr)


sanitizer = Sanitizer()


def enable(mode: str = "raise") -> Sanitizer:
    """Start checking Ignis's tracked uses on the current backend.

    Args:
        mode: ``"raise"`` (an error at the second access of a problem) or ``"collect"``
            (reports kept in ``reports()`` and printed at exit).

    Returns:
        The process's ``Sanitizer``.

    Raises:
        ValueError: ``mode`` is neither.
    """
    return sanitizer.enable(mode)


def disable() -> None:
    """Stop checking and forget all state (collected reports are kept)."""
    sanitizer.disable()


def is_enabled() -> bool:
    """True while the sanitizer is checking."""
    return sanitizer.active


def reports() -> list:
    """A copy of the problems collected so far (``collect`` mode), one per kind and pair of sites."""
    return list(sanitizer.reports)


@contextmanager
def enabled(mode: str = "raise") -> Iterator[Sanitizer]:
    """Check everything inside the ``with`` block; restore the previous state after."""
    was, prev_mode = sanitizer.active, sanitizer.mode
    sanitizer.enable(mode)
    try:
        yield sanitizer
    finally:
        if was:
            sanitizer.mode = prev_mode
        else:
            sanitizer.disable()
