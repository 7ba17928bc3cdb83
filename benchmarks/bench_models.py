"""Real models' training steps under the checks, on one GPU, the contenders in turns.

Models (each optional: skipped, saying so, where its package is missing; neither is a
dependency of Ignis):
- ``resnet``: torchvision's ResNet-18, AMP (bf16) with a GradScaler, channels_last, batch 32
  at 64x64, SGD with momentum;
- ``gpt2``: a transformers GPT-2 built from a config (2 layers, 128 wide, random weights,
  nothing downloaded), bf16 autocast, AdamW, batch 8 of 128 tokens.

Contenders, each a process of its own running this file's ``--child`` (the checks are per
process; PyTorch's CSAN cannot be switched off once on): ``plain``; ``csan``
(``TORCH_CUDA_SANITIZER=1``); ``ignis --sanitize`` and ``ignis --guard`` (``ignis run``);
and, with ``--memcheck``, Compute Sanitizer's memcheck over a few steps (the guard's
comparison). ``--rounds`` rounds run every contender once, in turns (the order reversed
every other round); medians over rounds are reported: the step time, its ratio to plain,
the fraction of CSAN's added time Ignis adds, the accesses the sanitizer checks per step and
the host time it adds per access.

Targets (issue 34): on both models ``--sanitize`` at most 1.5x the plain step and at most
0.05 of CSAN's added time; ``--guard`` at most 1.3x.
Run: ``PYTHONPATH=src python3 benchmarks/bench_models.py [--rounds 3] [--models resnet,gpt2] [--memcheck]``.
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
import time

from _steps import median_step_ms

HERE = os.path.abspath(__file__)


def build(name: str, wrap=None):
    """A training step of model ``name`` (``wrap``: what wraps the model, e.g. DDP)."""
    import torch
    import torch.nn as nn
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


def child(name: str, steps: int, warm: int) -> None:
    import torch
    step = build(name)
    step()  # (built and warm before the sanitizer's count starts)
    torch.cuda.synchronize()
    san = None
    if "ignis.safety.sanitizer" in sys.modules:
        from ignis.safety.sanitizer import sanitizer
        san = sanitizer if sanitizer.active else None
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


def available(name: str) -> str | None:
    try:
        if name == "resnet":
            import torchvision  # noqa: F401
        else:
            import transformers  # noqa: F401
    except ImportError as e:
        return f"{name}: skipped ({e})"
    return None


def contender(model: str, who: str, steps: int, warm: int) -> tuple[float, float | None]:
    env = dict(os.environ)
    env.pop("TORCH_CUDA_SANITIZER", None)
    args = [HERE, "--child", model, "--steps", str(steps), "--warm", str(warm)]
    cmd = [sys.executable, *args]
    if who == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    elif who.startswith("ignis"):
        cmd = [sys.executable, "-m", "ignis", "run", who.split()[1], *args]
    elif who == "memcheck":
        cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        cmd = [cs, "--tool", "memcheck", "--print-limit", "10", sys.executable, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    text = p.stdout + p.stderr
    m = re.search(r"BENCH_STEP_MS (\S+)", text)
    if p.returncode != 0 or m is None:
        raise SystemExit(f"{model} / {who} failed (exit {p.returncode}):\n{text[-3000:]}")
    if who.startswith("ignis") and "no problems found" not in text:
        print(f"warning: {who} reported problems on {model}, a correct program:\n{text[-3000:]}")
    acc = re.search(r"BENCH_ACCESSES (\S+)", text)
    return float(m.group(1)), (float(acc.group(1)) if acc else None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default=None, metavar="MODEL")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="resnet,gpt2")
    ap.add_argument("--no-csan", action="store_true")
    ap.add_argument("--memcheck", action="store_true", help="also Compute Sanitizer's memcheck (a few steps)")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps, args.warm)
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_models: needs a GPU; skipped")
        return 0
    card = torch.cuda.get_device_name(0)
    whos = ["plain", "ignis --sanitize", "ignis --guard"] + ([] if args.no_csan else ["csan"])
    print(f"card: {card}, torch {torch.__version__}; medians of {args.rounds} round(s), contenders in turns")
    for model in args.models.split(","):
        why = available(model)
        if why:
            print(why)
            continue
        res: dict[str, list[float]] = {w: [] for w in whos}
        acc: list[float] = []
        for r in range(args.rounds):
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
            print(f"  {w:18s} {med[w]:9.2f} ms  {med[w] / plain:6.2f}x plain")
        if acc:
            a = statistics.median(acc)
            print(f"  --sanitize checks {a:.0f} accesses per step: {(med['ignis --sanitize'] - plain) * 1e3 / a:.2f} "
                  "µs of host time added per access")
        ok_s = med["ignis --sanitize"] <= 1.5 * plain
        line = f"  targets: --sanitize at most 1.5x: {'met' if ok_s else 'NOT met'}"
        if "csan" in med:
            frac = (med["ignis --sanitize"] - plain) / (med["csan"] - plain)
            line += f"; {frac:.3f} of CSAN's added time (at most 0.05: {'met' if frac <= 0.05 else 'NOT met'})"
        line += f"; --guard at most 1.3x: {'met' if med['ignis --guard'] <= 1.3 * plain else 'NOT met'}"
        print(line)
        if args.memcheck:
            ms, _ = contender(model, "memcheck", 3, 1)
            print(f"  compute-sanitizer memcheck: {ms:.2f} ms/step ({ms / plain:.1f}x plain; 3 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
