"""The sanitizer: races between streams and uses after free, found with vector clocks.

Design:
- Every stream has a vector clock (stream id -> epoch). Each checked access
  on a stream advances the stream's own entry. An event record snapshots the
  recording stream's clock; a stream wait joins the event's snapshot into the
  waiting stream's clock; a host synchronization (stream / event / device
  synchronize, or a query that reports completion) joins into the host clock,
  which every stream joins before its next operation (work queued after the
  host saw X completes after X).
- The clocks are driven from the backend itself: enabling the sanitizer wraps
  the backend's event, wait and synchronize operations, so the waits that
  auto-ordering queues, the program's own events and raw backend calls are all
  seen. Disabled, it costs nothing: no wrapper is installed.
- Per block extent, the sanitizer keeps access records: byte range, kind
  (read / write / free), stream and epoch, operation and Python frames. A new
  access is checked against every overlapping record: two accesses conflict
  when one writes (or frees) and the earlier one is not ordered before the
  later (the later stream's clock has not reached the earlier's epoch).
  Records survive a free, so a new allocation at the same addresses is checked
  against the old block's unordered uses (the reuse race). Records that the
  host clock has passed can no longer race and are dropped.
- Stacks are captured as (code, line) pairs, formatted only for a report.
- Modes: ``raise`` (a ``RaceError`` at the second access, before its work is
  queued) or ``collect`` (reports kept in ``reports`` and printed at exit).
"""

from __future__ import annotations

import atexit
import bisect
import itertools
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import OutOfBoundsError, RaceError
from ..memory import ordering as _ord
from ..memory.types import Access, DeviceBlock
from .frames import capture_frames, format_frames

__all__ = ["Sanitizer", "sanitizer", "enable", "disable", "enabled", "is_enabled", "reports"]

_frames = capture_frames


class _Rec:
    __slots__ = ("sid", "stream_id", "epoch", "kind", "lo", "hi", "op", "frames", "gen", "block")

    def __init__(self, sid: int, stream_id: int, epoch: int, kind: str, lo: int, hi: int, op: str,
                 frames: tuple, gen: int, block: int) -> None:
        self.sid, self.stream_id, self.epoch, self.kind = sid, stream_id, epoch, kind
        self.lo, self.hi, self.op, self.frames, self.gen, self.block = lo, hi, op, frames, gen, block

    def describe(self) -> dict[str, Any]:
        return {"stream": self.stream_id, "kind": self.kind, "range": (self.lo - self.block, self.hi - self.block),
                "block": self.block, "generation": self.gen, "op": self.op, "stack": format_frames(self.frames)}

    def line(self) -> str:
        lo, hi = self.lo - self.block, self.hi - self.block
        return (f"{self.kind} of bytes [{lo}, {hi}) of block {self.block:#x} (generation {self.gen}) "
                f"by {self.op} on stream #{self.stream_id}")


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


class Sanitizer:
    """One process-wide checker (``ignis.sanitizer``)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.active = False
        self.mode = "raise"
        self.reports: list[RaceError] = []
        self._backend: Any = None
        self._reset()
        self._atexit = False

    def _reset(self) -> None:
        self._sids: dict[int, int] = {}           # live stream handle -> stream identity
        self._by_id: dict[int, int] = {}          # ignis Stream.id -> identity (outlives the handle)
        self._names: dict[int, int] = {}          # identity -> ignis Stream.id (for reports)
        self._next_sid = itertools.count(1)
        self._clock: dict[int, dict[int, int]] = {}
        self._seen: dict[int, int] = {}           # identity -> host version joined
        self._events: dict[int, dict[int, int]] = {}
        self._host: dict[int, int] = {}
        self._host_version = 0
        self._regions: dict[tuple[int, int], list[_Rec]] = {}  # block extent -> records
        self._starts: list[tuple[int, int]] = []   # sorted extents
        self._max_len = 0
        self.checked = 0

    # -- clocks ------------------------------------------------------------
    def _sid(self, handle: int) -> int:
        sid = self._sids.get(handle)
        if sid is None:
            sid = self._sids[handle] = next(self._next_sid)
            self._clock[sid] = {sid: 0}
        return sid

    def _vc(self, handle: int) -> tuple[int, dict[int, int]]:
        return self._vc_of(self._sid(handle))

    def _vc_of(self, sid: int) -> tuple[int, dict[int, int]]:
        vc = self._clock[sid]
        if self._seen.get(sid) != self._host_version:
            for k, v in self._host.items():
                if vc.get(k, 0) < v:
                    vc[k] = v
            self._seen[sid] = self._host_version
        return sid, vc

    def _host_join(self, vc: dict[int, int]) -> None:
        host = self._host
        changed = False
        for k, v in vc.items():
            if host.get(k, 0) < v:
                host[k] = v
                changed = True
        if changed:
            self._host_version += 1
            self._prune()

    def _prune(self) -> None:
        host = self._host
        dead = []
        for key, recs in self._regions.items():
            recs[:] = [r for r in recs if host.get(r.sid, 0) < r.epoch]
            if not recs:
                dead.append(key)
        for key in dead:
            del self._regions[key]
            del self._starts[bisect.bisect_left(self._starts, key)]

    # -- backend instrumentation ----------------------------------------------
    def _install(self, backend: Any) -> None:
        cls = type(backend)
        san = self

        def event_record(event: int, stream: int) -> None:
            with san._lock:
                _, vc = san._vc(stream)
                san._events[event] = dict(vc)
            cls.event_record(backend, event, stream)

        def stream_wait_event(stream: int, event: int) -> None:
            cls.stream_wait_event(backend, stream, event)
            with san._lock:
                _, vc = san._vc(stream)
                for k, v in san._events.get(event, {}).items():
                    if vc.get(k, 0) < v:
                        vc[k] = v

        def stream_synchronize(stream: int) -> None:
            cls.stream_synchronize(backend, stream)
            with san._lock:
                san._host_join(san._vc(stream)[1])

        def event_synchronize(event: int) -> None:
            cls.event_synchronize(backend, event)
            with san._lock:
                san._host_join(san._events.get(event, {}))

        def device_synchronize(ordinal: int) -> None:
            cls.device_synchronize(backend, ordinal)
            with san._lock:
                for vc in list(san._clock.values()):
                    san._host_join(vc)

        def stream_query(stream: int) -> bool:
            done = cls.stream_query(backend, stream)
            if done:
                with san._lock:
                    san._host_join(san._vc(stream)[1])
            return done

        def event_query(event: int) -> bool:
            done = cls.event_query(backend, event)
            if done:
                with san._lock:
                    san._host_join(san._events.get(event, {}))
            return done

        def stream_destroy(stream: int) -> None:
            cls.stream_destroy(backend, stream)
            with san._lock:
                san._sids.pop(stream, None)  # a new stream may get the same handle

        for fn in (event_record, stream_wait_event, stream_synchronize, event_synchronize, device_synchronize,
                   stream_query, event_query, stream_destroy):
            setattr(backend, fn.__name__, fn)
        self._backend = backend

    def _uninstall(self) -> None:
        b = self._backend
        if b is None:
            return
        for name in ("event_record", "stream_wait_event", "stream_synchronize", "event_synchronize",
                     "device_synchronize", "stream_query", "event_query", "stream_destroy"):
            b.__dict__.pop(name, None)
        self._backend = None

    # -- checks (called by the memory layer through ordering.checker) -------------
    def access(self, block: DeviceBlock, stream: Any, access: Access, span: tuple | None) -> None:
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
            self._report(err)
            return
        if not n:
            return
        kind = "write" if access.writes else "read"
        self._check(block, stream, kind, block.ptr + off, block.ptr + off + n, op, access.reads and access.writes)

    def free(self, block: DeviceBlock) -> None:
        self._check(block, block.alloc_stream, "free", block.ptr, block.ptr + block.bytes, "free", False)

    def _check(self, block: DeviceBlock, stream: Any, kind: str, lo: int, hi: int, op: str, rw: bool) -> None:
        frames = _frames()
        with self._lock:
            self.checked += 1
            sid = self._by_id.get(stream.id)
            if sid is None:  # identities follow Stream objects, so a closed stream keeps its clock
                sid = self._by_id[stream.id] = self._sid(stream.handle)
            sid, vc = self._vc_of(sid)
            self._names[sid] = stream.id
            vc[sid] += 1
            rec = _Rec(sid, stream.id, vc[sid], kind, lo, hi, op, frames, block.generation, block.ptr)
            conflict = self._find_conflict(rec, vc, rw)
            self._insert(rec, (block.ptr, block.ptr + block.bytes))
        if conflict is not None:
            first = conflict
            kind_name = _race_kind(first.kind, kind, first.gen == rec.gen)
            detail = (f"{rec.line()}\n  is not ordered after the earlier\n{first.line()}\n"
                      f"  (no event wait or synchronization between stream #{first.stream_id} and "
                      f"stream #{rec.stream_id} covers it)\n"
                      f"earlier access:\n{format_frames(first.frames)}\n"
                      f"later access:\n{format_frames(rec.frames)}\n"
                      "fix: record an event after the earlier work and make the later stream wait on it "
                      "(or use ordering 'auto')")
            self._report(RaceError(detail, first=first.describe(), second=rec.describe(), kind=kind_name))

    def _find_conflict(self, rec: _Rec, vc: dict[int, int], rw: bool) -> _Rec | None:
        lo, hi = rec.lo, rec.hi
        starts = self._starts
        i = bisect.bisect_left(starts, (lo - self._max_len, 0))
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
                if vc.get(r.sid, 0) >= r.epoch:
                    continue
                return r
        return None

    def _insert(self, rec: _Rec, extent: tuple[int, int]) -> None:
        recs = self._regions.get(extent)
        if recs is None:
            recs = self._regions[extent] = []
            bisect.insort(self._starts, extent)
            self._max_len = max(self._max_len, extent[1] - extent[0])
        if rec.kind == "read":
            recs[:] = [r for r in recs if not (r.sid == rec.sid and r.kind == "read" and r.lo >= rec.lo
                                                and r.hi <= rec.hi)]
        else:
            vc = self._clock[rec.sid]
            recs[:] = [r for r in recs if not (r.lo >= rec.lo and r.hi <= rec.hi
                                                and vc.get(r.sid, 0) >= r.epoch)]
        recs.append(rec)

    def _report(self, err: Exception) -> None:
        if self.mode == "collect":
            with self._lock:
                self.reports.append(err)
            return
        raise err

    # -- control ---------------------------------------------------------------
    def enable(self, mode: str = "raise", backend: Any = None) -> "Sanitizer":
        """Start checking (``mode`` "raise" or "collect") on ``backend`` (default: the current one)."""
        if mode not in ("raise", "collect"):
            raise ValueError(f"sanitizer mode must be 'raise' or 'collect', got {mode!r}")
        from ..backends import get_backend
        with self._lock:
            b = backend or get_backend()
            if self.active and self._backend is not b:
                self._uninstall()
                self._reset()
            if not self.active or self._backend is not b:
                self._install(b)
            self.mode = mode
            self.active = True
            _ord.checker = self
        if mode == "collect" and not self._atexit:
            atexit.register(self._print_at_exit)
            self._atexit = True
        return self

    def disable(self) -> None:
        """Stop checking and forget all state (reports are kept)."""
        with self._lock:
            _ord.checker = None
            self._uninstall()
            self._reset()
            self.active = False

    def clear(self) -> list:
        """Return and forget the collected reports."""
        with self._lock:
            out, self.reports = self.reports, []
            return out

    def summary(self) -> str:
        if not self.reports:
            return f"ignis sanitizer: no problems found ({self.checked} accesses checked)"
        parts = [f"ignis sanitizer: {len(self.reports)} problem(s) found"]
        for i, e in enumerate(self.reports, 1):
            parts.append(f"--- {i}: {type(e).__name__}: {e}")
        return "\n".join(parts)

    def _print_at_exit(self) -> None:
        if self.active and self.mode == "collect" and self.reports:
            print(self.summary(), file=sys.stderr)


sanitizer = Sanitizer()


def enable(mode: str = "raise") -> Sanitizer:
    return sanitizer.enable(mode)


def disable() -> None:
    sanitizer.disable()


def is_enabled() -> bool:
    return sanitizer.active


def reports() -> list:
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
