"""Memory history and snapshots in the layout PyTorch's memory viewer loads.

Design:
- ``record_memory_history(True)`` subscribes a recorder to the allocation-event
  hook. Each event becomes one tuple in a ring (``max_entries`` long; the
  oldest entries fall off), with the Python frames that led to it, captured as
  (code, line) pairs and turned into ``{filename, line, name}`` dicts only when
  a snapshot is made. Frames inside Ignis itself are skipped. While nothing
  records, the hot path pays nothing (see ``_hook``).
- Events come from every resource of a stack: a guard and its pool both
  report the same allocation. ``snapshot()`` keeps, per resource stack, the
  top's allocations and frees, the pool's segment events, and, where there is
  no pool, the bottom resource's blocks as segments (each allocation is its
  own ``cudaMalloc`` there). Blocks a pool takes from below are recognised at
  record time by their tag and not stored (the pool reports them as segments).
- The state part (``segments``) comes from ``_resources.layout``: each
  segment's blocks tile it in address order (the viewer computes addresses by
  adding sizes), a guard's block sits inside its pool block after the guard
  bytes (shown as an inactive piece), and freed blocks still waiting (a
  stream-ordered free, a guard's quarantine) are ``active_pending_free``.

The dict (``pickle``d by ``dump_snapshot``) is what ``torch.cuda.memory._snapshot()``
returns: ``segments`` (device, address, total_size, stream, segment_type,
segment_pool_id, allocated_size, active_size, requested_size, frames, blocks:
address, size, requested_size, state, frames) and ``device_traces`` (a list per
device of entries: action, addr, size, stream, time_us, frames; ``device_free``
for ``oom``), plus Ignis's own keys (``tag``, ``generation``, and ``ignis``),
which the viewer ignores. Drag the file onto https://pytorch.org/memory_viz.

Rules: a stack whose device context was rebuilt is left out (its memory is
gone, and the viewer would meet blocks with no segment). Snapshots read
resource state under each resource's lock, one resource at a time.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any

from ..memory import DeviceMemoryResource, get_current_resource
from ..runtime import Device, device_count
from . import _hook
from ._resources import ACTIVE, INACTIVE, PENDING, Roles, layout, live_context, roles, user_blocks

__all__ = ["record_memory_history", "is_recording", "snapshot", "dump_snapshot", "load_snapshot",
           "DEFAULT_MAX_ENTRIES", "SEGMENT_TAG"]

DEFAULT_MAX_ENTRIES = 100_000
VIEWER_PICKLE_PROTOCOL = 4   # the viewer's own unpickler reads protocols 2 to 4 only
DEFAULT_STACK_DEPTH = 8
SEGMENT_TAG = "ignis.pool.segment"     # the tag a pool gives the blocks it takes from its upstream
_SUBSCRIBER = "history"

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Ignis modules whose frames are the program's own story: the demo and its tour (``ignis demo``)
# are programs. File names only: nothing here imports the command line.
_SHOWN = frozenset({os.path.join(_PKG, "cli", "demo.py"), os.path.join(_PKG, "cli", "tour.py")})


class _History:
    """The recorder's state: the ring, frames of live blocks and segments, and the resources seen."""

    def __init__(self) -> None:
        self.ring: deque[tuple] = deque(maxlen=DEFAULT_MAX_ENTRIES)
        self.trace = True
        self.depth = DEFAULT_STACK_DEPTH
        self.recorded = 0
        self.live_frames: dict[tuple[int, int], tuple[int, tuple]] = {}   # (resource, ptr) -> (generation, frames)
        self.seg_frames: dict[tuple[int, int], tuple] = {}
        self.resources: dict[int, weakref.ref] = {}
        self.active = False
        self.lock = threading.Lock()

    def capture(self) -> tuple:
        f: Any = sys._getframe(3)
        out = []
        depth = self.depth
        while f is not None and len(out) < depth:
            co = f.f_code
            fn = co.co_filename
            if not fn.startswith(_PKG) or fn in _SHOWN:
                out.append((co, f.f_lineno))
            f = f.f_back
        return tuple(out)

    def forget(self, rid: int) -> None:
        """Drop what is kept for the resource whose ``id`` was ``rid``."""
        self.resources.pop(rid, None)
        for frames in (self.live_frames, self.seg_frames):
            for key in [k for k in list(frames) if k[0] == rid]:
                frames.pop(key, None)

    def on_event(self, action: str, res: Any, ptr: int, size: int, stream: Any, block: Any) -> None:
        try:
            self._record(action, res, ptr, size, stream, block)
        except Exception as e:  # never let history break an allocation that happened
            _hook.failed(_SUBSCRIBER, e)

    def _record(self, action: str, res: Any, ptr: int, size: int, stream: Any, block: Any) -> None:
        tag = block.tag if block is not None else ""
        if tag == SEGMENT_TAG and action[0] != "s":
            return  # a pool's upstream block: the pool reports it as a segment
        rid = id(res)
        ref = self.resources.get(rid)
        if ref is None or ref() is not res:
            if ref is not None:  # a dead resource's id, now another's: its frames went with it
                self.forget(rid)
            self.resources[rid] = weakref.ref(res)
        frames = self.capture()
        if action == "alloc":
            self.live_frames[(rid, ptr)] = (block.generation if block is not None else 0, frames)
        elif action == "free_completed":
            # A free completes in stream order, possibly after the address was handed out
            # again: only the generation that was freed loses its frames.
            cur = self.live_frames.get((rid, ptr))
            if cur is not None and (block is None or cur[0] == block.generation):
                self.live_frames.pop((rid, ptr), None)
        elif action == "segment_alloc":
            self.seg_frames[(rid, ptr)] = frames
        elif action == "segment_free":
            self.seg_frames.pop((rid, ptr), None)
        if not self.trace:
            return
        extra = None
        if action == "oom":
            try:
                extra = res.device.backend.mem_get_info(res.device.ordinal)[0]
            except Exception:
                extra = 0
        self.ring.append((action, rid, ptr, size, getattr(stream, "handle", 0) or 0, time.time_ns() // 1000,
                          frames, tag, block.requested if block is not None else size,
                          block.generation if block is not None else 0, res.device.ordinal, extra))
        self.recorded += 1


_h = _History()


def record_memory_history(enabled: "bool | str | None" = True, max_entries: int = DEFAULT_MAX_ENTRIES, *,
                          stacks: int = DEFAULT_STACK_DEPTH, clear_history: bool = False) -> None:
    """Start (or with ``enabled=False`` / ``None`` stop) recording allocation history.

    ``enabled``: ``True`` or ``"all"`` records every allocation event with its
    Python frames; ``"state"`` only keeps the frames of live blocks (snapshots
    show where each was allocated, with no trace). ``max_entries``: the trace
    keeps the newest this many events. ``stacks``: frames kept per event.
    Stopping keeps what was recorded for later snapshots; ``clear_history``
    forgets it (it is also forgotten when recording starts with a different
    ``max_entries``)."""
    if enabled not in (True, False, None, "all", "state"):
        raise ValueError(f"enabled must be True, False, None, 'all' or 'state', got {enabled!r}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be a non-negative int, got {max_entries!r}")
    if isinstance(stacks, bool) or not isinstance(stacks, int) or stacks < 0:
        raise ValueError(f"stacks must be a non-negative int, got {stacks!r}")
    with _h.lock:
        if clear_history or (enabled and _h.ring.maxlen != max_entries):
            _h.ring = deque(maxlen=max_entries)
            _h.recorded = 0
            if clear_history:
                _h.live_frames.clear()
                _h.seg_frames.clear()
        if not enabled:
            _h.active = False
            _hook.unsubscribe(_SUBSCRIBER)
            return
        _h.trace = enabled != "state"
        _h.depth = stacks
        _h.active = True
        _hook.subscribe(_SUBSCRIBER, _h.on_event)


def is_recording() -> bool:
    """Whether allocation history is being recorded now."""
    return _h.active


# -- snapshots ---------------------------------------------------------------------------------
def _frames(frames: tuple) -> list[dict[str, Any]]:
    return [{"filename": co.co_filename, "line": line, "name": co.co_name} for co, line in frames]


def _stacks(resource: DeviceMemoryResource | None) -> list[Roles]:
    """The resource stacks a snapshot covers: ``resource``'s, or every device's
    current one and every other stack the history saw, outermost resources only."""
    if resource is not None:
        cands = [resource]
    else:
        cands = []
        for ordinal in range(device_count()):
            try:
                cands.append(get_current_resource(ordinal))
            except Exception:
                continue
        for rid, ref in list(_h.resources.items()):
            r = ref()
            if r is not None:
                cands.append(r)
            elif _h.resources.get(rid) is ref:  # gone (and its id not taken since): forget its frames
                _h.forget(rid)
    all_roles = {id(r): roles(r) for r in cands}
    inner = {id(x) for ro in all_roles.values() for x in ro.chain[1:]}
    out = [ro for rid, ro in all_roles.items() if rid not in inner and live_context(ro.allocator)]
    return out


def snapshot(device: "Device | int | None" = None, *, resource: DeviceMemoryResource | None = None
             ) -> dict[str, Any]:
    """The memory state now, with the recorded history, as PyTorch's ``_snapshot()``
    dict (see the module docstring). ``device``: only that device's segments;
    ``resource``: only that resource stack (default: every device's current
    resource and every stack the history saw)."""
    only = None if device is None else Device(device).ordinal
    stacks = _stacks(resource)
    by_alloc: dict[int, tuple[Any, list[Roles]]] = {}
    for ro in stacks:
        by_alloc.setdefault(id(ro.allocator), (ro.allocator, []))[1].append(ro)
    ndev = max([device_count(), 1] + [ro.top.device.ordinal + 1 for ro in stacks])
    segments = []
    for allocator, ros in by_alloc.values():
        if only is not None and allocator.device.ordinal != only:
            continue
        segments += _segments(allocator, ros)
    segments.sort(key=lambda s: (s["device"], s["address"]))
    traces = _traces(stacks, ndev, only)
    from .._version import __version__
    return {"segments": segments, "device_traces": traces,
            "ignis": {"version": __version__, "backend": Device(0).backend.name if device_count() else None,
                      "recording": _h.active, "max_entries": _h.ring.maxlen,
                      "recorded_events": _h.recorded, "kept_events": len(_h.ring),
                      "resources": [ro.describe() for ro in stacks]}}


def _block_frames(rid: int, ptr: int, generation: int) -> list[dict[str, Any]]:
    got = _h.live_frames.get((rid, ptr))
    return _frames(got[1]) if got is not None and got[0] == generation else []


def _segments(allocator: Any, ros: list[Roles]) -> list[dict[str, Any]]:
    users: dict[int, tuple[Any, str, int]] = {}
    for ro in ros:
        if ro.top is not allocator:
            users.update({up: (blk, state, id(ro.top)) for up, (blk, state) in user_blocks(ro.top).items()})
    ordinal = allocator.device.ordinal
    aid = id(allocator)
    pooled = ros[0].pool is not None
    out = []
    for seg in layout(allocator):
        blocks: list[dict[str, Any]] = []
        for p in seg.pieces:
            if p.state == INACTIVE:
                blocks.append({"address": p.ptr, "size": p.size, "requested_size": 0, "state": INACTIVE,
                               "frames": []})
                continue
            user = users.get(p.ptr)
            if user is not None:
                blk, state, rid = user
                if blk is None:  # kept by the guard's ready cache: memory it holds for reuse
                    blocks.append({"address": p.ptr, "size": p.size, "requested_size": 0, "state": state,
                                   "frames": [], "tag": "ignis.guard"})
                    continue
                if blk.ptr > p.ptr:  # the guard bytes before the user's block
                    blocks.append({"address": p.ptr, "size": blk.ptr - p.ptr, "requested_size": 0,
                                   "state": INACTIVE, "frames": [], "tag": "ignis.guard"})
                blocks.append({"address": blk.ptr, "size": p.ptr + p.size - blk.ptr, "requested_size": blk.requested,
                               "state": state, "frames": _block_frames(rid, blk.ptr, blk.generation),
                               "tag": blk.tag, "generation": blk.generation})
                continue
            b = p.block
            blocks.append({"address": p.ptr, "size": p.size, "requested_size": p.requested, "state": p.state,
                           "frames": _block_frames(aid, p.ptr, b.generation) if b is not None else [],
                           "tag": b.tag if b is not None else "", "generation": b.generation if b is not None else 0})
        allocated = sum(b["size"] for b in blocks if b["state"] == ACTIVE)
        active = allocated + sum(b["size"] for b in blocks if b["state"] == PENDING)
        seg_frames = _frames(_h.seg_frames.get((aid, seg.ptr), ())) if pooled else \
            (blocks[0]["frames"] if blocks else [])
        out.append({"device": ordinal, "address": seg.ptr, "total_size": seg.size, "stream": seg.stream,
                    "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
                    "allocated_size": allocated, "active_size": active,
                    "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == ACTIVE),
                    "is_expandable": False, "frames": seg_frames, "blocks": blocks})
    return out


def _traces(stacks: list[Roles], ndev: int, only: int | None) -> list[list[dict[str, Any]]]:
    tops: set[int] = set()
    pools: set[int] = set()
    bases: set[int] = set()
    members: set[int] = set()
    for ro in stacks:
        tops.add(id(ro.top))
        members.update(id(r) for r in ro.chain)
        if ro.pool is not None:
            pools.add(id(ro.pool))
        else:
            bases.add(id(ro.base))
    wrapped = {id(ro.base) for ro in stacks if ro.pool is None and ro.top is not ro.base}
    traces: list[list[dict[str, Any]]] = [[] for _ in range(ndev)]
    # A guard over a pool-less resource frees its upstream block before it reports
    # its own free_completed: hold that segment_free back until then, so that no
    # block is ever outside a segment.
    held: dict[int, dict[str, Any]] = {}
    for (action, rid, ptr, size, stream, t_us, frames, tag, requested, gen, ordinal, extra) in list(_h.ring):
        if (only is not None and ordinal != only) or ordinal >= ndev or rid not in members:
            continue
        out = traces[ordinal]

        def entry(act: str) -> dict[str, Any]:
            return {"action": act, "addr": ptr, "size": size, "stream": stream, "time_us": t_us,
                    "frames": _frames(frames), "tag": tag, "requested_size": requested, "generation": gen,
                    "_dev": ordinal}

        if action == "oom":
            out.append({"action": "oom", "size": size, "stream": stream, "time_us": t_us, "frames": _frames(frames),
                        "device_free": extra or 0})
        elif action.startswith("segment"):
            if rid in pools:
                out.append(entry(action))
        else:
            as_base = rid in bases
            as_top = rid in tops
            if as_base and action == "alloc":
                out.append(entry("segment_alloc"))
            if as_top:
                out.append(entry(action))
                if action == "free_completed" and held:
                    seg = next((a for a, e in held.items() if a <= ptr < a + e["size"]), None)
                    if seg is not None:
                        out.append(held.pop(seg))
            if as_base and action == "free_completed":
                if rid in wrapped:
                    held[ptr] = entry("segment_free")
                else:
                    out.append(entry("segment_free"))
    for e in held.values():
        traces[e["_dev"]].append(e)
    for trace in traces:
        for e in trace:
            e.pop("_dev", None)
    return traces


def dump_snapshot(path: "str | os.PathLike[str]" = "ignis_snapshot.pickle", device: "Device | int | None" = None,
                  *, resource: DeviceMemoryResource | None = None) -> str:
    """Write ``snapshot()`` as a pickle that https://pytorch.org/memory_viz opens
    (and ``torch.cuda._memory_viz`` reads). Returns the path.

    Args:
        path: the file to write (replaced if it exists).
        device: only that device's segments (an ``ig.Device`` or ordinal); None for all.
        resource: only that resource stack; None for every device's current resource and
            every stack the history saw (as ``snapshot``).

    Raises:
        OSError: the file cannot be written.
    """
    snap = snapshot(device, resource=resource)
    path = os.fspath(path)
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=VIEWER_PICKLE_PROTOCOL)
    return path


def _latin1_bytes(text: Any, encoding: Any) -> bytes:
    """What protocol 2's ``_codecs.encode(text, "latin1")`` makes of bytes, and nothing else."""
    if type(text) is not str or encoding != "latin1":
        raise pickle.UnpicklingError("it calls _codecs.encode other than to rebuild bytes")
    return text.encode("latin1")


class _SnapshotUnpickler(pickle.Unpickler):
    """Reads only what a snapshot holds: dicts, lists, tuples, sets, strings, bytes, numbers,
    booleans and None. A pickle that names any class or function (the way a crafted pickle
    runs code) is refused before that name is looked up, so nothing in the file runs."""

    # The names pickle protocols 2 and 3 use to rebuild a set, and protocol 2 bytes (protocol
    # 4 has opcodes for both); bytes through a function that only turns latin-1 text into bytes.
    _ALLOWED = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
                ("__builtin__", "set"): set, ("__builtin__", "frozenset"): frozenset,  # protocols 0 to 2
                ("_codecs", "encode"): lambda text, encoding="utf-8": _latin1_bytes(text, encoding)}

    def find_class(self, module: str, name: str) -> Any:
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, and a memory snapshot holds only plain containers and scalars "
                "(dicts, lists, tuples, strings, numbers); it was not read, since unpickling it could run code")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent reference, which a memory snapshot never does")


def load_snapshot(path: "str | os.PathLike[str]") -> dict[str, Any]:
    """Read a snapshot pickle (Ignis's or PyTorch's).

    Snapshot files are untrusted input: a pickle can name any function to call while it
    is read, so only the plain containers and scalars a snapshot is made of are admitted
    (``dict``, ``list``, ``tuple``, ``set``, ``str``, ``bytes``, numbers, ``bool``, ``None``);
    a file naming anything else is refused before it can run code.

    Args:
        path: the snapshot file.

    Raises:
        ValueError: the file is not a memory snapshot: not a pickle, a pickle that names a
            class or function, or no ``segments``.
        OSError: the file cannot be read.
    """
    p = os.fspath(path)
    with open(p, "rb") as f:
        try:
            data = _SnapshotUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise ValueError(f"{p} is not a memory snapshot: {e}") from None
        except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as e:
            raise ValueError(f"{p} is not a memory snapshot (not a readable pickle: {type(e).__name__}: "
                             f"{e})") from None
    if isinstance(data, list):  # an old PyTorch dump: segments only
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        raise ValueError(f"{p} is not a memory snapshot (no 'segments')")
    data.setdefault("device_traces", [])
    return data
