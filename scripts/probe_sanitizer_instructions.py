"""Replay one recorded workload of ``benchmarks/bench_sanitizer_core.py`` into the sanitizer,
for an instruction count of its checks (run it under callgrind; exact, so two trees compare
without the host's noise):

    valgrind --tool=callgrind --callgrind-out-file=cg.out \\
        python scripts/probe_sanitizer_instructions.py [recording] [workload] [rounds]
    callgrind_annotate --inclusive=yes cg.out | grep sanitizer

The first round warms (imports, first sights of the streams), and every round starts from a
fresh state (``clear`` and a new enable), so each round repeats the same work; the entry
points' inclusive counts divided by ``rounds + 1`` are one step's instructions.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "benchmarks", "data",
                                                          "torch_sanitizer_models_h100.json.gz")
name = sys.argv[2] if len(sys.argv) > 2 else "resnet step"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2

with gzip.open(path, "rt", encoding="utf-8") as f:
    calls = json.load(f)["workloads"][name]["calls"]

from ignis.safety.sanitizer import pack_items, sanitizer  # noqa: E402

for _ in range(rounds + 1):
    sanitizer.enable("collect")
    sanitizer.clear()
    bound = [(getattr(sanitizer, n), (*a[:3], pack_items(a[3]), *a[4:]) if n == "foreign_access" else a)
             for n, a in calls]
    for fn, args in bound:
        fn(*args)
    found = len(sanitizer.reports)
    sanitizer.disable()
    if found:
        sys.exit(f"{found} report(s) on a correct workload")
ops = sum(1 for n, _ in calls if n == "foreign_access")
print(f"{name}: {len(calls)} calls, {ops} ops, {rounds + 1} rounds")
