"""The sanitizer's own work per PyTorch op, apart from PyTorch: the calls ``ignis.torch``'s
front end makes into the sanitizer (each op's accesses, frees, record_stream, event records
and waits, synchronizations), recorded on the GPU from ``bench_torch_sanitizer.py``'s two
workloads, then replayed into a fresh sanitizer on any machine (no GPU, no torch).

The replay times what the sanitizer adds to an op once the front end has found its
accesses: the part of issue 15's added cost per op that is Ignis's checking, as opposed to
PyTorch's callbacks and the stack capture. Stacks are not part of the recording (each
access carries none), so no report can be formatted; the workloads are correct programs,
and a replay that reports anything fails.

The recording is gzipped JSON; ``benchmarks/data/torch_sanitizer_calls_h200.json.gz`` is one made on an
NVIDIA H200 (torch 2.11), the default.
Record (GPU, CUDA PyTorch): ``PYTHONPATH=src python3 benchmarks/bench_sanitizer_core.py --record calls.json.gz``
(``--models resnet,gpt2``: ``bench_models.py``'s real-model steps too;
``benchmarks/data/torch_sanitizer_models_h100.json.gz`` is such a recording, made on an H100)
Replay (anywhere):         ``PYTHONPATH=src python3 benchmarks/bench_sanitizer_core.py [calls.json.gz]``

``--sweep MB``: before each replayed call, copy MB MiB between two unrelated buffers (untimed), as
the framework's own work between two ops of a real step does to the caches: the same calls,
timed on caches that something else has just used.
"""

from __future__ import annotations

import argparse
import os
import gzip
import json
import statistics
import sys
import time
from typing import Any

# The sanitizer's entry points the PyTorch front end calls (directly or as trace callbacks).
ENTRY_POINTS = ("foreign_access", "extent_freed", "extent_allocated", "extent_record_stream", "extent_dropped",
                "on_event_record", "on_event_wait", "on_stream_wait_event", "on_stream_synchronize",
                "on_event_synchronize", "on_device_synchronize", "on_event_destroyed", "set_stream_label")


def _model(name: str) -> Any:
    """``bench_models.py``'s training step of ``name`` as a workload (``fn(n)``: n steps)."""
    from bench_models import build
    step = build(name)

    def fn(n: int) -> None:
        for _ in range(n):
            step()
    return fn


def record(path: str, loop_iters: int, train_steps: int, models: list[str], model_steps: int) -> int:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_torch_sanitizer import make_loop, make_train

    import ignis.torch
    from ignis.safety.sanitizer import sanitizer, unpack_items

    calls: list[tuple] = []

    def wrap(name: str, fn: Any) -> Any:
        if name == "foreign_access":
            def rec(stream: Any, op: str, frames: Any, items: list, synced: bool = False, library: int = -1,
                    thread: int = 0) -> None:
                its = unpack_items(items) if isinstance(items, bytes) else [tuple(it) for it in items]
                calls.append((name, (stream, op, None, its, synced)))
                fn(stream, op, frames, items, synced, library, thread)
        else:
            def rec(*args: Any) -> None:
                calls.append((name, args))
                fn(*args)
        return rec

    out: dict[str, Any] = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "workloads": {}}
    work = [("two-stream loop", make_loop, loop_iters), ("training step", make_train, train_steps)]
    work += [(f"{m} step", (lambda m=m: _model(m)), model_steps) for m in models]
    for label, make, n in work:
        fn = make()
        fn(3)
        for name in ENTRY_POINTS:
            setattr(sanitizer, name, wrap(name, getattr(sanitizer, name)))
        ignis.torch.enable("collect")
        try:
            fn(2)  # warm: the streams and extents exist
            del calls[:]
            fn(n)
            out["workloads"][label] = {"calls": list(calls), "iterations": n, "engine": ignis.torch._fe.engine
                                       if getattr(ignis.torch, "_fe", None) is not None else None}
        finally:
            ignis.torch.disable()
            for name in ENTRY_POINTS:
                sanitizer.__dict__.pop(name, None)
            del calls[:]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(out, f)
    for label, w in out["workloads"].items():
        n_ops = sum(1 for c in w["calls"] if c[0] == "foreign_access")
        print(f"recorded {label}: {len(w['calls'])} calls, {n_ops} checked ops, {w['iterations']} iterations")
    print(f"card: {out['card']} (torch {out['torch']}) -> {path}")
    return 0


def replay(path: str, rounds: int, sweep_mb: int = 0) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    from ignis.safety.sanitizer import pack_items, sanitizer
    sweep = bytearray(sweep_mb << 20) if sweep_mb > 0 else None
    blank = bytes(sweep_mb << 20) if sweep_mb > 0 else b""  # (made once: no allocation between calls)
    how = f", {sweep_mb} MiB written between calls" if sweep is not None else ""
    print(f"recorded on {data['card']} (torch {data['torch']}); replayed here{how}, best and median of {rounds} rounds")
    print(f"{'workload':18s} {'calls':>7s} {'ops':>6s} {'µs/op best':>11s} {'µs/op median':>13s} {'µs/call':>8s}")
    failed = 0
    for label, w in data["workloads"].items():
        calls = w["calls"]
        ops = sum(1 for c in calls if c[0] == "foreign_access") or 1
        times = []
        for _ in range(rounds):
            sanitizer.enable("collect")
            sanitizer.clear()
            # Each op's items packed, as the op observer hands them over.
            bound = [(getattr(sanitizer, name), (*args[:3], pack_items(args[3]), *args[4:])
                      if name == "foreign_access" else args) for name, args in calls]
            if sweep is None:
                t = time.perf_counter()
                for fn, args in bound:
                    fn(*args)
                times.append(time.perf_counter() - t)
            else:
                spent = 0.0
                for fn, args in bound:
                    sweep[:] = blank  # (untimed: MB MiB read and MB MiB written, in place)
                    t = time.perf_counter()
                    fn(*args)
                    spent += time.perf_counter() - t
                times.append(spent)
            found = len(sanitizer.reports)
            sanitizer.disable()
            if found:
                failed += 1
                print(f"  {label}: {found} report(s) on a correct workload")
        best, med = min(times), statistics.median(times)
        print(f"{label:18s} {len(calls):7d} {ops:6d} {best / ops * 1e6:11.2f} {med / ops * 1e6:13.2f} "
              f"{best / len(calls) * 1e6:8.2f}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                                          "torch_sanitizer_calls_h200.json.gz"),
                    help="the recording (written with --record, read otherwise)")
    ap.add_argument("--record", action="store_true", help="record on the GPU (needs CUDA PyTorch)")
    ap.add_argument("--loop-iters", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--models", default="", help="also record bench_models.py's steps (e.g. resnet,gpt2)")
    ap.add_argument("--model-steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sweep", type=int, default=0, metavar="MB",
                    help="copy MB MiB between other buffers before each call (caches used by something else)")
    args = ap.parse_args()
    if args.record:
        return record(args.path, args.loop_iters, args.train_steps, [m for m in args.models.split(",") if m],
                      args.model_steps)
    return replay(args.path, args.rounds, args.sweep)


if __name__ == "__main__":
    raise SystemExit(main())
