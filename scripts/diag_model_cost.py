"""Where a real model's training step under ``ignis run --sanitize`` spends its added time.

One process per model (``benchmarks/bench_models.py``'s ResNet-18 and GPT-2 steps), medians
of steps, each followed by a synchronization:

- ``plain``: before anything activates PyTorch's GPU trace;
- ``issue``: the host time to issue one plain step (no synchronization inside it): what the
  host alone costs, against the step time;
- then, in rounds, in turns: ``trace`` (PyTorch's GPU trace active, nothing listening: each
  allocation, free and event record calls into Python anyway), ``ignis`` (the front end as
  ``--sanitize`` runs it), ``ignis-nofree`` (its free callback withdrawn), ``ignis-freenoop`` (a free
  callback that does nothing: the way there alone), ``ignis-stack0``
  (the stack capture replaced by a constant; with the observer's trace hook, no trace
  handler at all), ``ignis-nullsan`` (the observer hands each op to
  a sanitizer that does nothing: the cost of reaching Python per op), ``rf-bare`` and ``rf-io``
  (no front end: a RecordFunction callback that only counts the calls, without and with the
  ops' inputs and outputs: what PyTorch's callback machinery costs by itself).

Also counted per step: the trace events by kind, and the sanitizer's checked accesses.

    PYTHONPATH=src python3 scripts/diag_model_cost.py [resnet,gpt2] [steps] [rounds]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from _steps import median_step_ms  # noqa: E402
from bench_models import build  # noqa: E402


def med(step, n: int) -> float:
    """The median step in ms (each followed by a synchronization): bench_models' measure."""
    return median_step_ms(step, n, 0)


def issue(step, n: int) -> float:
    import torch
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e3


def _noop(*a):
    return None


class NullSan:
    """Takes the observer's calls and does nothing."""

    def foreign_access(self, *a):
        return None

    def extent_record_stream(self, *a):
        return None


def run(model: str, steps: int, rounds: int) -> None:
    import torch
    import torch.cuda._gpu_trace as gt
    step = build(model)
    for _ in range(5):
        step()
    res: dict[str, list[float]] = {}
    for _ in range(rounds):
        res.setdefault("plain", []).append(med(step, steps))
        res.setdefault("issue", []).append(issue(step, steps))
    torch._C._activate_gpu_trace()
    counts: dict[str, int] = {}
    regs = {n: getattr(gt, n) for n in dir(gt) if n.endswith("Callbacks")}
    added = []
    for n, r in regs.items():
        def cb(*a, _n=n):
            counts[_n] = counts.get(_n, 0) + 1
        r.add_callback(cb)
        added.append((r, cb))
    med(step, 5)
    for k in list(counts):
        counts[k] = 0
    med(step, steps)
    for r, cb in added:
        r.callback_list.remove(cb)
    print(f"{model}: trace events per step: "
          + ", ".join(f"{k.replace('Callbacks', '')} {v / steps:.0f}" for k, v in sorted(counts.items())))
    import ignis.torch
    from ignis.torch import _frontend
    from ignis.safety.sanitizer import sanitizer
    real_capture = _frontend.capture_stack
    real_direct = _frontend.TorchFrontEnd._direct
    const = real_capture()

    def variant(name: str) -> None:
        if name == "trace":
            res.setdefault(name, []).append(med(step, steps))
            return
        if name.startswith("rf-"):  # PyTorch's RecordFunction alone: a callback that only counts
            from ignis.torch._native import observer
            obs = observer()
            obs.ignis_obs_probe_start(1 if name == "rf-io" else 0)
            try:
                med(step, 3)
                obs.ignis_obs_probe_stop()
                obs.ignis_obs_probe_start(1 if name == "rf-io" else 0)
                res.setdefault(name, []).append(med(step, steps))
            finally:
                calls = obs.ignis_obs_probe_stop()
            res.setdefault("rf calls", []).append(calls / steps)
            return
        if name == "ignis-stack0":
            _frontend.capture_stack = lambda: const
        if name == "ignis-nullsan":
            null = NullSan()

            def direct(self):
                t = real_direct(self)
                return None if t is None else (null,) + t[1:]
            _frontend.TorchFrontEnd._direct = direct
        try:
            ignis.torch.enable("collect")
            if name in ("ignis-nofree", "ignis-freenoop"):
                fe = ignis.torch._fe
                if fe._trace_shim:  # the observer's trace hook: its tables again, less the free handler
                    kinds = fe._TRACE_KINDS   # (freenoop: a free handler that does nothing, reached
                    fe._obs.ignis_obs_trace_start(  # as the real one is: the way there alone)
                        tuple(_noop if (k == "MemoryDeallocationCallbacks" and name == "ignis-freenoop")
                              else None for k in kinds),
                        tuple(getattr(gt, k).callback_list for k in kinds))
                gt.MemoryDeallocationCallbacks.callback_list.clear()
            med(step, 3)
            before = sanitizer.checked_foreign
            res.setdefault(name, []).append(med(step, steps))
            if name == "ignis":
                res.setdefault("accesses", []).append((sanitizer.checked_foreign - before) / steps)
                fe = ignis.torch._fe
                hooked.append(f"engine {fe.engine}, GPU trace hook {'on' if fe._trace_shim else 'off'}")
            ignis.torch.disable()
        finally:
            _frontend.capture_stack = real_capture
            _frontend.TorchFrontEnd._direct = real_direct
        if sanitizer.reports:
            print(f"  {name}: {len(sanitizer.reports)} reports (first: {sanitizer.reports[0]})")
            sanitizer.reports.clear()

    hooked: list[str] = []
    names = ["trace", "rf-bare", "rf-io", "ignis", "ignis-nofree", "ignis-freenoop", "ignis-stack0", "ignis-nullsan"]
    if os.environ.get("DIAG_VARIANTS"):  # only these (comma-separated)
        names = [n for n in os.environ["DIAG_VARIANTS"].split(",") if n in names]
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            variant(n)
    print(f"  ignis: {'; '.join(sorted(set(hooked)))}")
    m = {k: statistics.median(v) for k, v in res.items()}
    plain = m["plain"]
    for k, v in m.items():
        if k == "accesses":
            print(f"  accesses checked per step: {v:.0f}")
        elif k == "rf calls":
            print(f"  RecordFunction calls per step: {v:.0f}")
        else:
            print(f"  {k:14s} {v:8.2f} ms  {v / plain:5.2f}x plain  (rounds: {', '.join(f'{x:.2f}' for x in res[k])})")


def main() -> int:
    models = (sys.argv[1] if len(sys.argv) > 1 else "resnet,gpt2").split(",")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch
    print(f"card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for model in models:
        run(model, steps, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
