"""A DistributedDataParallel training step on two GPUs: plain, under PyTorch's CUDA sanitizer
(CSAN, ``TORCH_CUDA_SANITIZER=1``) and under ``ignis run --sanitize``, the contenders in turns.

Each contender is one ``torchrun --nproc_per_node 2`` run of this file's ``--child`` mode (the
sanitizers are per process, and CSAN cannot be switched off once on): a ResNet-18 from
torchvision (an MLP without torchvision) under DDP with AMP, a few warm steps, then timed
steps; rank 0 prints the median step time. ``--rounds`` rounds run every contender once,
round-robin; the medians over rounds are reported, with the ratios to plain and the fraction
of CSAN's added time that Ignis adds.

Target (issue 32): the step under ``--sanitize`` at most 1.5x the plain step.
Run on a machine with two GPUs: ``PYTHONPATH=src python3 benchmarks/bench_ddp.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys

from _steps import median_step_ms
from bench_models import build

HERE = os.path.abspath(__file__)


def child(steps: int, warm: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        import torchvision  # noqa: F401
        model, what = "resnet", "torchvision ResNet-18, batch 32 at 64x64, AMP, channels_last"
    except ImportError:
        model, what = "gpt2", "a transformers GPT-2 from a config, bf16 autocast, AdamW"
    step = build(model, wrap=lambda m: DDP(m))
    ms = median_step_ms(step, steps, warm)
    if rank == 0:
        print(f"BENCH_STEP_MS {ms:.3f}")
        print(f"BENCH_MODEL {what}")
    dist.barrier()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def contender(name: str, steps: int, warm: int) -> tuple[float, str]:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OMP_NUM_THREADS="1")
    env.pop("TORCH_CUDA_SANITIZER", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master-port", str(_port())]
    if name == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    if name == "ignis --sanitize":
        cmd += ["-m", "ignis", "run", "--sanitize"]
    cmd += [HERE, "--child", "--steps", str(steps), "--warm", str(warm)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    text = p.stdout + p.stderr
    m = re.search(r"BENCH_STEP_MS (\S+)", text)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{name} failed (exit {p.returncode}):\n{text[-3000:]}")
    model = re.search(r"BENCH_MODEL (.*)", text)
    if name == "ignis --sanitize" and "no problems found" not in text:
        print(f"warning: ignis reported problems on the benchmark's correct program:\n{text[-3000:]}")
    return float(m.group(1)), model.group(1) if model else "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-csan", action="store_true", help="leave CSAN out (it is slow)")
    args = ap.parse_args()
    if args.child:
        child(args.steps, args.warm)
        return 0
    import torch
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    if torch.cuda.device_count() < 2:
        print("bench_ddp: needs two GPUs; skipped")
        return 0
    names = ["plain", "ignis --sanitize"] + ([] if args.no_csan else ["csan"])
    res: dict[str, list[float]] = {n: [] for n in names}
    model = "?"
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            ms, model = contender(n, args.steps if n != "csan" else max(5, args.steps // 3), args.warm)
            res[n].append(ms)
            print(f"round {r}: {n}: {ms:.2f} ms/step", flush=True)
    med = {n: statistics.median(v) for n, v in res.items()}
    print(f"\nDDP step on 2x {card} ({model}), torch {torch.__version__}; medians of {args.rounds} rounds, "
          "contenders in turns:")
    for n in names:
        print(f"  {n:18s} {med[n]:8.2f} ms   {med[n] / med['plain']:.2f}x plain")
    if "csan" in med:
        added = (med["ignis --sanitize"] - med["plain"]) / (med["csan"] - med["plain"])
        print(f"  ignis adds {added:.3f} of CSAN's added time")
    ok = med["ignis --sanitize"] <= 1.5 * med["plain"]
    print(f"target: --sanitize at most 1.5x plain: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
