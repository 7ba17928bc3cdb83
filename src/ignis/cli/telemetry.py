"""The telemetry commands of the ``ignis`` command line: ``snapshot``, ``replay``, ``bench``.

    ignis snapshot plot FILE -o OUT.png [--by tag|site] [--device N] [--top N]
    ignis snapshot summary FILE
    ignis replay LOG.csv [--resource pool|async|direct|guard] [--budget BYTES] [--device N] [--json]
    ignis bench [--out DIR] [--full] [--only NAME ...] [--bench-dir DIR] [--timeout S]

``add_parsers(subparsers)`` adds them to the ``ignis`` parser (each sets
``func``, which takes the parsed arguments and returns the exit status).
Errors a user can fix print one line: a missing input file (or one that is
not a file) exits 2, as for a missing script; a bad log or snapshot, or
matplotlib not installed, exits 1; usage errors are argparse's (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .args import MISSING_FILE_STATUS, file_problem
from .args import ordinal as _ordinal

__all__ = ["add_parsers"]


def _fail(msg: str, status: int = 1) -> int:
    print(f"ignis: {msg}", file=sys.stderr)
    return status


def _missing(path: str, what: str) -> int | None:
    """The status for an input file that is missing or not a file (said on stderr), else None."""
    problem = file_problem(path, what)
    return _fail(problem, MISSING_FILE_STATUS) if problem else None


def _bytes_arg(text: str) -> int:
    from ..telemetry.replay import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size_arg(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, e.g. 1200x600, got {text!r}") from None
    return w, h


# -- snapshot ------------------------------------------------------------------------------------------
def _cmd_snapshot_plot(args: argparse.Namespace) -> int:
    from ..telemetry.plot import plot_timeline
    missing = _missing(args.file, "snapshot file")
    if missing is not None:
        return missing
    out = args.output or os.path.splitext(args.file)[0] + ".png"
    try:
        info = plot_timeline(args.file, out, by=args.by, device=args.device, top=args.top, size=args.size)
    except ImportError as e:
        return _fail(str(e))
    except (ValueError, KeyError, EOFError, OSError) as e:
        return _fail(f"could not plot {args.file}: {type(e).__name__}: {e}")
    from ..telemetry.stats import format_bytes
    print(f"wrote {info['path']}: {info['events']} events, peak in use {format_bytes(info['peak_bytes'])}, "
          f"reserved peak {format_bytes(info['reserved_peak_bytes'])}; {len(info['groups'])} {args.by} group(s)")
    return 0


def snapshot_summary(snap: dict[str, Any]) -> str:
    """A few lines about a snapshot: segments, blocks by state, trace entries by action, largest tags."""
    from ..telemetry.stats import format_bytes
    segs = snap.get("segments", [])
    states: dict[str, list[int]] = {}
    tags: dict[str, int] = {}
    for s in segs:
        for b in s.get("blocks", []):
            st = states.setdefault(b.get("state", "?"), [0, 0])
            st[0] += 1
            st[1] += int(b.get("size", 0))
            if b.get("state") == "active_allocated":
                tags[b.get("tag") or "untagged"] = tags.get(b.get("tag") or "untagged", 0) + int(b.get("size", 0))
    lines = [f"segments: {len(segs)}, reserved {format_bytes(sum(int(s.get('total_size', 0)) for s in segs))}"]
    for state, (n, size) in sorted(states.items()):
        lines.append(f"  {state:<20} {n:>7} block(s) {format_bytes(size):>12}")
    for d, trace in enumerate(snap.get("device_traces", [])):
        if trace:
            acts: dict[str, int] = {}
            for e in trace:
                acts[e.get("action", "?")] = acts.get(e.get("action", "?"), 0) + 1
            lines.append(f"device {d} trace: {len(trace)} entries (" +
                         ", ".join(f"{a} {n}" for a, n in sorted(acts.items())) + ")")
    if not any(snap.get("device_traces", [])):
        lines.append("no trace recorded (ig.record_memory_history() before the work records one)")
    if tags:
        lines.append("allocated by tag: " + ", ".join(f"{t} {format_bytes(n)}" for t, n in
                                                      sorted(tags.items(), key=lambda kv: -kv[1])[:8]))
    return "\n".join(lines)


def _cmd_snapshot_summary(args: argparse.Namespace) -> int:
    from ..telemetry.snapshot import load_snapshot
    missing = _missing(args.file, "snapshot file")
    if missing is not None:
        return missing
    try:
        snap = load_snapshot(args.file)
    except Exception as e:  # noqa: BLE001 - unpickling a bad file can raise anything
        return _fail(f"could not read {args.file}: {type(e).__name__}: {e}")
    print(snapshot_summary(snap))
    return 0


# -- replay ----------------------------------------------------------------------------------------------
def format_replay(r: dict[str, Any]) -> str:
    """``replay``'s report as text."""
    from ..telemetry.stats import format_bytes
    f = r["failures"]
    frag = f"{r['fragmentation']:.2f}x" if r["fragmentation"] is not None else "-"
    done = r["allocations"] + r["frees"]
    failed = f["oom"] + f["out_of_budget"]
    lines = [f"replayed {done} of {r['events']} events of {r['path']} ({r['allocations']} allocations, "
             f"{r['frees']} frees" + (f"; {failed} allocation(s) FAILED" if failed else "") +
             f") from {r['threads']} thread(s) on {r['streams']} stream(s)",
             f"  resource        {r['resource']}" + (f" under a {format_bytes(r['budget_bytes'])} budget"
                                                    if r["budget_bytes"] is not None else ""),
             f"  time            {r['time_s'] * 1e3:.1f} ms ({r['us_per_event']:.2f} us per event, "
             f"{r['backend']} backend)",
             f"  peak reserved   {format_bytes(r['peak_reserved_bytes'])}",
             f"  live at peak    {format_bytes(r['live_at_peak_bytes'])} (peak live {format_bytes(r['peak_live_bytes'])})",
             f"  fragmentation   {frag} (reserved / live at the reserved peak)",
             f"  failures        {f['oom']} out of memory, {f['out_of_budget']} out of budget, "
             f"{f['unmatched_frees']} free(s) of unknown pointers"]
    extra = []
    if r["missing_frees"]:
        extra.append(f"{r['missing_frees']} pointer(s) reused before their free")
    if r["left_allocated"]:
        extra.append(f"{r['left_allocated']} block(s) never freed by the log (freed after the replay)")
    sk = r["skipped"]
    if sk["allocate_failures"] or sk["unknown_actions"]:
        extra.append(f"skipped {sk['allocate_failures']} 'allocate failure' line(s) and "
                     f"{sk['unknown_actions']} line(s) with other actions")
    if extra:
        lines.append("  notes           " + "; ".join(extra))
    if not r["gpu_timings"]:
        lines.append("  (emulated backend: the time measures the emulator, not a GPU; memory numbers hold)")
    return "\n".join(lines)


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..errors import IgnisError
    from ..telemetry.replay import replay
    missing = _missing(args.log, "log file")
    if missing is not None:
        return missing
    try:
        r = replay(args.log, args.resource, args.budget, device=args.device)
    except (ValueError, OSError, IgnisError) as e:
        return _fail(f"could not replay {args.log}: {type(e).__name__}: {e}")
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        print(format_replay(r))
    failed = r["failures"]["oom"] + r["failures"]["out_of_budget"]
    if failed:  # the log could not be replayed as it ran: say so in the status too
        print(f"ignis replay: {failed} allocation(s) of the log failed here (exit status 1)", file=sys.stderr)
        return 1
    return 0


# -- bench -----------------------------------------------------------------------------------------------
def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_benchmarks
    return run_benchmarks(args.out, quick=not args.full, only=args.only, bench_dir=args.bench_dir,
                          timeout=args.timeout)


def add_parsers(subparsers: Any) -> None:
    """Add ``snapshot``, ``replay`` and ``bench`` to the ``ignis`` command's subparsers."""
    from ..telemetry.replay import RESOURCES

    snap = subparsers.add_parser("snapshot", help="look at a memory snapshot (ig.dump_snapshot's pickle)",
                                 description="Work with memory snapshots written by ig.dump_snapshot() (or "
                                             "PyTorch's torch.cuda.memory._dump_snapshot()); the same file opens "
                                             "in https://pytorch.org/memory_viz.")
    ssub = snap.add_subparsers(dest="snapshot_command", required=True, metavar="ACTION")
    plot = ssub.add_parser("plot", help="draw memory over time, stacked by tag or allocation site, as a PNG",
                           description="Draw memory in use over time from a snapshot's trace, stacked by tag or "
                                       "allocation site, with reserved memory and the peaks marked (needs "
                                       "matplotlib: pip install 'ignis[plot]').")
    plot.add_argument("file", help="the snapshot pickle")
    plot.add_argument("-o", "--output", help="the PNG to write (default: FILE with .png)")
    plot.add_argument("--by", choices=("tag", "site"), default="tag", help="stack by tag or by allocation site")
    plot.add_argument("--device", type=_ordinal, default=None, help="one device's trace (default: all)")
    plot.add_argument("--top", type=int, default=10, help="groups drawn separately; the rest are 'other' (10)")
    plot.add_argument("--size", type=_size_arg, default=(1200, 600), metavar="WxH", help="pixels (1200x600)")
    plot.set_defaults(func=_cmd_snapshot_plot)
    summ = ssub.add_parser("summary", help="print what a snapshot holds",
                           description="Print a snapshot's segments, blocks by state, trace entries by action "
                                       "and largest tags.")
    summ.add_argument("file", help="the snapshot pickle")
    summ.set_defaults(func=_cmd_snapshot_summary)

    rep = subparsers.add_parser("replay", help="replay an allocation log against a resource",
                                description="Replay a CSV allocation log (RMM's Thread,Time,Action,Pointer,Size,"
                                            "Stream, or LoggingResource's) against a resource and report the time, "
                                            "peak reserved memory, fragmentation and failures.")
    rep.add_argument("log", help="the CSV log")
    rep.add_argument("--resource", choices=RESOURCES, default="pool",
                     help="pool: PoolResource (default); async: the driver's pool; direct: one driver call per "
                          "allocation; guard: DebugGuardResource over a pool")
    rep.add_argument("--budget", type=_bytes_arg, default=None, metavar="BYTES",
                     help="a byte limit (e.g. 512MiB); allocations past it count as failures")
    rep.add_argument("--device", type=_ordinal, default=0, help="device to replay on (default 0)")
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.set_defaults(func=_cmd_replay)

    bench = subparsers.add_parser("bench", help="run the benchmarks that apply here and report ratios",
                                  description="Run benchmarks/bench_*.py (allocator latency, array copies, "
                                              "safetensors load and save, ...) against the anchors installed "
                                              "here, print Ignis / anchor ratios, and write bench.md and "
                                              "bench.json. On the emulated backend everything runs in quick "
                                              "mode and timing rows are marked as meaningless there.")
    bench.add_argument("--out", default="bench-results", metavar="DIR",
                       help="where bench.md, bench.json and each benchmark's output go (default bench-results)")
    bench.add_argument("--full", action="store_true", help="full runs instead of the quick modes")
    bench.add_argument("--only", nargs="+", metavar="NAME", help="only these (alloc, array, safetensors, ...)")
    bench.add_argument("--bench-dir", default=None, metavar="DIR", help="the benchmarks directory")
    bench.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="per benchmark (default 300 quick, 1800 full)")
    bench.set_defaults(func=_cmd_bench)
