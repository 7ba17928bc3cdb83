#!/usr/bin/env python3
"""See the memory: statistics with peaks, a summary, a snapshot for PyTorch's
memory viewer, and a timeline plot.

A small "training loop" allocates tagged arrays (weights, activations that
come and go, a growing cache) while statistics and allocation history are
recorded. Then the example prints the peaks from ``ig.memory_stats()``,
the table of ``ig.memory_summary()``, and writes:

- ``ignis-telemetry-snapshot.pickle``: open it by dragging it onto
  https://pytorch.org/memory_viz (the same format ``torch.cuda.memory._dump_snapshot``
  writes), or summarize it with ``ignis snapshot summary FILE``;
- ``ignis-telemetry-timeline.png``: memory in use over time, stacked by tag
  (needs matplotlib, the ``plot`` extra: ``pip install 'ignis[plot]'``;
  without it the plot is skipped with a message). ``ignis snapshot plot FILE``
  draws the same from the pickle.

Run from the repository root, on either backend::

    .venv/bin/python examples/telemetry_snapshot.py

The files go to ``ignis-telemetry`` in the system's temporary directory, or
to the folder given as the first argument. It prints where they are and
``telemetry OK`` (exit status 0).
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile

import ignis as ig
from ignis.telemetry.stats import format_bytes


def train(dev: ig.Device, steps: int = 6) -> None:
    weights = [ig.zeros((256, 256), "float32", device=dev, tag="weights") for _ in range(4)]
    cache = []
    for step in range(steps):
        acts = [ig.empty((64, 1024), "float32", device=dev, tag="activations") for _ in range(3)]
        for a in acts:
            a.fill_(float(step))
        cache.append(ig.zeros((16, 1024), "float32", device=dev, tag="kv_cache"))
        for a in acts:           # activations go back to the pool every step
            a.free()
    dev.synchronize()
    for a in weights + cache:
        a.free()


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(), "ignis-telemetry")
    os.makedirs(out_dir, exist_ok=True)
    dev = ig.Device(0)

    ig.telemetry.enable_stats()                       # peaks and totals from now on
    ig.reset_peak_stats(dev)
    ig.record_memory_history(True, clear_history=True)  # every allocation event, with Python frames
    try:
        train(dev)
        stats = ig.memory_stats(dev)
        print(f"peak allocated {format_bytes(stats['allocated_bytes.all.peak'])}, "
              f"now {format_bytes(stats['allocated_bytes.all.current'])}; "
              f"peak of tag 'activations' {format_bytes(stats['allocated_bytes.tag:activations.peak'])}; "
              f"{stats['allocation.all.allocated']} allocations in all")
        print(ig.memory_summary(dev))

        snap = ig.snapshot(dev)
        path = ig.dump_snapshot(os.path.join(out_dir, "ignis-telemetry-snapshot.pickle"), dev)
        trace = snap["device_traces"][dev.ordinal]
        actions = sorted({e["action"] for e in trace})
        with open(path, "rb") as f:
            ok = "segments" in pickle.load(f)
        print(f"snapshot: {path}")
        print(f"  {len(snap['segments'])} segment(s), {len(trace)} trace entries ({', '.join(actions)}); "
              "drag it onto https://pytorch.org/memory_viz")

        png = os.path.join(out_dir, "ignis-telemetry-timeline.png")
        try:
            info = ig.plot_timeline(snap, png, by="tag", device=dev.ordinal, title="example: memory by tag")
        except ImportError as e:
            print(f"timeline plot: skipped ({e})")
        else:
            print(f"timeline plot: {info['path']} (peak in use {format_bytes(info['peak_bytes'])}; "
                  f"tags {', '.join(info['groups'])})")
    finally:
        ig.record_memory_history(False)
        ig.telemetry.disable_stats()
    print("telemetry OK" if ok else "telemetry FAILED: the snapshot file has no segments")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
