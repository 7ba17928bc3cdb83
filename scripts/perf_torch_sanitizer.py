"""A workload run long enough for a sampling profiler (``scripts/gpu_perf_torch.sh`` runs
it under ``perf record``): one of ``benchmarks/bench_torch_sanitizer.py``'s, plain or under
``ignis.torch``'s sanitizer, or ``torch.empty`` + free pairs, plain or under the guard.

    PYTHONPATH=src python3 scripts/perf_torch_sanitizer.py {plain,trace,ignis} {loop,train,resnet,gpt2} [seconds]
    PYTHONPATH=src python3 scripts/perf_torch_sanitizer.py guard {resnet,gpt2} [seconds]

``resnet`` and ``gpt2``: ``benchmarks/bench_models.py``'s training steps (``guard``: under the
guard as ``ignis run --guard`` installs it, before the model's first allocation).

``trace``: plain, with PyTorch's GPU trace activated (what ``bench_torch_sanitizer.py``'s plain
contender runs with: each allocation, free and event calls into Python, with no callback).
    PYTHONPATH=src python3 scripts/perf_torch_sanitizer.py {plain,guard} pair BYTES [seconds]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from bench_torch_sanitizer import make_loop, make_train  # noqa: E402


def main() -> int:
    variant, workload = sys.argv[1], sys.argv[2]
    if workload == "pair":
        return pairs(variant == "guard", int(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 8.0)
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 8.0
    if workload in ("resnet", "gpt2"):
        from bench_models import build
        if variant == "guard":
            import ignis.torch
            ignis.torch.use_guard()
        one = build(workload)

        def fn(n: int) -> None:
            for _ in range(n):
                one()
    else:
        fn = (make_loop if workload == "loop" else make_train)()
    fn(3)
    if variant == "trace":
        import torch
        import torch.cuda._gpu_trace  # noqa: F401 - the hook fires into it
        torch._C._activate_gpu_trace()
    if variant == "ignis":
        import ignis.torch
        ignis.torch.enable("collect")
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(20)
        n += 20
    dt = time.perf_counter() - t0
    print(f"{variant} {workload}: {n} iterations, {dt / n * 1e6:.1f} µs each")
    if variant == "ignis":
        from ignis.safety.sanitizer import sanitizer
        assert not sanitizer.reports, sanitizer.reports[:1]
        ignis.torch.disable()
    return 0


def pairs(guard: bool, nbytes: int, seconds: float) -> int:
    import torch
    if guard:
        import ignis.torch
        ignis.torch.use_guard()
    numel = nbytes // 4
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            torch.empty(numel, device="cuda")  # freed at once: an allocate + free pair
        n += 1000
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"{'guard' if guard else 'plain'} pair {nbytes} B: {dt / n * 1e6:.2f} µs each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
