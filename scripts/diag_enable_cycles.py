"""Checking turned on and off around a few steps of a correct program, many times (a diagnostic):
memory allocated while checking was off is unknown to the sanitizer until its first access after
checking starts again, the case of a program that calls ``ignis.torch.enable()`` once its model
is built. A correct program must stay silent however often that happens.

    PYTHONPATH=src python3 scripts/diag_enable_cycles.py [model] [cycles] [steps]

``model``: a model of ``benchmarks/bench_models.py`` (default ``resnet-ddp1``: ResNet-18 under
DDP on a process group of one rank). Prints the reports found, by kind and pair of sites, and
the cycles they came in. ``DIAG_SRC=DIR``: import Ignis from DIR (another tree's src, built).
"""

from __future__ import annotations

import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("DIAG_SRC") or os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))

from bench_models import build  # noqa: E402


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else "resnet-ddp1"
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch

    import ignis
    import ignis.torch
    from ignis.safety.sanitizer import sanitizer
    step = build(model)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    seen: dict[str, list[int]] = collections.defaultdict(list)
    first: dict[str, str] = {}
    for c in range(cycles):
        ignis.torch.enable("collect")
        try:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            for r in sanitizer.reports:
                text = str(r)
                key = text.splitlines()[0][:160]
                seen[key].append(c)
                first.setdefault(key, text)
        finally:
            ignis.torch.disable()
    where = os.path.dirname(ignis.__file__)
    print(f"{model}: {cycles} cycles of {steps} steps, ignis from {where}: "
          f"{sum(len(v) for v in seen.values())} reports in {len({c for v in seen.values() for c in v})} cycles")
    for key, cs in seen.items():
        print(f"  {len(cs)}x (cycles {cs[:10]}): {first[key][:1500]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
