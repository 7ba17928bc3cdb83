"""``plot_timeline``: memory in use over time, stacked by tag or allocation site, peaks marked.

Design: the trace of a snapshot (Ignis's or PyTorch's) is replayed: a block
counts from its ``alloc`` to its ``free_completed``, reserved memory from
``segment_alloc`` to ``segment_free``. Blocks allocated before the trace
began are accounted for by anchoring each group's curve at its end value,
which the snapshot's segments give (the blocks still live). The ``top``
largest groups are drawn, the rest are summed into "other". The x axis is
seconds since the first event (event numbers when the trace has no times).

Rules: matplotlib is optional (``pip install 'ignis[plot]'``); without it
``plot_timeline`` raises ``ImportError`` saying so. The figure is drawn
through the Agg canvas, never pyplot, so the caller's matplotlib state is
left alone, and the PNG is exactly ``size`` pixels.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..units import format_bytes
from .snapshot import load_snapshot

__all__ = ["plot_timeline", "timeline"]

_IN_USE = ("active_allocated", "active_pending_free")


def _group_of(entry: dict[str, Any], by: str) -> str:
    if by == "tag":
        return entry.get("tag") or "untagged"
    frames = entry.get("frames") or []
    if not frames:
        return "<no frames>"
    f = frames[0]
    return f"{os.path.basename(str(f.get('filename', '?')))}:{f.get('line', '?')} ({f.get('name', '?')})"


def timeline(snap: dict[str, Any], *, by: str = "tag", device: int | None = None) -> dict[str, Any]:
    """The curves ``plot_timeline`` draws: ``x`` (seconds, or event numbers),
    ``groups`` {name: bytes after each event}, ``reserved`` and ``timed``."""
    if by not in ("tag", "site"):
        raise ValueError(f"by must be 'tag' or 'site', got {by!r}")
    traces = snap.get("device_traces") or []
    devices = range(len(traces)) if device is None else [device]
    events = [e for d in devices if d < len(traces) for e in traces[d]]
    timed = bool(events) and all("time_us" in e for e in events)
    if timed:
        events.sort(key=lambda e: e["time_us"])
    segs = [s for s in snap.get("segments", []) if device is None or s.get("device") == device]
    final: dict[str, int] = {}
    for s in segs:
        for b in s.get("blocks", []):
            if b.get("state") in _IN_USE:
                g = _group_of(b, by)
                final[g] = final.get(g, 0) + int(b["size"])
    reserved_final = sum(int(s.get("total_size", 0)) for s in segs)

    live: dict[int, tuple[str, int]] = {}   # addr -> (group, size) of blocks allocated in the trace
    deltas: list[tuple[str, int]] = []
    res_deltas: list[int] = []
    for e in events:
        act, size = e.get("action"), int(e.get("size", 0))
        d: tuple[str, int] = ("", 0)
        r = 0
        if act == "alloc":
            g = _group_of(e, by)
            live[e["addr"]] = (g, size)
            d = (g, size)
        elif act in ("free_completed", "free"):
            g, n = live.pop(e.get("addr"), (_group_of(e, by), size))  # a block from before the trace: still counted
            d = (g, -n)
        elif act == "segment_alloc":
            r = size
        elif act == "segment_free":
            r = -size
        deltas.append(d)
        res_deltas.append(r)
    groups = {g for g, _ in deltas if g} | set(final)
    total_delta: dict[str, int] = {}
    for g, n in deltas:
        if g:
            total_delta[g] = total_delta.get(g, 0) + n
    level = {g: max(0, final.get(g, 0) - total_delta.get(g, 0)) for g in groups}   # before the first event
    curves: dict[str, list[int]] = {g: [level[g]] for g in groups}
    res_level = max(0, reserved_final - sum(res_deltas))
    reserved = [res_level]
    for (g, n), r in zip(deltas, res_deltas):
        if g:
            level[g] += n
        for name in groups:
            curves[name].append(level[name])
        res_level += r
        reserved.append(res_level)
    if timed:
        t0 = events[0]["time_us"]
        x = [0.0] + [(e["time_us"] - t0) / 1e6 for e in events]
    else:
        x = [float(i) for i in range(len(events) + 1)]
    # One more step after the last event, so that the final state has a width.
    x.append(x[-1] + max((x[-1] - x[0]) * 0.03, 1e-6 if timed else 1.0))
    for name in groups:
        curves[name].append(curves[name][-1])
    reserved.append(reserved[-1])
    return {"x": x, "groups": curves, "reserved": reserved, "timed": timed, "events": len(events)}


def plot_timeline(snapshot_or_path: "dict[str, Any] | str | os.PathLike[str]", out_png: "str | os.PathLike[str]",
                  by: str = "tag", *, device: int | None = None, top: int = 10, size: tuple[int, int] = (1200, 600),
                  dpi: int = 100, title: str | None = None) -> dict[str, Any]:
    """Draw memory in use over time, stacked by ``by`` (``"tag"`` or ``"site"``:
    the innermost recorded frame), with reserved memory as a dashed line and both
    peaks marked; write it to ``out_png`` (``size`` pixels). ``snapshot_or_path``:
    a snapshot dict or a pickle written by ``dump_snapshot`` (or PyTorch).
    ``device``: one device's trace (default: all). Returns ``path``, ``peak_bytes``,
    ``peak_x``, ``reserved_peak_bytes``, ``groups`` (drawn, largest first), ``events``.
    Raises ``ImportError`` without matplotlib.

    Args:
        snapshot_or_path: a snapshot dict, or the path of a snapshot pickle.
        out_png: where to write the PNG.
        by: ``"tag"`` or ``"site"``: what the stacked areas group by.
        device: one device's trace; None for all.
        top: how many groups (the largest by peak) are drawn; the rest are summed as one
            "other" area.
        size: the image's ``(width, height)`` in pixels, each at least 100.
        dpi: the resolution (positive).
        title: the plot's title; None for one that says what is drawn.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: ``size`` below 100x100 pixels or a non-positive ``dpi``.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, MultipleLocator
    except ImportError as e:
        raise ImportError("plot_timeline needs matplotlib, which is not installed: "
                          "pip install 'ignis[plot]' (or pip install matplotlib)") from e
    snap = snapshot_or_path if isinstance(snapshot_or_path, dict) else load_snapshot(snapshot_or_path)
    w, h = size
    if w < 100 or h < 100 or dpi <= 0:
        raise ValueError(f"size must be at least 100x100 pixels and dpi positive, got {size} at {dpi} dpi")
    tl = timeline(snap, by=by, device=device)
    x, curves, reserved = tl["x"], tl["groups"], tl["reserved"]
    order = sorted(curves, key=lambda g: -max(curves[g]))
    drawn = order[:top]
    rest = order[top:]
    ys = [curves[g] for g in drawn]
    labels = list(drawn)
    if rest:
        ys.append([sum(curves[g][i] for g in rest) for i in range(len(x))])
        labels.append(f"other ({len(rest)} {'tags' if by == 'tag' else 'sites'})")
    total = [sum(col) for col in zip(*ys)] if ys else [0] * len(x)
    peak_i = max(range(len(total)), key=total.__getitem__) if total else 0
    res_i = max(range(len(reserved)), key=reserved.__getitem__)

    fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if ys:
        ax.stackplot(x, ys, labels=labels, step="post", alpha=0.85)
    ax.step(x, total, where="post", color="black", linewidth=0.8, label="in use")
    span = (x[-1] - x[0]) or 1.0

    def label(text: str, i: int, y: float, **kw: Any) -> None:
        right = (x[i] - x[0]) / span > 0.7   # near the right edge: write to the left of the mark
        ax.annotate(text, (x[i], y), textcoords="offset points", xytext=(-6 if right else 6, 6),
                    ha="right" if right else "left", **kw)

    if any(reserved):
        ax.step(x, reserved, where="post", color="gray", linestyle="--", linewidth=1.0, label="reserved")
        ax.plot([x[res_i]], [reserved[res_i]], marker="v", color="gray")
        label(f"reserved peak {format_bytes(reserved[res_i])}", res_i, reserved[res_i], fontsize=8, color="dimgray")
    if total:
        ax.plot([x[peak_i]], [total[peak_i]], marker="o", color="red")
        label(f"peak {format_bytes(total[peak_i])}", peak_i, total[peak_i], fontsize=9, color="red")
    top_y = max(max(total, default=0), max(reserved, default=0), 1)
    ax.yaxis.set_major_locator(MultipleLocator(1 << max(0, math.ceil(math.log2(top_y / 6)))))  # binary steps
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(int(v))))
    if tl["timed"] and x[-1] < 1.0:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v * 1e3:g}"))
        ax.set_xlabel("milliseconds since the first recorded event")
    else:
        ax.set_xlabel("seconds since the first recorded event" if tl["timed"] else "event")
    ax.set_ylabel("device memory")
    where = "all devices" if device is None else f"device {device}"
    ax.set_title(title or f"Memory over time by {by} ({where}, {tl['events']} events)")
    if not tl["events"]:
        ax.text(0.5, 0.5, "no history recorded: call ig.record_memory_history() before the work",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="dimgray")
    ax.set_ylim(bottom=0)
    ax.margins(x=0)
    ax.legend(loc="best" if len(x) < 5000 else "upper left", fontsize=8, framealpha=0.8)  # 'best' is slow on big data
    fig.tight_layout()
    path = os.fspath(out_png)
    fig.savefig(path, dpi=dpi, format="png")
    return {"path": path, "peak_bytes": total[peak_i] if total else 0, "peak_x": x[peak_i] if x else 0,
            "reserved_peak_bytes": reserved[res_i], "groups": labels, "events": tl["events"]}
