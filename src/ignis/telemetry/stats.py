"""``memory_stats``, ``memory_summary``, ``reset_peak_stats``: the numbers of a device's memory.

Design:
- Current values cost nothing until asked for: ``memory_stats`` reads the
  allocator's own counters and walks its segments and live blocks (under its
  lock) at the moment it is called. The allocator is the first
  ``PoolResource`` of the device's current resource stack, else the bottom
  resource (see ``_resources``).
- Peaks and running totals need every event, so they are opt-in:
  ``enable_stats()`` subscribes a collector to the allocation-event hook,
  ``disable_stats()`` removes it (the hot path is back to one attribute
  test). ``IGNIS_MEMORY_STATS=1`` enables it at import. On the hot path the
  collector only queues each event (one append); the queue is counted, in
  order, into per-allocator current / peak / total counters when statistics
  are read or when it grows long, so peaks stay exact.
- A collector that first meets an allocator seeds its counters from a census
  (at ``enable_stats()`` for the devices' current resources, else at that
  allocator's first allocation or free event, which resources report outside
  their lock; never at a segment event, which a pool reports with its lock held).

Keys follow PyTorch's ``torch.cuda.memory_stats``: ``"<stat>.<pool>.<metric>"``
with stat in ``allocation`` (count), ``allocated_bytes``, ``requested_bytes``,
``active`` / ``active_bytes`` (allocated plus freed-but-not-yet-reusable),
``segment`` / ``reserved_bytes`` (memory held from below), ``inactive_split`` /
``inactive_split_bytes`` (free pieces of partly used segments: current only);
pool in ``all``, ``small_pool``, ``large_pool``; metric in ``current`` and,
while collecting, ``peak``, ``allocated`` (the running total) and ``freed``.
Per tag: ``"allocated_bytes.tag:<tag>.<metric>"`` (also ``requested_bytes``,
``allocation``). Event counters: ``num_alloc_retries``, ``num_ooms``,
``num_device_alloc``, ``num_device_free``, ``num_cross_stream_waits``,
``quarantined_bytes``, ``quarantined_blocks``.

Rules: numbers are exact for a program that allocates from one thread at a
time; with concurrent threads a peak may include a block whose free was
reported just after another thread's allocation.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

from ..memory import DeviceMemoryResource, PoolResource, get_current_resource
from ..runtime import Device, device_count
from ..units import format_bytes
from . import _hook
from ._resources import ACTIVE, INACTIVE, SMALL_MAX, SMALL_SEGMENT, Roles, is_small, layout, roles

__all__ = ["memory_stats", "memory_summary", "reset_peak_stats", "enable_stats", "disable_stats",
           "stats_enabled", "MemoryStats", "STATS", "POOLS", "format_bytes"]

STATS = ("allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes", "segment",
         "reserved_bytes")
POOLS = ("all", "small_pool", "large_pool")
SPLIT_STATS = ("inactive_split", "inactive_split_bytes")
TAG_STATS = ("allocated_bytes", "requested_bytes", "allocation")
_N = len(STATS) * 3
_ALLOC, _ABYTES, _REQ, _ACTIVE, _ACTBYTES, _SEG, _RES = (i * 3 for i in range(len(STATS)))
_SUBSCRIBER = "stats"


# -- census: the allocator now ---------------------------------------------------------
class _Census:
    """Current values of one allocator, from a walk of its memory."""

    __slots__ = ("cur", "split", "tags")

    def __init__(self) -> None:
        self.cur = [0] * _N
        self.split = [0] * 6                   # inactive_split, inactive_split_bytes per pool class
        self.tags: dict[str, list[int]] = {}   # tag -> [bytes, requested, count]


def _census(allocator: DeviceMemoryResource) -> _Census:
    c = _Census()
    cur = c.cur
    pooled = isinstance(allocator, PoolResource)
    for seg in layout(allocator):
        k = 1 if seg.small else 2
        free = sum(p.size for p in seg.pieces if p.state == INACTIVE)
        for base, n in ((_SEG, 1), (_RES, seg.size)):
            cur[base] += n
            cur[base + k] += n
        for p in seg.pieces:
            if p.state == INACTIVE:
                if free != seg.size:  # a free piece of a partly used segment: not releasable
                    for i, n in ((0, 1), (3, p.size)):
                        c.split[i] += n
                        c.split[i + k] += n
                continue
            kk = k if pooled else (1 if is_small(p.block, p.size) else 2)
            adds = [(_ACTIVE, 1), (_ACTBYTES, p.size)]
            if p.state == ACTIVE:
                adds += [(_ALLOC, 1), (_ABYTES, p.size), (_REQ, p.requested)]
                t = c.tags.setdefault(p.block.tag if p.block is not None else "untagged", [0, 0, 0])
                t[0] += p.size
                t[1] += p.requested
                t[2] += 1
            for base, n in adds:
                cur[base] += n
                cur[base + kk] += n
    return c


# -- the collector: peaks and totals ----------------------------------------------------------
# Event codes in the queue: block events carry (code, size, requested, class, tag).
_A, _FR, _FC, _SA, _SF, _OOM = range(6)
_CODES = {"alloc": _A, "free_requested": _FR, "free_completed": _FC, "segment_alloc": _SA, "segment_free": _SF,
          "oom": _OOM}
# Counters an event moves (each in "all" and in its class) and whether it adds.
# A pool's frees complete as they are made, so its active counters are its
# allocated ones (kept once); a resource without a pool holds each block as a segment.
_MOVES: dict[bool, dict[int, tuple[tuple[int, ...], int]]] = {
    True: {_A: ((_ALLOC, _ABYTES, _REQ), 1), _FR: ((_ALLOC, _ABYTES, _REQ), -1),
           _SA: ((_SEG, _RES), 1), _SF: ((_SEG, _RES), -1)},
    False: {_A: ((_ALLOC, _ABYTES, _REQ, _ACTIVE, _ACTBYTES, _SEG, _RES), 1), _FR: ((_ALLOC, _ABYTES, _REQ), -1),
            _FC: ((_ACTIVE, _ACTBYTES, _SEG, _RES), -1)},
}
_COUNTS = frozenset({_ALLOC, _ACTIVE, _SEG})   # these move by 1; the others by bytes


class _Tally:
    """Counters of one allocator since the collector met it, and the events not yet counted."""

    __slots__ = ("ref", "pooled", "ignore", "cur", "peak", "tot", "base", "tags", "ooms", "pending")

    def __init__(self, res: DeviceMemoryResource, census: _Census | None) -> None:
        self.ref = weakref.ref(res)
        self.pooled = isinstance(res, PoolResource)
        self.ignore = census is None
        self.cur = np.array(census.cur if census else [0] * _N, np.int64)
        self.peak = self.cur.copy()
        self.tot = np.zeros(_N, np.int64)
        self.base = self.cur.copy()
        # tag -> rows current, peak, total, freed of columns bytes, requested, count
        self.tags: dict[str, np.ndarray] = {}
        for tag, now in (census.tags.items() if census else ()):
            self.tags[tag] = np.array([now, now, [0, 0, 0], [0, 0, 0]], np.int64)
        self.ooms = 0
        # The hot path only queues events (one append); they are counted, in order and
        # vectorized, when statistics are read or when the queue grows long.
        self.pending: deque[tuple] = deque()


_tallies: dict[int, _Tally] = {}
_lock = threading.Lock()
_enabled = False
_BACKLOG = 1 << 15   # events queued before they are counted on the spot


def _deltas(events: list[tuple], pooled: bool) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Per event, the change of every counter (events x counters) and whether it
    adds; and for the block events: their tags and (bytes, requested, count) changes."""
    codes, sizes, reqs, ks, tags = zip(*events)
    code = np.array(codes, np.int64)
    size = np.array(sizes, np.int64)
    req = np.array(reqs, np.int64)
    k = np.array(ks, np.int64)
    d = np.zeros((len(events), _N), np.int64)
    for c, (bases, sign) in _MOVES[pooled].items():
        rows = np.flatnonzero(code == c)
        if not rows.size:
            continue
        for b in bases:
            v = sign * (1 if b in _COUNTS else (req[rows] if b == _REQ else size[rows]))
            d[rows, b] = v
            d[rows, b + k[rows]] = v
    rows = np.flatnonzero(code <= _FR)
    sign = np.where(code[rows] == _A, 1, -1)
    tdelta = np.stack([sign * size[rows], sign * req[rows], sign], axis=1)
    return d, (code == _A) | (code == _SA), [tags[i] for i in rows], tdelta


def _drain(t: _Tally) -> None:
    """Count the queued events of ``t``, in order (exact peaks)."""
    with _lock:
        pending = t.pending
        events = [pending.popleft() for _ in range(len(pending))]
        ooms = sum(1 for e in events if e[0] == _OOM)
        if ooms:
            t.ooms += ooms
            events = [e for e in events if e[0] != _OOM]
        if not events:
            return
        d, up, tags, td = _deltas(events, t.pooled)
        run = np.cumsum(d, axis=0)
        np.maximum(t.peak, t.cur + run.max(axis=0), out=t.peak)
        t.tot += d[up].sum(axis=0)   # an event only adds, or only takes away
        t.cur += run[-1]
        if not tags:
            return
        # Per tag: running sums within each tag's events, in order (a stable sort keeps it).
        ids: dict[str, int] = {}
        tid = np.array([ids.setdefault(tag, len(ids)) for tag in tags], np.int64)
        order = np.argsort(tid, kind="stable")
        tid, td = tid[order], td[order]
        starts = np.flatnonzero(np.r_[True, tid[1:] != tid[:-1]])
        ends = np.r_[starts[1:], len(tid)] - 1
        run = np.cumsum(td, axis=0)
        before = np.where((starts > 0)[:, None], run[np.maximum(starts - 1, 0)], 0)
        high = np.maximum.reduceat(run, starts, axis=0) - before   # the highest running sum of each tag
        total = run[ends] - before
        added = np.add.reduceat(np.where(td > 0, td, 0), starts, axis=0)
        for g, tag in enumerate(ids):
            s = t.tags.get(tag)
            if s is None:
                s = t.tags[tag] = np.zeros((4, 3), np.int64)
            np.maximum(s[1], s[0] + high[g], out=s[1])
            s[0] += total[g]
            s[2] += added[g]
            s[3] += added[g] - total[g]


def _small(res: Any, block: Any, size: int) -> bool:
    """The size class a pool filed ``block`` in (by its segment), else by size."""
    if isinstance(res, PoolResource):
        try:
            return res.small_block(block)
        except ValueError:  # not one of the pool's blocks (a segment event's): by size
            pass
    return size <= SMALL_MAX


def _event(action: str, size: int, block: Any, res: Any = None) -> tuple:
    """An event in its queued form."""
    code = _CODES[action]
    if code <= _FC:
        small = _small(res, block, size)
        return code, size, block.requested, 1 if small else 2, block.tag
    return code, size, 0, 1 if size == SMALL_SEGMENT else 2, None


def _is_allocator(res: Any) -> bool:
    """Only pools and bottom resources are counted (a guard's blocks are its pool's)."""
    return isinstance(res, PoolResource) or getattr(res, "upstream", None) is None


def _seed(res: DeviceMemoryResource, event: tuple | None = None) -> _Tally:
    """Meet ``res``: a tally seeded from its census. ``event`` (queued form) is
    the event being reported, which the census already counts: it is taken out
    of the seed again, so that it is counted (in totals too) as an event."""
    t = _Tally(res, _census(res) if _is_allocator(res) else None)
    with _lock:
        old = _tallies.get(id(res))
        if old is not None and old.ref() is res:
            return old
        if event is not None and not t.ignore and event[0] in _MOVES[t.pooled]:
            d, _, tags, td = _deltas([event], t.pooled)
            t.cur -= d[0]
            if tags:
                s = t.tags.setdefault(tags[0], np.zeros((4, 3), np.int64))
                s[0] -= td[0]
                s[1] = s[0]
            t.peak[:] = t.cur
            t.base[:] = t.cur
        _tallies[id(res)] = t
    weakref.finalize(res, _tallies.pop, id(res), None)
    return t


def _on_event(action: str, res: Any, ptr: int, size: int, stream: Any, block: Any) -> None:
    try:
        t = _tallies.get(id(res))
        if t is None or t.ref() is not res:
            if action[0] == "s" or action == "oom":
                return  # reported under the pool's lock: meet it at its next allocation or free instead
            t = _seed(res, _event(action, size, block, res))
            if t.ignore:
                return
        elif t.ignore:
            return
        pending = t.pending
        if block is not None and action[0] != "s":  # an allocation or a free: inlined _event()
            if t.pooled:
                if action == "free_completed":
                    return  # a pool's frees complete as they are made
                small = _small(res, block, size)
            else:
                small = size <= SMALL_MAX
            pending.append((_CODES[action], size, block.requested, 1 if small else 2, block.tag))
        else:
            pending.append(_event(action, size, block, res))
        if len(pending) > _BACKLOG:
            _drain(t)
    except Exception as e:  # never let statistics break an allocation that happened
        _hook.failed(_SUBSCRIBER, e)


def enable_stats() -> None:
    """Start collecting peaks and running totals (``memory_stats`` gains the
    ``peak`` / ``allocated`` / ``freed`` metrics). Costs one call per allocation
    event until ``disable_stats()``. Idempotent."""
    global _enabled
    for ordinal in range(device_count()):
        try:
            mr = get_current_resource(ordinal)
        except Exception:
            continue
        _tally_of(roles(mr).allocator)
    _enabled = True
    _hook.subscribe(_SUBSCRIBER, _on_event)


def disable_stats() -> None:
    """Stop collecting and forget the peaks and totals. Idempotent."""
    global _enabled
    _enabled = False
    _hook.unsubscribe(_SUBSCRIBER)
    with _lock:
        _tallies.clear()


def stats_enabled() -> bool:
    """True while memory statistics are collected (``enable_stats()`` was called and
    ``disable_stats()`` not since)."""
    return _enabled


def _tally_of(allocator: DeviceMemoryResource) -> _Tally:
    t = _tallies.get(id(allocator))
    if t is None or t.ref() is not allocator:
        t = _seed(allocator)
    return t


# -- public queries -----------------------------------------------------------------------------
def _resolve(device: "Device | int | None", resource: DeviceMemoryResource | None) -> Roles:
    if resource is not None:
        if not isinstance(resource, DeviceMemoryResource):
            raise TypeError(f"resource must be a DeviceMemoryResource, got {type(resource).__name__}")
        return roles(resource)
    return roles(get_current_resource(device))


class MemoryStats(dict):
    """``memory_stats``'s answer: a plain ``dict`` of ints, except that asking for a peak or
    a running total (``"....peak"``, ``.allocated``, ``.freed``) while statistics are off
    raises a ``KeyError`` that says how to turn them on, rather than a bare one."""

    def __missing__(self, key: Any) -> int:
        if isinstance(key, str):
            stat, _, metric = key.rpartition(".")
            if metric in ("peak", "allocated", "freed") and f"{stat}.current" in self:
                raise KeyError(f"{key!r}: peaks and running totals are counted only while statistics are on: "
                               "call ig.telemetry.enable_stats() (or set IGNIS_MEMORY_STATS=1) before the work "
                               f"to measure; the current value is {stat + '.current'!r}")
        raise KeyError(key)


def memory_stats(device: "Device | int | None" = None, *, resource: DeviceMemoryResource | None = None
                 ) -> MemoryStats:
    """Statistics of the memory of ``device``'s current resource (or of ``resource``),
    as a flat dict (keys in the module docstring, PyTorch's layout). Current values
    are always there; ``peak``, ``allocated`` and ``freed`` only while
    ``enable_stats()`` is on (asked for while it is off, a ``KeyError`` says so)."""
    ro = _resolve(device, resource)
    c = _census(ro.allocator)
    t = _tally_of(ro.allocator) if _enabled else None
    if t is not None:
        _drain(t)
    out = MemoryStats()
    with _lock:
        for si, stat in enumerate(STATS):
            for k, pool in enumerate(POOLS):
                i = si * 3 + k
                cur = c.cur[i]
                out[f"{stat}.{pool}.current"] = cur
                if t is not None:
                    j = i - (_ACTIVE - _ALLOC) if t.pooled and stat in ("active", "active_bytes") else i
                    out[f"{stat}.{pool}.peak"] = max(int(t.peak[j]), cur)
                    out[f"{stat}.{pool}.allocated"] = int(t.tot[j])
                    out[f"{stat}.{pool}.freed"] = int(t.base[j] + t.tot[j] - t.cur[j])
        for si, stat in enumerate(SPLIT_STATS):
            for k, pool in enumerate(POOLS):
                out[f"{stat}.{pool}.current"] = c.split[si * 3 + k]
        tags = set(c.tags) | (set(t.tags) if t is not None else set())
        for tag in sorted(tags):
            now = c.tags.get(tag, [0, 0, 0])
            for j, stat in enumerate(TAG_STATS):
                out[f"{stat}.tag:{tag}.current"] = now[j]
                if t is not None:
                    s = t.tags.get(tag)
                    if s is None:
                        s = np.zeros((4, 3), np.int64)
                    out[f"{stat}.tag:{tag}.peak"] = max(int(s[1, j]), now[j])
                    out[f"{stat}.tag:{tag}.allocated"] = int(s[2, j])
                    out[f"{stat}.tag:{tag}.freed"] = int(s[3, j])
        pool = ro.pool
        out["num_alloc_retries"] = pool.num_alloc_retries if pool is not None else 0
        out["num_ooms"] = pool.num_ooms if pool is not None else (t.ooms if t is not None else 0)
        if pool is not None:
            out["num_device_alloc"] = pool.num_segment_allocs
            out["num_device_free"] = pool.num_segment_frees
        elif t is not None:
            out["num_device_alloc"] = int(t.tot[_SEG])
            out["num_device_free"] = int(t.base[_SEG] + t.tot[_SEG] - t.cur[_SEG])
    out["num_cross_stream_waits"] = sum(getattr(r, "cross_stream_waits", 0) for r in ro.chain)
    out["quarantined_bytes"] = ro.guard.quarantined_bytes if ro.guard is not None else 0
    out["quarantined_blocks"] = ro.guard.quarantined_count if ro.guard is not None else 0
    return out


def reset_peak_stats(device: "Device | int | None" = None, *, resource: DeviceMemoryResource | None = None
                     ) -> None:
    """Make every peak equal the current value (for ``device``'s allocator, or
    ``resource``'s); a no-op while statistics are not collected."""
    if not _enabled:
        return
    t = _tally_of(_resolve(device, resource).allocator)
    _drain(t)
    with _lock:
        t.peak[:] = t.cur
        for s in t.tags.values():
            s[1] = s[0]


def memory_summary(device: "Device | int | None" = None, *, resource: DeviceMemoryResource | None = None,
                   max_tags: int = 8, abbreviated: bool = False) -> str:
    """A readable table of ``memory_stats`` (the ``max_tags`` largest tags by current bytes).

    Args:
        device: the device whose current resource to describe (an ``ig.Device`` or
            ordinal); None for the current device.
        resource: a resource to describe instead of the device's current one.
        max_tags: how many tags to list.
        abbreviated: only the totals (no large / small pool rows, as PyTorch's
            ``abbreviated``), and none of the rows that are zero throughout.

    Raises:
        TypeError: ``resource`` is not a DeviceMemoryResource.
    """
    ro = _resolve(device, resource)
    s = memory_stats(resource=ro.chain[0])
    dev = ro.top.device
    full = _enabled
    w = 77

    def rule(ch: str = "-") -> str:
        return "|" + ch * (w - 2) + "|"

    def row(text: str) -> str:
        return f"| {text:<{w - 4}} |"

    def cells(label: str, key: str, as_bytes: bool) -> str:
        fmt = format_bytes if as_bytes else (lambda v: "-" if v is None else str(v))
        vals = [s.get(f"{key}.{m}") for m in ("current", "peak", "allocated", "freed")]
        return "| " + f"{label:<25}" + "".join(f"| {fmt(v):>10} " for v in vals) + "|"

    lines = [rule("="), row(f"Ignis memory summary, device {dev.ordinal} ({dev.backend.name} backend)".center(w - 4)),
             rule(), row(f"resource: {ro.describe()}"),
             row("statistics: " + ("collecting peaks and totals" if full else
                                   "current values only; ig.telemetry.enable_stats() adds peaks")),
             rule(), "| " + f"{'Metric':<25}" + "".join(f"| {h:>10} " for h in ("Cur Usage", "Peak Usage", "Tot Alloc",
                                                                            "Tot Freed")) + "|", rule()]
    for label, stat, as_bytes in (("Allocated memory", "allocated_bytes", True),
                                  ("Active memory", "active_bytes", True),
                                  ("Requested memory", "requested_bytes", True),
                                  ("Reserved memory", "reserved_bytes", True),
                                  ("Non-releasable memory", "inactive_split_bytes", True),
                                  ("Allocations", "allocation", False),
                                  ("Active allocs", "active", False),
                                  ("Segments (reserved)", "segment", False),
                                  ("Non-releasable allocs", "inactive_split", False)):
        if abbreviated:
            if any(s.get(f"{stat}.all.{m}") for m in ("current", "peak", "allocated", "freed")):
                lines.append(cells(label, f"{stat}.all", as_bytes))
            continue
        lines.append(cells(label, f"{stat}.all", as_bytes))
        for pool, name in (("large_pool", "from large pool"), ("small_pool", "from small pool")):
            lines.append(cells(f"      {name}", f"{stat}.{pool}", as_bytes))
        lines.append(rule())
    if abbreviated:
        lines.append(rule())
    tags = sorted({k.split(".tag:", 1)[1].rsplit(".", 1)[0] for k in s if ".tag:" in k},
                  key=lambda tg: -s[f"allocated_bytes.tag:{tg}.current"])
    if tags:
        lines.append(row("Allocated memory by tag"))
        for tg in tags[:max_tags]:
            label = tg if len(tg) <= 23 else tg[:20] + "..."
            lines.append(cells(f"  {label}", f"allocated_bytes.tag:{tg}", True))
        if len(tags) > max_tags:
            rest = sum(s[f"allocated_bytes.tag:{tg}.current"] for tg in tags[max_tags:])
            lines.append(row(f"  ... {len(tags) - max_tags} more tag(s), {format_bytes(rest)} now"))
        lines.append(rule())
    lines.append(row(f"Allocation retries: {s['num_alloc_retries']}   OOMs: {s['num_ooms']}   "
                     f"Cross-stream waits: {s['num_cross_stream_waits']}"))
    lines.append(row(f"Quarantined: {format_bytes(s['quarantined_bytes'])} in {s['quarantined_blocks']} block(s)   "
                     f"Device allocs/frees: {s.get('num_device_alloc', '-')}/{s.get('num_device_free', '-')}"))
    lines.append(rule("="))
    return "\n".join(lines)


if os.environ.get("IGNIS_MEMORY_STATS", "").strip() not in ("", "0"):
    enable_stats()
