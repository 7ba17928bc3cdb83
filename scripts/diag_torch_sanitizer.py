"""Where ignis.torch's added cost goes inside a real PyTorch program on the GPU: the time spent
in each of the sanitizer's entry points (and in each op's stack capture) while
``benchmarks/bench_torch_sanitizer.py``'s two-stream loop or training step runs under
``ignis.torch``, measured in the program itself (a replay, ``bench_sanitizer_core.py``, runs
the same calls from warm caches, apart from PyTorch).

Each entry point is wrapped, on the sanitizer instance before the front end starts, by a
timer (two ``perf_counter_ns`` reads around the call); the wrapper's own cost is measured on a
no-op and reported beside. Rounds alternate plain / ignis / ignis with the timers.

    PYTHONPATH=src IGNIS_BACKEND=cuda python3 scripts/diag_torch_sanitizer.py [loop|train] [rounds]
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_torch_sanitizer import make_loop, make_train  # noqa: E402

ENTRY_POINTS = ("foreign_access", "extent_record_stream", "extent_freed", "on_event_record", "on_event_wait",
                "on_event_destroyed", "on_device_synchronize", "on_stream_synchronize", "on_event_synchronize")


def main() -> int:
    import torch

    import ignis.torch
    import ignis.torch._frontend as fe_mod
    from ignis.safety.sanitizer import sanitizer

    which = sys.argv[1] if len(sys.argv) > 1 else "loop"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    fn = (make_loop if which == "loop" else make_train)()
    n = 200 if which == "loop" else 20
    fn(3)
    pc = time.perf_counter_ns
    acc: dict[str, list[int]] = {}

    def timer(name: str, f):  # type: ignore[no-untyped-def]
        a = acc.setdefault(name, [0, 0])

        def w(*args):  # type: ignore[no-untyped-def]
            t = pc()
            try:
                return f(*args)
            finally:
                a[0] += pc() - t
                a[1] += 1
        return w

    def run(mode: str) -> float:
        capture = fe_mod.capture_stack
        if mode == "timed":
            for name in ENTRY_POINTS:
                setattr(sanitizer, name, timer(name, getattr(sanitizer, name)))
            fe_mod.capture_stack = timer("stack capture", capture)
        try:
            if mode != "plain":
                ignis.torch.enable("collect")
            fn(2)
            gc.collect()
            for a in acc.values():
                a[0] = a[1] = 0
            t = time.perf_counter()
            fn(n)
            dt = (time.perf_counter() - t) / n * 1e6
            if mode != "plain":
                ignis.torch.disable()
                sanitizer.disable()
        finally:
            fe_mod.capture_stack = capture
            for name in ENTRY_POINTS:
                sanitizer.__dict__.pop(name, None)
        return dt

    # the wrapper's own cost: a timed no-op
    noop = timer("(wrapper on a no-op)", lambda *a: None)
    for _ in range(20000):
        noop(1, 2)
    wrap_ns = acc["(wrapper on a no-op)"][0] / acc["(wrapper on a no-op)"][1]
    res: dict[str, list[float]] = {"plain": [], "ignis": [], "ignis, timed": []}
    per_call: dict[str, list[tuple[float, float]]] = {}
    for _ in range(rounds):
        res["plain"].append(run("plain"))
        res["ignis"].append(run("ignis"))
        res["ignis, timed"].append(run("timed"))
        for name, (ns, calls) in acc.items():
            if calls and not name.startswith("("):
                per_call.setdefault(name, []).append((ns / calls / 1e3, calls / n))
    unit = "iteration" if which == "loop" else "step"
    print(f"{torch.cuda.get_device_name()}: {which}, medians of {rounds} rounds, µs per {unit}")
    for k, v in res.items():
        print(f"  {k:28s} {statistics.median(v):9.1f}   ({', '.join(f'{x:.1f}' for x in v)})")
    print(f"  the timer's own cost per call (measured on a no-op): {wrap_ns / 1e3:.3f} µs")
    print(f"  {'entry point':28s} {'calls/' + unit:>14s} {'µs/call':>9s} {'µs/' + unit:>10s}")
    total = 0.0
    for name, v in sorted(per_call.items(), key=lambda kv: -statistics.median(x * c for x, c in kv[1])):
        us = statistics.median(x for x, _ in v)
        calls = statistics.median(c for _, c in v)
        total += us * calls
        print(f"  {name:28s} {calls:14.1f} {us:9.2f} {us * calls:10.1f}")
    print(f"  {'(all of the above)':28s} {'':14s} {'':9s} {total:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
