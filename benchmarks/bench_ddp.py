"""A DistributedDataParallel training step on two GPUs: plain, under PyTorch's CUDA sanitizer
(CSAN, ``TORCH_CUDA_SANITIZER=1``) and under ``ignis run --sanitize``, the contenders in turns.

Each contender is one ``torchrun --nproc_per_node 2`` run of this file's ``--child`` mode (the
sanitizers are per process, and CSAN cannot be switched off once on): a ResNet-18 from
torchvision (an MLP without torchvision) under DDP with AMP, a few warm steps, then timed
steps; rank 0 prints the median step time. ``--rounds`` rounds run every contender once,
round-robin; the medians over rounds are reported, with the ratios to plain and the fraction
of CSAN's added time that Ignis adds.

``--lockstep``: the contenders' process groups all live at once and take turns in blocks of
``--block`` timed steps (one untimed step first), ``--rounds`` rounds, the order reversed every
other round, as ``bench_models.py --lockstep`` does on one GPU: every contender sees the same
drift of the host, and no contender's number rests on one process's state (a process can run
all its steps up to 45% slower than the next one started, the same code: RESULTS, runs AA5-AA6).
Each rank waits for its next block on a named pipe of its own (a host read: nothing of a
waiting contender runs on the GPUs), and rank 0 answers with the block's step times. Reported:
the median step of each contender and the median over rounds of its block's ratio to plain's.

Target (issue 32): the step under ``--sanitize`` at most 1.5x the plain step.
Run on a machine with two GPUs: ``PYTHONPATH=src python3 benchmarks/bench_ddp.py [--rounds 3]``
(``--lockstep --rounds 10 --block 5``: the contenders in lockstep).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

from _steps import lockstep_rounds, median_step_ms, step_times_ms, stop_contenders
from bench_models import build

HERE = os.path.abspath(__file__)


def _ddp_step():
    """This rank's DDP training step (its process group started), and what the model is."""
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
    return rank, build(model, wrap=lambda m: DDP(m)), what


def child(steps: int, warm: int) -> None:
    import torch.distributed as dist
    rank, step, what = _ddp_step()
    ms = median_step_ms(step, steps, warm)
    if rank == 0:
        print(f"BENCH_STEP_MS {ms:.3f}")
        print(f"BENCH_MODEL {what}")
    dist.barrier()
    dist.destroy_process_group()


def serve(pipes: str, warm: int) -> None:
    """A lockstep contender's rank: built and warm, then a block of steps for each line read
    from its pipe (``pipes`` + its rank: the number of timed steps, after one untimed), rank 0
    printing their times in ms; ``end`` stops."""
    import torch
    import torch.distributed as dist
    rank, step, what = _ddp_step()
    for _ in range(max(1, warm)):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(f"BENCH_MODEL {what}", flush=True)
        print("BENCH_READY", flush=True)
    with open(f"{pipes}{rank}") as ctl:
        for line in ctl:
            if line.strip() == "end":
                break
            times = step_times_ms(step, int(line), 1)
            if rank == 0:
                print("BENCH_BLOCK " + " ".join(f"{x:.4f}" for x in times), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(name: str, args: list[str]) -> tuple[list[str], dict]:
    """The torchrun command line and environment of contender ``name`` running this file."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               OMP_NUM_THREADS="1")
    env.pop("TORCH_CUDA_SANITIZER", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master-port", str(_port())]
    if name == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    if name == "ignis --sanitize":
        cmd += ["-m", "ignis", "run", "--sanitize"]
    return cmd + [HERE, *args], env


def contender(name: str, steps: int, warm: int) -> tuple[float, str]:
    cmd, env = _command(name, ["--child", "--steps", str(steps), "--warm", str(warm)])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    text = p.stdout + p.stderr
    m = re.search(r"BENCH_STEP_MS (\S+)", text)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{name} failed (exit {p.returncode}):\n{text[-3000:]}")
    model = re.search(r"BENCH_MODEL (.*)", text)
    if name == "ignis --sanitize" and "no problems found" not in text:
        print(f"warning: ignis reported problems on the benchmark's correct program:\n{text[-3000:]}")
    return float(m.group(1)), model.group(1) if model else "?"


def _expect(p: subprocess.Popen, prefix: str, name: str, err) -> str:
    """The next line of contender ``name``'s rank 0 that starts with ``prefix`` (the launcher's
    own lines passed over); SystemExit with its output where it ended instead."""
    while True:
        line = p.stdout.readline()
        if not line:
            p.wait(timeout=60)
            raise SystemExit(f"{name} ended (exit {p.returncode}) waiting for {prefix}:\n{err()}")
        if line.startswith(prefix):
            return line


def lockstep(names: list[str], rounds: int, block: int, warm: int) -> tuple[dict, dict, str]:
    """The contenders in lockstep (see the module): per contender, its step times and its
    per-round ratios to plain's block; and what the model is."""
    procs, errs, pipes = {}, {}, {}
    tmp = tempfile.mkdtemp(prefix="bench_ddp_")
    model = "?"
    try:
        for i, n in enumerate(names):
            prefix = os.path.join(tmp, f"c{i}.rank")
            ends = []
            for rank in range(2):
                os.mkfifo(f"{prefix}{rank}")
                ends.append(os.open(f"{prefix}{rank}", os.O_RDWR))  # (read-write: opening never blocks)
            pipes[n] = ends
            cmd, env = _command(n, ["--serve", prefix, "--warm", str(warm if n != "csan" else 2)])
            errs[n] = tempfile.TemporaryFile("w+")  # (a file: nobody reads it while the blocks run)
            procs[n] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errs[n], text=True, env=env)

        def err_of(n: str):
            def err() -> str:
                errs[n].seek(0)
                return errs[n].read()[-3000:]
            return err
        for n, p in procs.items():
            model = _expect(p, "BENCH_MODEL", n, err_of(n)).split(" ", 1)[1].strip()
            _expect(p, "BENCH_READY", n, err_of(n))

        def run_block(n: str, k: int) -> list[float]:
            for fd in pipes[n]:
                os.write(fd, f"{k}\n".encode())
            return [float(x) for x in _expect(procs[n], "BENCH_BLOCK", n, err_of(n)).split()[1:]]

        def on_round(r: int, med: dict) -> None:
            print(f"round {r}: " + ", ".join(f"{n} {med[n]:.2f} ms" for n in names), flush=True)
        times, ratios = lockstep_rounds(names, rounds, block, run_block, on_round)
        for n, p in procs.items():
            for fd in pipes[n]:
                os.write(fd, b"end\n")
            out, _ = p.communicate(timeout=300)
            text = out + err_of(n)()
            if p.returncode != 0:
                raise SystemExit(f"{n} failed at the end (exit {p.returncode}):\n{text[-3000:]}")
            if n == "ignis --sanitize" and "no problems found" not in text:
                print(f"warning: ignis reported problems on the benchmark's correct program:\n{text[-3000:]}")
        return times, ratios, model
    finally:
        stop_contenders(procs, errs)
        for ends in pipes.values():
            for fd in ends:
                os.close(fd)
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-csan", action="store_true", help="leave CSAN out (it is slow)")
    ap.add_argument("--lockstep", action="store_true", help="the contenders at once, in turns of --block steps")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--serve", default=None, metavar="PIPES", help="(a lockstep contender's rank)")
    args = ap.parse_args()
    if args.rounds < 1 or args.block < 1:
        ap.error("--rounds and --block take a count of at least 1")
    if args.child:
        child(args.steps, args.warm)
        return 0
    if args.serve:
        serve(args.serve, args.warm)
        return 0
    import torch
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    if torch.cuda.device_count() < 2:
        print("bench_ddp: needs two GPUs; skipped")
        return 0
    names = ["plain", "ignis --sanitize"] + ([] if args.no_csan else ["csan"])
    res: dict[str, list[float]] = {n: [] for n in names}
    model = "?"
    ratio: dict[str, float] = {}
    if args.lockstep:
        times, ratios, model = lockstep(names, args.rounds, args.block, args.warm)
        res = {n: [statistics.median(v)] for n, v in times.items()}
        ratio = {n: statistics.median(v) for n, v in ratios.items()}
    for r in range(0 if args.lockstep else args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            ms, model = contender(n, args.steps if n != "csan" else max(5, args.steps // 3), args.warm)
            res[n].append(ms)
            print(f"round {r}: {n}: {ms:.2f} ms/step", flush=True)
    med = {n: statistics.median(v) for n, v in res.items()}
    how = (f"in lockstep, {args.rounds} rounds of blocks of {args.block} steps" if args.lockstep
           else f"medians of {args.rounds} rounds, contenders in turns")
    print(f"\nDDP step on 2x {card} ({model}), torch {torch.__version__}; {how}:")
    for n in names:
        extra = f"  (median of the rounds' ratios {ratio[n]:.2f}x)" if ratio else ""
        print(f"  {n:18s} {med[n]:8.2f} ms   {med[n] / med['plain']:.2f}x plain{extra}")
    x = ratio or {n: med[n] / med["plain"] for n in names}  # (in lockstep, the rounds' ratios)
    if "csan" in x:
        added = (x["ignis --sanitize"] - 1) / (x["csan"] - 1)
        print(f"  ignis adds {added:.3f} of CSAN's added time")
    ok = x["ignis --sanitize"] <= 1.5
    print(f"target: --sanitize at most 1.5x plain: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
