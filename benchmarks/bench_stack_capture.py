"""What one captured stack costs: the ways the sanitizer can take the program's Python stack
at each checked access, at a program's depth (µs per capture, best of rounds).

- ``torch gather_traceback``: PyTorch's C++ capture (what its memory snapshots use);
- ``ignis capture_frames``: Ignis's compiled walker (``ignis.safety.frames``), (code, line)
  pairs of the user's frames, with the instruction-to-line lookups cached.

Twice: with the program's own frames below the capture, then with a library's (a module
registered with ``add_library_dir``, as PyTorch is: its module machinery stands between the
user's code and every op), which the walker passes over to find the user's.
Run: ``PYTHONPATH=src python3 benchmarks/bench_stack_capture.py [--depth N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Callable


def timed(fn: Callable[[], object], n: int = 20000, rounds: int = 7) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def at_depth(depth: int, fn: Callable[[], float]) -> float:
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=20, help="Python frames below the capture (default 20)")
    args = ap.parse_args()
    from ignis.safety.frames import capture_frames
    rows = {"nothing (the loop itself)": lambda: None, "ignis capture_frames": lambda: capture_frames(1)}
    try:
        import torch
        from ignis.torch._frontend import capture_stack
        gather = torch._C._profiler.gather_traceback
        rows["torch gather_traceback"] = lambda: gather(True, False, False)
        rows["ignis.torch capture_stack"] = capture_stack
    except (ImportError, AttributeError):
        pass
    print(f"µs per capture, {args.depth} frames deep (the program's own), best of 7 rounds of 20,000")
    for name, fn in rows.items():
        print(f"  {name:30s} {at_depth(args.depth, lambda: timed(fn)):8.3f}")
    from ignis.safety.frames import add_library_dir
    with tempfile.TemporaryDirectory() as lib:
        with open(os.path.join(lib, "bench_stack_lib.py"), "w") as f:
            f.write("def at_depth(depth, fn):\n    return at_depth(depth - 1, fn) if depth > 0 else fn()\n")
        sys.path.insert(0, lib)
        add_library_dir(lib)
        import bench_stack_lib
        print(f"µs per capture, {args.depth} frames of a library between it and the program's frames")
        for name, fn in rows.items():
            print(f"  {name:30s} {at_depth(3, lambda: bench_stack_lib.at_depth(args.depth, lambda: timed(fn))):8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
