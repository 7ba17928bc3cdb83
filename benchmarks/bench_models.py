"""Real models' training steps under the checks, on one GPU, the contenders in turns.

Models (each optional: skipped, saying so, where its package is missing; neither is a
dependency of Ignis):
- ``resnet``: torchvision's ResNet-18, AMP (bf16) with a GradScaler, channels_last, batch 32
  at 64x64, SGD with momentum;
- ``gpt2``: a transformers GPT-2 built from a config (2 layers, 128 wide, random weights,
  nothing downloaded), bf16 autocast, AdamW, batch 8 of 128 tokens;
- ``resnet-ddp1``, ``gpt2-ddp1``: either under DistributedDataParallel on an NCCL process group
  of this process alone (its reducer, buckets, buffer broadcasts and all-reduces, on one GPU).

Contenders, each a process of its own running this file's ``--child`` (the checks are per
process; PyTorch's CSAN cannot be switched off once on): ``plain``; ``csan``
(``TORCH_CUDA_SANITIZER=1``); ``ignis --sanitize`` and ``ignis --guard`` (``ignis run``);
and, with ``--memcheck``, Compute Sanitizer's memcheck over a few steps (the guard's
comparison). ``--rounds`` rounds run every contender once, in turns (the order reversed
every other round); medians over rounds are reported: the step time, its ratio to plain,
the fraction of CSAN's added time Ignis adds, the accesses the sanitizer checks per step and
the host time it adds per access.

``--lockstep``: the contenders' processes all live at once and take turns in short blocks of
steps (``--block`` timed steps after one untimed, over ``--rounds`` rounds, the order reversed
every other round): on a shared host whose speed drifts over seconds, every contender sees the
same drift, where a process each in turn sees its own. Reported then: each contender's median
step, and the median over rounds of its block's ratio to the plain block of the same round.

``--variant K=V[,K=V]`` (repeatable) adds a diagnostic contender: the guard with those options
changed (``scripts/diag_guard_variants.py``; ``--variant -`` is the guard's defaults run the same
way, the variants' fair anchor).

Targets (issue 34): on both models ``--sanitize`` at most 1.5x the plain step and at most
0.05 of CSAN's added time; ``--guard`` at most 1.3x.
Run: ``PYTHONPATH=src python3 benchmarks/bench_models.py [--rounds 3] [--models resnet,gpt2] [--memcheck]``
or ``... --lockstep [--rounds 20] [--block 5]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _steps import lockstep_rounds, median_step_ms, step_times_ms, stop_contenders

HERE = os.path.abspath(__file__)


def _ddp_of_one():
    """DistributedDataParallel over a process group of this process alone (NCCL, one rank): its
    reducer, bucket views and all-reduces as on many ranks, on one GPU."""
    import socket

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
    return lambda m: DDP(m)


def build(name: str, wrap=None):
    """A training step of model ``name`` (``wrap``: what wraps the model, e.g. DDP). A name
    ending in ``-ddp1`` is the model under DDP on a process group of one rank."""
    import torch
    import torch.nn as nn
    if name.endswith("-ddp1"):
        name, wrap = name[:-len("-ddp1")], _ddp_of_one()
    torch.manual_seed(0)
    wrap = wrap or (lambda m: m)
    if name == "resnet":
        import torchvision
        model = wrap(torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last))
        x = torch.randn(32, 3, 64, 64, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 100, (32,), device="cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler()
        loss_fn = nn.CrossEntropyLoss()

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return step
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=128)
        model = wrap(GPT2LMHeadModel(cfg).cuda())
        ids = torch.randint(0, 1024, (8, 128), device="cuda")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
        return step
    raise SystemExit(f"unknown model {name!r}")


def _active_sanitizer():
    """Ignis's sanitizer where ``ignis run --sanitize`` turned it on in this process, else None."""
    if "ignis.safety.sanitizer" not in sys.modules:
        return None
    from ignis.safety.sanitizer import sanitizer
    return sanitizer if sanitizer.active else None


def _warn_if_reported(model: str, who: str, text: str) -> None:
    """Say so where an Ignis contender's output reports problems on a model (a correct program)."""
    if who.startswith("ignis") and "no problems found" not in text:
        print(f"warning: {who} reported problems on {model}, a correct program:\n{text[-3000:]}")


def child(name: str, steps: int, warm: int) -> None:
    import torch
    step = build(name)
    step()  # (built and warm before the sanitizer's count starts)
    torch.cuda.synchronize()
    san = _active_sanitizer()
    before = san.checked_foreign if san is not None else 0
    gc_count, gc_time = [0, 0, 0], [0.0]  # the cyclic collector's runs in the steps, and their time
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_count[info["generation"]] += 1
            gc_time[0] += time.perf_counter() - started[0]
    gc.callbacks.append(on_gc)
    try:
        print(f"BENCH_STEP_MS {median_step_ms(step, steps, max(0, warm - 1)):.3f}")
    finally:
        gc.callbacks.remove(on_gc)
    n = steps + max(0, warm - 1)
    print(f"BENCH_GC collections {gc_count[0]}/{gc_count[1]}/{gc_count[2]} (generations 0/1/2) in {n} steps, "
          f"{gc_time[0] / n * 1e3:.3f} ms a step")
    if san is not None:
        print(f"BENCH_ACCESSES {(san.checked_foreign - before) / n:.1f}")


def serve(name: str, warm: int) -> None:
    """A lockstep contender: built and warm, then a block of steps for each line on stdin (the
    number of timed steps; one untimed step first, its caches cold after the others' turns),
    answering with their times in ms; ``end`` answers with the accesses checked per step."""
    import torch
    step = build(name)
    for _ in range(max(1, warm)):
        step()
    torch.cuda.synchronize()
    san = _active_sanitizer()
    before, timed = (san.checked_foreign if san is not None else 0), 0
    print("BENCH_READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "end":
            break
        n = int(line)
        times = step_times_ms(step, n, 1)
        timed += n + 1
        print("BENCH_BLOCK " + " ".join(f"{x:.4f}" for x in times), flush=True)
    acc = (san.checked_foreign - before) / timed if san is not None and timed else -1
    print(f"BENCH_END {acc:.1f}", flush=True)


def _command(model: str, who: str, args: list[str]) -> tuple[list[str], dict]:
    """The command line and environment of contender ``who`` running this file with ``args``."""
    env = dict(os.environ)
    env.pop("TORCH_CUDA_SANITIZER", None)
    cmd = [sys.executable, HERE, *args]
    if who == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    elif who.startswith("ignis"):  # "ignis --sanitize [NAME=VALUE ...]": the variables set for it
        words = who.split()
        env.update(w.split("=", 1) for w in words[2:])
        cmd = [sys.executable, "-m", "ignis", "run", words[1], HERE, *args]
    elif who.startswith("guard:"):  # the guard with options changed (scripts/diag_guard_variants.py)
        tool = os.path.join(os.path.dirname(HERE), "..", "scripts", "diag_guard_variants.py")
        cmd = [sys.executable, tool, who[len("guard:"):] or "-", HERE, *args]
    elif who == "memcheck":
        cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        cmd = [cs, "--tool", "memcheck", "--print-limit", "10", sys.executable, HERE, *args]
    return cmd, env


def lockstep(model: str, whos: list[str], rounds: int, block: int, warm: int) -> tuple[dict, dict, float | None]:
    """The contenders of ``model`` in lockstep (see the module): per contender, its step times
    and its per-round ratios to plain's block; and the accesses the sanitizer checked per step."""
    procs, errs = {}, {}

    def err(w: str) -> str:  # (a file, not a pipe: nobody reads it while the blocks run)
        errs[w].seek(0)
        return errs[w].read()[-3000:]
    try:
        for w in whos:
            cmd, env = _command(model, w, ["--serve", model, "--warm", str(warm if w != "csan" else 2)])
            errs[w] = tempfile.TemporaryFile("w+")
            procs[w] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errs[w],
                                        text=True, env=env)
        for w, p in procs.items():
            line = p.stdout.readline()
            if not line.startswith("BENCH_READY"):
                p.kill()
                raise SystemExit(f"{model} / {w} failed to start:\n{line}{err(w)}")

        def run_block(w: str, n: int) -> list[float]:
            p = procs[w]
            p.stdin.write(f"{n}\n")
            p.stdin.flush()
            line = p.stdout.readline()
            if not line.startswith("BENCH_BLOCK"):
                raise SystemExit(f"{model} / {w} failed in a block:\n{line}{err(w)}")
            return [float(x) for x in line.split()[1:]]
        times, ratios = lockstep_rounds(whos, rounds, block, run_block)
        acc = None
        for w, p in procs.items():
            out, _ = p.communicate("end\n", timeout=600)
            text = out + err(w)
            m = re.search(r"BENCH_END (\S+)", out)
            if p.returncode != 0 or m is None:
                raise SystemExit(f"{model} / {w} failed at the end (exit {p.returncode}):\n{text[-3000:]}")
            _warn_if_reported(model, w, text)
            if w == "ignis --sanitize" and float(m.group(1)) >= 0:
                acc = float(m.group(1))
        return times, ratios, acc
    finally:
        stop_contenders(procs, errs)


def available(name: str) -> str | None:
    try:
        if name.startswith("resnet"):
            import torchvision  # noqa: F401
        else:
            import transformers  # noqa: F401
    except ImportError as e:
        return f"{name}: skipped ({e})"
    return None


def contender(model: str, who: str, steps: int, warm: int) -> tuple[float, float | None]:
    cmd, env = _command(model, who, ["--child", model, "--steps", str(steps), "--warm", str(warm)])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    text = p.stdout + p.stderr
    m = re.search(r"BENCH_STEP_MS (\S+)", text)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{model} / {who} failed (exit {p.returncode}):\n{text[-3000:]}")
    _warn_if_reported(model, who, text)
    acc = re.search(r"BENCH_ACCESSES (\S+)", text)
    return float(m.group(1)), (float(acc.group(1)) if acc else None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None, metavar="MODEL")
    ap.add_argument("--serve", default=None, metavar="MODEL", help="(a lockstep contender)")
    ap.add_argument("--lockstep", action="store_true", help="the contenders at once, in turns of --block steps")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="resnet,gpt2")
    ap.add_argument("--no-csan", action="store_true")
    ap.add_argument("--contenders", default=None, metavar="A,B",
                    help="only these contenders (plain is always one), e.g. 'ignis --sanitize'; an Ignis "
                         "contender may set variables: 'ignis --sanitize IGNIS_OBSERVER_BATCH=1'")
    ap.add_argument("--memcheck", action="store_true", help="also Compute Sanitizer's memcheck (a few steps)")
    ap.add_argument("--variant", action="append", default=[], metavar="K=V[,K=V]",
                    help="also the guard with these options changed (a diagnostic contender; repeatable)")
    args = ap.parse_args()
    if args.rounds < 1 or args.block < 1:
        ap.error("--rounds and --block take a count of at least 1")
    if args.child:
        child(args.child, args.steps, args.warm)
        return 0
    if args.serve:
        serve(args.serve, args.warm)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_models: needs a GPU; skipped")
        return 0
    card = torch.cuda.get_device_name(0)
    whos = (["plain", "ignis --sanitize", "ignis --guard"] + ([] if args.no_csan else ["csan"])
            + [f"guard:{v}" for v in args.variant])
    if args.contenders:
        whos = ["plain"] + [w for w in args.contenders.split(",") if w != "plain"]
    how = (f"in lockstep: {args.rounds} rounds of blocks of {args.block} steps" if args.lockstep
           else f"medians of {args.rounds} round(s), contenders in turns")
    print(f"card: {card}, torch {torch.__version__}; {how}")
    for model in args.models.split(","):
        why = available(model)
        if why:
            print(why)
            continue
        res: dict[str, list[float]] = {w: [] for w in whos}
        acc: list[float] = []
        ratio: dict[str, float] = {}
        if args.lockstep:
            times, ratios, a = lockstep(model, whos, args.rounds, args.block, args.warm)
            res = {w: [statistics.median(v)] for w, v in times.items()}
            ratio = {w: statistics.median(v) for w, v in ratios.items()}
            if a is not None:
                acc.append(a)
        for r in range(0 if args.lockstep else args.rounds):
            for w in (whos if r % 2 == 0 else whos[::-1]):
                steps = args.steps if w != "csan" else max(4, args.steps // 4)
                ms, a = contender(model, w, steps, args.warm if w != "csan" else 2)
                res[w].append(ms)
                if a is not None and w == "ignis --sanitize":
                    acc.append(a)
                print(f"  {model} round {r}: {w}: {ms:.2f} ms/step", flush=True)
        med = {w: statistics.median(v) for w, v in res.items()}
        plain = med["plain"]
        print(f"{model}:")
        for w in whos:
            extra = f"  (median of the rounds' ratios {ratio[w]:.2f}x)" if ratio else ""
            print(f"  {w:18s} {med[w]:9.2f} ms  {med[w] / plain:6.2f}x plain{extra}")
        if acc:
            a = statistics.median(acc)
            print(f"  --sanitize checks {a:.0f} accesses per step: {(med['ignis --sanitize'] - plain) * 1e3 / a:.2f} "
                  "µs of host time added per access")
        x = ratio or {w: med[w] / plain for w in whos}  # (in lockstep, the rounds' ratios)
        line = []
        if "ignis --sanitize" in x:
            line.append(f"--sanitize at most 1.5x: {'met' if x['ignis --sanitize'] <= 1.5 else 'NOT met'}")
            if "csan" in x:
                frac = (x["ignis --sanitize"] - 1) / (x["csan"] - 1)
                line.append(f"{frac:.3f} of CSAN's added time (at most 0.05: {'met' if frac <= 0.05 else 'NOT met'})")
        if "ignis --guard" in x:
            line.append(f"--guard at most 1.3x: {'met' if x['ignis --guard'] <= 1.3 else 'NOT met'}")
        print("  targets: " + "; ".join(line))
        if args.memcheck:
            ms, _ = contender(model, "memcheck", 3, 1)
            print(f"  compute-sanitizer memcheck: {ms:.2f} ms/step ({ms / plain:.1f}x plain; 3 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
