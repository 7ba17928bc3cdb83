"""CUDA graphs and compiled code under the sanitizer, on one GPU, the contenders in turns.

1. Replay cost: a graph of ``--ops`` small elementwise ops over a few tensors, captured once;
   host time per ``g.replay()`` without and with ``ignis.torch`` (collect mode, the op
   observer), and the added time per access the replay applies (and per access the
   capture recorded); the same ops issued eagerly under the sanitizer for comparison.
   In one process: the front end is switched on and off between turns.
2. A ``torch.compile``d training step (a small transformer block, default mode: Inductor's
   Triton kernels) plain and under ``ignis run --sanitize``: each contender a process of
   its own (``--child``), in turns; median step time.

Targets (issue 33): at most 1 µs of host time per recorded access at replay; the compiled step
under ``--sanitize`` at most 1.5x its plain time.
Run: ``PYTHONPATH=src python3 benchmarks/bench_graphs.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from _steps import median_step_ms

HERE = os.path.abspath(__file__)


def replay_bench(n_ops: int, reps: int, rounds: int) -> None:
    import torch

    import ignis.torch as igt
    from ignis.safety.sanitizer import sanitizer

    xs = [torch.randn(1 << 14, device="cuda") for _ in range(4)]

    def body() -> None:
        for i in range(n_ops):
            a, b = xs[i % 4], xs[(i + 1) % 4]
            a.mul_(0.999).add_(b, alpha=0.001)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    def timed(fn, n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t
        torch.cuda.synchronize()
        return dt / n

    igt.enable("collect")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    cap = g.__dict__.get("_ignis_graph")
    planned = len(cap.plan) if cap is not None else 0
    recorded = cap.recorded if cap is not None else 0
    res: dict[str, list[float]] = {"replay plain": [], "replay sanitized": [], "eager sanitized": []}
    for r in range(rounds):
        igt.disable()
        res["replay plain"].append(timed(g.replay, reps))
        igt.enable("collect")
        res["replay sanitized"].append(timed(g.replay, reps))
        res["eager sanitized"].append(timed(body, max(3, reps // 20)))
    igt.disable()
    sanitizer.disable()
    med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    added = med["replay sanitized"] - med["replay plain"]
    print(f"replay of a {n_ops * 2}-op graph ({planned} accesses applied per replay, {recorded} recorded):")
    for k, v in med.items():
        print(f"  {k:18s} {v:10.1f} µs")
    per = added / max(recorded, 1)
    print(f"  added per replay {added:.1f} µs: {added / max(planned, 1):.3f} µs per applied access, "
          f"{per:.3f} µs per recorded access")
    print(f"  target: at most 1 µs per recorded access: {'met' if recorded and per <= 1.0 else 'NOT met'}")


def child(steps: int, warm: int) -> None:
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True).cuda()
    model = torch.compile(block)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-4)
    x = torch.randn(16, 64, 256, device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    print(f"BENCH_STEP_MS {median_step_ms(step, steps, warm):.3f}")


def contender(name: str, steps: int, warm: int) -> float:
    cmd = [sys.executable] + (["-m", "ignis", "run", "--sanitize"] if name != "plain" else [])
    cmd += [HERE, "--child", "--steps", str(steps), "--warm", str(warm)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"BENCH_STEP_MS (\S+)", p.stdout + p.stderr)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{name} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    if name != "plain" and "no problems found" not in p.stderr:
        print(f"warning: ignis reported problems on the benchmark's correct program:\n{p.stderr[-3000:]}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.steps, args.warm)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_graphs: needs a GPU; skipped")
        return 0
    print(f"card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    replay_bench(args.ops, 200, args.rounds)
    if args.skip_compile:
        return 0
    res: dict[str, list[float]] = {"plain": [], "ignis --sanitize": []}
    for r in range(args.rounds):
        for n in (res if r % 2 == 0 else list(res)[::-1]):
            res[n].append(contender(n, args.steps, args.warm))
            print(f"round {r}: {n}: {res[n][-1]:.2f} ms/step", flush=True)
    med = {n: statistics.median(v) for n, v in res.items()}
    ratio = med["ignis --sanitize"] / med["plain"]
    print(f"torch.compile'd training step (TransformerEncoderLayer 256x4, batch 16x64, AdamW): plain "
          f"{med['plain']:.2f} ms, --sanitize {med['ignis --sanitize']:.2f} ms ({ratio:.2f}x); target at most "
          f"1.5x: {'met' if ratio <= 1.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
