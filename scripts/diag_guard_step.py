"""Where the guard's added time goes inside a real training step (issue 34: ``--guard`` at most
1.3x). One process runs ``benchmarks/bench_models.py``'s step of MODEL, plain or under the guard
(installed as ``ignis run --guard`` installs it, with options changed: ``guard:k=v,k=v``), and
prints per step:

- the step's time (median, each step followed by a device synchronization);
- under the guard, the host time inside PyTorch's allocator entry points (the GIL's taking
  included: ``_guard_fast.torch_guard_timing``), the part of the frees in the poison's driver
  calls, the time in the synchronize hook (``guard_front.on_sync``), and the guard's parts
  (``guard_base.guard_timing``: its compiled allocate and free, the check batches' queuing,
  the release of blocks leaving the quarantine); ``guard:direct=0`` queues the check batches
  through the backend's methods (``guard_base.check_batches_direct``);
- the device's time by kind (PyTorch's profiler, kernels / memsets / copies summed): whether the
  guard makes the device's own work longer (its memsets and checks, or the model's kernels on
  memory that is not the one just freed).

    PYTHONPATH=src python3 scripts/diag_guard_step.py resnet|gpt2 plain|guard[:k=v,...] [steps]
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from _steps import step_times_ms  # noqa: E402
from bench_models import build  # noqa: E402


def _options(spec: str) -> dict:
    opts: dict = {}
    for kv in filter(None, spec.split(",")):
        k, v = kv.split("=")
        opts[k] = {"True": True, "False": False, "None": None}[v] if v in ("True", "False", "None") else int(v, 0)
    return opts


def main() -> int:
    model, mode = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    sync_ns = [0, 0]
    fast = None
    if mode.startswith("guard"):
        from ignis.memory import guard_front
        from ignis.torch import _guard, _guard_fast as fast
        real_on_sync = guard_front.on_sync

        def on_sync(*a: object) -> None:  # (bound by _hook_syncs at installation, from the module)
            t = time.perf_counter_ns()
            try:
                real_on_sync(*a)
            finally:
                sync_ns[0] += time.perf_counter_ns() - t
                sync_ns[1] += 1
        guard_front.on_sync = on_sync
        opts = _options(mode.partition(":")[2])
        if "direct" in opts:  # not a guard option: the check batches through the backend's methods (0)
            from ignis.memory import guard_base
            guard_base.check_batches_direct(bool(opts.pop("direct")))
        _guard.use_guard(**opts)
    import torch
    step = build(model)
    times = step_times_ms(step, steps, 5)
    print(f"{model} {mode}: step {statistics.median(times):.3f} ms (median of {steps}; "
          f"quartiles {statistics.quantiles(times, n=4)[0]:.3f}-{statistics.quantiles(times, n=4)[2]:.3f})")
    if fast is not None:
        from ignis.memory import guard_base
        fast.torch_guard_timing(True)
        guard_base.guard_timing(True)
        sync_ns[:] = [0, 0]
        step_times_ms(step, steps, 0)
        na, ta, nf, tf, tp, gil, cpu = fast.torch_guard_timing(False)
        parts = guard_base.guard_timing(False)
        print(f"  per step: {na / steps:.0f} allocations {ta / steps / 1e3:.0f} µs ({ta / max(na, 1) / 1e3:.2f} µs each); "
              f"{nf / steps:.0f} frees {tf / steps / 1e3:.0f} µs ({tf / max(nf, 1) / 1e3:.2f} µs each, "
              f"{tp / max(nf, 1) / 1e3:.2f} µs of it the poison's driver calls); "
              f"{sync_ns[1] / steps:.1f} synchronize hooks {sync_ns[0] / steps / 1e3:.0f} µs")
        print(f"  of the entry points' {(ta + tf) / steps / 1e3:.0f} µs: {gil / steps / 1e3:.0f} µs taking the GIL, "
              f"{cpu / steps / 1e3:.0f} µs on the thread's CPU")
        p = {k: v / steps for k, v in parts.items()}
        print(f"  guard parts per step: allocate_c {p['alloc_ns'] / 1e3:.0f} µs; free_fast_c {p['free_ns'] / 1e3:.0f} µs, "
              f"of it queuing jobs {p['queue_ns'] / 1e3:.0f} µs; {p['launches']:.1f} batches queued "
              f"{p['launch_ns'] / 1e3:.0f} µs ({parts['launch_ns'] / max(parts['launches'], 1) / 1e3:.1f} µs each); "
              f"{p['released']:.0f} blocks handed back {p['release_ns'] / 1e3:.0f} µs; {p['queries']:.0f} event queries")
        calls = [k for k in parts if k.startswith("direct_")]
        if parts["direct_dtoh_ns"]:
            print("  a direct batch's driver calls (µs per batch): " + "; ".join(
                f"{k[7:-3]} {parts[k] / max(parts['launches'], 1) / 1e3:.1f}" for k in calls))
    from torch.profiler import ProfilerActivity, profile
    n = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    by_kind: dict = collections.defaultdict(lambda: [0, 0.0])
    names: dict = collections.defaultdict(float)
    spans: list = []
    waits: dict = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            if "Synchronize" in e.name or e.name in ("cudaMemcpyAsync", "cudaMemcpy"):
                waits[e.name] += e.time_range.elapsed_us()
            continue
        if getattr(e, "is_user_annotation", False):
            continue  # (a range over the device's work, not work of its own)
        name = e.name.lower()
        kind = "memset" if "memset" in name else "copy" if "memcpy" in name else "kernel"
        by_kind[kind][0] += 1
        by_kind[kind][1] += e.time_range.elapsed_us()
        spans.append((e.time_range.start, e.time_range.end))
        if kind == "kernel":
            names[e.name[:60]] += e.time_range.elapsed_us()
    busy, end = 0.0, float("-inf")
    for a, b in sorted(spans):  # the union of the device's work
        if b > end:
            busy += b - max(a, end)
            end = b
    print("  device per step: " + "; ".join(f"{k} {v[0] / n:.0f} x, {v[1] / n:.0f} µs" for k, v in sorted(by_kind.items()))
          + f"; busy (the union) {busy / n:.0f} µs")
    print("  host waiting per step: " + "; ".join(f"{k} {v / n:.0f} µs" for k, v in sorted(waits.items())))
    top = sorted(names.items(), key=lambda kv: -kv[1])[:4]
    print("  longest kernels per step: " + "; ".join(f"{k} {v / n:.0f} µs" for k, v in top))
    if fast is not None:
        _guard.finish(sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
