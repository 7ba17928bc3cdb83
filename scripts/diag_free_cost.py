"""Where the sanitizer's time goes inside a real training step (issue 34's lead from runs P2-P3:
the free handler costs 6-8 µs a free in a ResNet-18 step, where a free handler that does
nothing costs nothing).

The model's step (``benchmarks/bench_models.py``) runs under the front end as ``--sanitize``
runs it, with the sanitizer's two entry points timed where they are called, in the real
step's state: each free (``Sanitizer.extent_freed``, handed to the observer's trace hook) and
each op's accesses (``Sanitizer.foreign_access``, which the observer calls itself). For each
free it notes the records the freed extent held and the graveyard's size; for each op the
items it carried. Prints per step: the time of each, the distribution of a free's time by its
records, and the slowest frees.

    PYTHONPATH=src python3 scripts/diag_free_cost.py [resnet|gpt2] [steps]
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_models import build  # noqa: E402


class _TimedSan:
    """The sanitizer, its per-op entry point timed (the observer calls ``foreign_access``)."""

    def __init__(self, san, out: list) -> None:
        self._san = san
        self._out = out

    def foreign_access(self, stream, op, frames, items, *rest):
        t = time.perf_counter_ns()
        try:
            return self._san.foreign_access(stream, op, frames, items, *rest)
        finally:
            self._out.append((time.perf_counter_ns() - t, len(items) // 56 if isinstance(items, bytes) else -1, op))

    def extent_record_stream(self, *a):
        return self._san.extent_record_stream(*a)


def run(model: str, steps: int) -> None:
    import torch
    import ignis.torch
    from ignis.safety.sanitizer import sanitizer as san
    from ignis.torch import _frontend
    from ignis.torch._native import observer

    step = build(model)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    frees: list[tuple[int, int, int, int]] = []
    ops: list[tuple[int, int, str]] = []
    obs = observer()
    real_start = obs.ignis_obs_trace_start
    kinds = _frontend.TorchFrontEnd._TRACE_KINDS
    k_free = kinds.index("MemoryDeallocationCallbacks")
    live = san._live

    def start(handlers, registries):
        handlers = list(handlers)
        real = handlers[k_free]
        if real is not None:
            def timed(ptr, current):
                ext = live.get(ptr)
                n = len(ext.recs) if ext is not None else -1
                g = len(san._grave)
                t = time.perf_counter_ns()
                try:
                    real(ptr, current)
                finally:
                    frees.append((time.perf_counter_ns() - t, n, g, ptr))
            handlers[k_free] = timed
        return real_start(tuple(handlers), registries)

    obs.ignis_obs_trace_start = start
    real_direct = _frontend.TorchFrontEnd._direct

    def direct(self):
        t = real_direct(self)
        return None if t is None else (_TimedSan(t[0], ops),) + t[1:]
    _frontend.TorchFrontEnd._direct = direct
    try:
        ignis.torch.enable("collect")
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        frees.clear()
        ops.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e3
        ignis.torch.disable()
    finally:
        _frontend.TorchFrontEnd._direct = real_direct
        obs.ignis_obs_trace_start = real_start
    print(f"{model}: {wall:.2f} ms per step under the front end (timed), {len(frees) / steps:.0f} frees and "
          f"{len(ops) / steps:.0f} op calls per step; reports: {len(san.reports)}")
    if frees:
        ft = [f[0] for f in frees]
        print(f"  frees: {sum(ft) / steps / 1e3:.1f} µs per step; per free median {statistics.median(ft) / 1e3:.2f} µs, "
              f"mean {statistics.fmean(ft) / 1e3:.2f}, p90 {sorted(ft)[int(len(ft) * 0.9)] / 1e3:.2f}, "
              f"max {max(ft) / 1e3:.1f}")
        by = collections.defaultdict(list)
        for dt, n, _g, _p in frees:
            by[n if n < 8 else (8 if n < 32 else (32 if n < 128 else 128))].append(dt)
        for n in sorted(by):
            v = by[n]
            label = {8: "8-31", 32: "32-127", 128: "128+"}.get(n, str(n))
            print(f"    records {label:>6}: {len(v) / steps:6.1f} per step, median {statistics.median(v) / 1e3:6.2f} µs, "
                  f"total {sum(v) / steps / 1e3:7.1f} µs per step")
        gs = [f[2] for f in frees]
        print(f"  graveyard at a free: median {statistics.median(gs):.0f} extents, max {max(gs)}")
        print("  slowest frees (µs, records, graveyard): "
              + ", ".join(f"{dt / 1e3:.1f}/{n}/{g}" for dt, n, g, _p in sorted(frees, reverse=True)[:8]))
    if ops:
        ot = [o[0] for o in ops]
        print(f"  ops: {sum(ot) / steps / 1e3:.1f} µs per step; per op median {statistics.median(ot) / 1e3:.2f} µs, "
              f"mean {statistics.fmean(ot) / 1e3:.2f}, max {max(ot) / 1e3:.1f}")
        per = collections.defaultdict(list)
        for dt, _n, op in ops:
            per[op].append(dt)
        top = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:8]
        print("  ops taking the most (µs per step / calls per step): "
              + "; ".join(f"{op} {sum(v) / steps / 1e3:.0f}/{len(v) / steps:.0f}" for op, v in top))


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else "resnet"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    import torch
    print(f"card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    run(model, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
