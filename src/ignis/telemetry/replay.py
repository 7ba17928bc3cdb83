"""Replay an allocation log against a resource: time, peak reserved memory, fragmentation, failures.

Input: a CSV log with a header, in RMM's layout
(``Thread,Time,Action,Pointer,Size,Stream``: actions ``allocate``, ``free``
and ``allocate failure``, which is skipped; times ``HH:MM:SS.ffffff`` or
epoch seconds; pointers and streams in hex or decimal) or Ignis's own
(``LoggingResource``, the same plus ``Tag,Generation``).

Design:
- Events are replayed in file order (the order the logging adaptor wrote
  them) from one thread; the log's thread ids are only counted. Each distinct
  ``Stream`` value gets its own stream (``0`` is the device's default stream),
  so per-stream reuse behaves as it did.
- A ``free`` of a pointer that is not live in the replay (allocated before
  the log began, or whose allocation failed here) is counted and skipped.
- Out-of-memory and out-of-budget errors are failures to count, not to stop at.
- Reserved memory is read after every allocation (a pool's ``bytes_reserved``;
  the live bytes of a resource without a pool: an AsyncResource's driver pool
  keeps a cache of its own that the driver does not report here).
  Fragmentation is reserved over live (requested) bytes at the reserved peak
  (of the moments at that peak, the one with the most live bytes).
- Whatever the log leaves allocated is freed at the end, the pool trimmed and
  the streams closed (after a device synchronization).
"""

from __future__ import annotations

import csv
import os
import time
from typing import Any, Callable, NamedTuple

from ..errors import OutOfBudgetError
from ..memory import (AsyncResource, BudgetResource, DebugGuardResource, DeviceMemoryResource, DirectResource,
                      PoolResource)
from ..memory.current import default_upstream
from ..runtime import Device
from ..units import parse_bytes
from ._resources import roles

__all__ = ["replay", "read_log", "LogEvent", "RESOURCES", "parse_bytes"]

RESOURCES = ("pool", "async", "direct", "guard")
class LogEvent(NamedTuple):
    """One ``allocate`` or ``free`` line of a log. ``time_s`` is seconds (since
    midnight for ``HH:MM:SS`` times, since the epoch otherwise), ``None`` if absent."""

    thread: str
    time_s: float | None
    action: str
    ptr: int
    size: int
    stream: int
    tag: str


def _int(text: str, what: str, line: int) -> int:
    t = text.strip()
    try:
        return int(t, 16) if t.lower().startswith("0x") else int(t or "0")
    except ValueError:
        raise ValueError(f"line {line}: bad {what} {text!r} (expected a hex or decimal integer)") from None


def _time(text: str) -> float | None:
    t = text.strip()
    if not t:
        return None
    try:
        if ":" in t:
            h, m, sec = t.split(":")
            return int(h) * 3600 + int(m) * 60 + float(sec)
        return float(t)
    except ValueError:
        return None


def read_log(path: "str | os.PathLike[str]") -> tuple[list[LogEvent], dict[str, int]]:
    """Parse a log. Returns the events (``allocate`` / ``free``) and counts of
    what was skipped (``allocate_failures``, ``unknown_actions``)."""
    events: list[LogEvent] = []
    skipped = {"allocate_failures": 0, "unknown_actions": 0}
    with open(os.fspath(path), newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{os.fspath(path)} is empty; expected a CSV header "
                             "Thread,Time,Action,Pointer,Size,Stream")
        cols = {name.strip().lower(): i for i, name in enumerate(header)}
        missing = [c for c in ("action", "pointer", "size") if c not in cols]
        if missing:
            raise ValueError(f"{os.fspath(path)}: the header {header} lacks column(s) {missing}; expected "
                             "Thread,Time,Action,Pointer,Size,Stream (RMM's log layout)")
        ia, ip, isz = cols["action"], cols["pointer"], cols["size"]
        it, itm, ist, itag = cols.get("thread"), cols.get("time"), cols.get("stream"), cols.get("tag")
        for n, row in enumerate(reader, start=2):
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) <= max(ia, ip, isz):
                raise ValueError(f"{os.fspath(path)} line {n}: {len(row)} column(s), expected {len(header)}")
            action = row[ia].strip().lower()
            if action == "allocate failure":
                skipped["allocate_failures"] += 1
                continue
            if action not in ("allocate", "free"):
                skipped["unknown_actions"] += 1
                continue
            get = lambda i: row[i] if i is not None and i < len(row) else ""  # noqa: E731
            events.append(LogEvent(get(it).strip(), _time(get(itm)), action, _int(row[ip], "pointer", n),
                                   _int(row[isz], "size", n), _int(get(ist), "stream", n) if get(ist).strip() else 0,
                                   get(itag).strip() or "replay"))
    return events, skipped


def _make(kind: "str | DeviceMemoryResource", dev: Device) -> DeviceMemoryResource:
    if isinstance(kind, DeviceMemoryResource):
        return kind
    if kind == "pool":
        return PoolResource(default_upstream(dev))
    if kind == "async":
        return AsyncResource(dev)
    if kind == "direct":
        return DirectResource(dev)
    if kind == "guard":
        return DebugGuardResource(PoolResource(default_upstream(dev)), capture_stacks=False)
    raise ValueError(f"unknown resource {kind!r}; use one of {', '.join(RESOURCES)} or pass a DeviceMemoryResource")


def _reserved_fn(mr: DeviceMemoryResource) -> Callable[[], int]:
    ro = roles(mr)
    pool = ro.pool
    if pool is not None:
        return lambda: pool.bytes_reserved
    # Without a pool, what the resource holds is its live blocks (the driver pool
    # behind an AsyncResource keeps its own cache, which the driver does not report here).
    base = ro.allocator
    return lambda: base.memory_numbers()["live_bytes"]


def replay(path: "str | os.PathLike[str]", resource: "str | DeviceMemoryResource" = "pool",
           budget: "int | str | None" = None, *, device: "Device | int | None" = None) -> dict[str, Any]:
    """Replay the allocation log at ``path`` against ``resource`` (``"pool"``,
    ``"async"``, ``"direct"``, ``"guard"``, or a resource to use as it is),
    under a ``budget`` (bytes, or ``"512MiB"``) if given. Returns a report:
    ``events``, ``allocations``, ``frees``, ``time_s``, ``us_per_event``,
    ``peak_reserved_bytes``, ``live_at_peak_bytes``, ``fragmentation``
    (reserved / live at the reserved peak), ``peak_live_bytes``, ``failures``
    (``oom``, ``out_of_budget``, ``unmatched_frees``), ``missing_frees`` (a pointer
    allocated again before the log freed it), ``left_allocated``,
    ``streams``, ``threads`` and what the log skipped."""
    events, skipped = read_log(path)
    dev = Device(0 if device is None else device) if not isinstance(resource, DeviceMemoryResource) \
        else resource.device
    own = not isinstance(resource, DeviceMemoryResource)
    base = _make(resource, dev)
    limit = parse_bytes(budget) if budget is not None else None
    mr = BudgetResource(base, limit) if limit is not None else base
    reserved_now = _reserved_fn(base)
    streams: dict[int, Any] = {}
    made: list[Any] = []

    def stream_for(value: int) -> Any:
        s = streams.get(value)
        if s is None:
            s = dev.default_stream if value == 0 else dev.create_stream()
            if value:
                made.append(s)
            streams[value] = s
        return s

    for e in events:  # streams first: their creation is not part of the timed replay
        stream_for(e.stream)
    live: dict[int, Any] = {}
    live_bytes = peak_live = peak_reserved = live_at_peak = 0
    n_alloc = n_free = oom = over_budget = unmatched = missing_frees = 0
    reserved0 = reserved_now()
    t0 = time.perf_counter()
    try:
        for e in events:
            if e.action == "allocate":
                if e.size <= 0:
                    continue
                old = live.pop(e.ptr, None)
                if old is not None:  # the log reuses a pointer it never freed: free it first
                    mr.deallocate(old)
                    live_bytes -= old.requested
                    missing_frees += 1
                try:
                    block = mr.allocate(e.size, streams[e.stream], e.tag)
                except OutOfBudgetError:
                    over_budget += 1
                    continue
                except MemoryError:
                    oom += 1
                    continue
                n_alloc += 1
                live[e.ptr] = block
                live_bytes += block.requested
                if live_bytes > peak_live:
                    peak_live = live_bytes
                r = reserved_now() - reserved0
                if r > peak_reserved or (r == peak_reserved and live_bytes > live_at_peak):
                    peak_reserved, live_at_peak = r, live_bytes
            else:
                block = live.pop(e.ptr, None)
                if block is None:
                    unmatched += 1
                    continue
                mr.deallocate(block)
                n_free += 1
                live_bytes -= block.requested
        elapsed = time.perf_counter() - t0
    finally:
        left = len(live)
        for block in live.values():
            try:
                mr.deallocate(block)
            except Exception:
                pass
        try:
            dev.synchronize()
            mr.reap_pending()
            if own:
                trim = getattr(base, "trim", None)
                if trim is not None:
                    trim()
                base.close()
        finally:
            for s in made:
                s.close()
    times = [e.time_s for e in events if e.time_s is not None]
    threads = {e.thread for e in events if e.thread}
    return {
        "path": os.fspath(path), "resource": roles(base).describe(), "budget_bytes": limit,
        "device": dev.ordinal, "backend": dev.backend.name, "gpu_timings": dev.backend.gpu_timings,
        "events": len(events), "allocations": n_alloc, "frees": n_free,
        "time_s": elapsed, "us_per_event": elapsed / len(events) * 1e6 if events else 0.0,
        "peak_reserved_bytes": peak_reserved, "live_at_peak_bytes": live_at_peak,
        "fragmentation": peak_reserved / live_at_peak if live_at_peak else None,
        "peak_live_bytes": peak_live,
        "failures": {"oom": oom, "out_of_budget": over_budget, "unmatched_frees": unmatched},
        "missing_frees": missing_frees, "left_allocated": left, "streams": len(streams), "threads": len(threads),
        "log_span_s": (max(times) - min(times)) if times else None,
        "skipped": skipped,
    }
