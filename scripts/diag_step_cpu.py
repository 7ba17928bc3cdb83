"""Where a training step's wall time goes on the host: CPU work, waiting for a CPU, or waiting.

Runs ``benchmarks/bench_models.py``'s step of MODEL for STEPS timed steps (after warm ones)
in this process, as it is started (plainly, or under ``python -m ignis run --sanitize`` /
``--guard``), and prints per step:

- the wall time (each step followed by a device synchronization, as the benchmarks time it)
  and the host time to issue it (the time to the step's return, before that synchronization);
- for each thread of the process that ran during the steps (the main thread, PyTorch's autograd
  thread, any other), the time it spent on a CPU and the time it waited on a run queue (the
  kernel's schedstat, in ns), and its switches (voluntary: it blocked; involuntary: it was
  preempted);
- the cyclic collector's runs.

A thread's CPU time near the step's wall time says the step is that thread's work; a run
queue wait says the host had no CPU free for it; neither says the thread waited (a lock,
the GIL, the device).

With ``timers`` (under ``--sanitize``), the op observer's own timers run in the timed steps
(``ignis.torch._native.observer_timing``), and their sums are printed per step: PyTorch's
RecordFunction callbacks, the GIL's taking in them, the stack capture and the sanitizer's
call per checked op, the trace events. (The timers read the clock a few times an op: their
step is a little slower than the untimed one.)

With ``rf`` (plainly), a global RecordFunction callback that only counts the calls runs in the
steps, asking for every call's inputs and outputs as the op observer does
(``ignis_obs_probe_start(1)``): what PyTorch's callback machinery costs a step by itself.

    PYTHONPATH=src python3 scripts/diag_step_cpu.py MODEL [STEPS] [WARM] [timers|rf]
    PYTHONPATH=src python3 -m ignis run --sanitize scripts/diag_step_cpu.py MODEL [STEPS] [WARM] [timers]
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_models import build  # noqa: E402


def _threads() -> dict[int, tuple[str, int, int, int, int]]:
    """Per thread id: (name, ns on a CPU, ns waiting on a run queue, voluntary switches,
    involuntary switches)."""
    out = {}
    base = "/proc/self/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
            vol = inv = 0
            with open(f"{base}/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        inv = int(line.split()[1])
            out[int(tid)] = (name, run, wait, vol, inv)
        except (OSError, ValueError):
            continue  # (a thread that ended meanwhile)
    return out


def main() -> int:
    import torch
    model = sys.argv[1] if len(sys.argv) > 1 else "resnet"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    warm = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    step = build(model)
    probe = None
    if len(sys.argv) > 4 and sys.argv[4] == "rf":
        from ignis.torch._native import observer
        probe = observer()
        if probe is None or probe.ignis_obs_probe_start(1) != 0:
            raise SystemExit("the op observer's RecordFunction probe cannot start here")
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    collections = [0]
    gc.callbacks.append(lambda phase, info: collections.__setitem__(0, collections[0] + (phase == "start")))
    walls, issues = [], []
    timing = None
    if len(sys.argv) > 4 and sys.argv[4] == "timers" and "ignis.torch" in sys.modules:
        from ignis.torch._native import observer_timing
        timing = observer_timing
        timing(True)
    obs = None
    if "ignis.torch" in sys.modules:  # the op observer's calls held without the GIL (its checker thread's)
        from ignis.torch._native import observer
        obs = observer()
    c0 = obs.ignis_obs_c_held() if obs is not None else 0
    before = _threads()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        walls.append((t2 - t0) * 1e3)
        issues.append((t1 - t0) * 1e3)
    after = _threads()
    timers = timing(False) if timing is not None else None
    calls = probe.ignis_obs_probe_stop() if probe is not None else None
    wall_ms = statistics.median(walls)
    total_ms = sum(walls)
    mode = os.environ.get("IGNIS_RUN_MODE") or ("under ignis run" if "ignis.torch" in sys.modules else "plain")
    print(f"STEP {model} {mode}: wall {wall_ms:.2f} ms (median of {steps}; mean {total_ms / steps:.2f}), "
          f"issue {statistics.median(issues):.2f} ms, collector runs {collections[0] / steps:.2f} a step")
    if obs is not None:
        print(f"  observer calls held without the GIL: {(obs.ignis_obs_c_held() - c0) / steps:.0f} a step; "
              f"checker thread {'on' if obs.ignis_obs_checker() else 'off'}")
    if calls is not None:
        print(f"  RecordFunction probe: {calls / (steps + warm):.0f} calls a step, inputs and outputs asked for")
    if timers is not None:
        for k, (ns, n) in timers.items():
            print(f"  observer {k:10s} {ns / 1e6 / steps:7.3f} ms a step, {n / steps:7.1f} spans, "
                  f"{ns / 1e3 / n if n else 0:6.2f} µs each")
    main_tid = os.getpid()
    rows = []
    for tid, (name, run, wait, vol, inv) in after.items():
        b = before.get(tid, (name, 0, 0, 0, 0))
        d_run, d_wait, d_vol, d_inv = run - b[1], wait - b[2], vol - b[3], inv - b[4]
        if d_run <= 0 and d_vol <= 0 and d_inv <= 0:
            continue
        rows.append((d_run, tid, name, d_wait, d_vol, d_inv))
    rows.sort(reverse=True)
    for d_run, tid, name, d_wait, d_vol, d_inv in rows[:8]:
        who = "main" if tid == main_tid else name
        print(f"  thread {who:16s} on a CPU {d_run / 1e6 / steps:7.2f} ms a step ({d_run / 1e6 / total_ms:5.1%} of the "
              f"wall), run queue {d_wait / 1e6 / steps:6.3f} ms, switches {d_vol / steps:6.1f} voluntary "
              f"{d_inv / steps:5.1f} involuntary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
