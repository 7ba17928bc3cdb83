"""``ignis load FILE [--device N]``: load a safetensors file onto a device and say what it took.

``add_parser(subparsers)`` adds the command to an argparse sub-parser set;
``run(args)`` executes it and returns the exit status (0; 2 when the file is
missing or not a file; 1 when it cannot be loaded; the reason on stderr). It prints the tensor count,
bytes, time and GB/s, and per-dtype totals; a progress bar goes to stderr for
loads of at least ``BAR_MIN_BYTES`` when stderr is a terminal (``--progress``
forces it, ``--no-progress`` turns it off).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from ..units import format_bytes
from .args import MISSING_FILE_STATUS, file_problem, os_error_text
from .args import ordinal as _ordinal

__all__ = ["add_parser", "run", "BAR_MIN_BYTES"]

BAR_MIN_BYTES = 256 << 20
_BAR_WIDTH = 30


def _fmt(n: float) -> str:
    return format_bytes(n, 2)


class ProgressBar:
    """A one-line progress bar, redrawn at most ten times a second."""

    def __init__(self, out: TextIO, label: str, force: bool | None) -> None:
        self.out = out
        self.label = label
        self.force = force
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if self.force is False or (self.force is None and (total < BAR_MIN_BYTES or not self.out.isatty())):
            return
        now = time.perf_counter()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        frac = done / total if total else 1.0
        filled = int(frac * _BAR_WIDTH)
        rate = done / (now - self.t0) / 1e9 if now > self.t0 else 0.0
        self.out.write(f"\r{self.label} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {frac * 100:5.1f}%  "
                       f"{_fmt(done)} / {_fmt(total)}  {rate:.1f} GB/s")
        self.out.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            self.out.write("\n")
            self.out.flush()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``load`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns its parser."""
    p = subparsers.add_parser(
        "load", help="load a safetensors file onto a device and report the rate",
        description="Load a safetensors file straight into device memory (pinned ring, parallel reads, "
                    "overlapped copies) and print the tensor count, bytes, GB/s and per-dtype totals.")
    p.add_argument("file", help="the .safetensors file")
    p.add_argument("--device", type=_ordinal, default=0, help="device to load onto (default 0)")
    p.add_argument("--separate", action="store_true", help="one allocation per tensor instead of views")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always draw the progress bar on stderr")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="never draw it")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute ``ignis load``; returns the exit status."""
    from .. import IgnisError
    from ..io.load import load_safetensors
    from ..runtime import Device

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    problem = file_problem(args.file)
    if problem:
        err.write(f"ignis load: {problem}\n")
        return MISSING_FILE_STATUS
    bar = ProgressBar(err, "loading", getattr(args, "progress", None))
    try:
        dev = Device(args.device)
        t0 = time.perf_counter()
        try:
            arrays = load_safetensors(args.file, dev, separate=getattr(args, "separate", False), progress=bar)
        finally:
            bar.finish()
        seconds = time.perf_counter() - t0
    except OSError as e:
        err.write(f"ignis load: {os_error_text(e)}\n")
        return 1
    except (IgnisError, ValueError) as e:
        err.write(f"ignis load: error: {e}\n")
        return 1
    total = sum(a.nbytes for a in arrays.values())
    by_dtype: dict[str, list[int]] = {}
    for a in arrays.values():
        row = by_dtype.setdefault(a.dtype.name, [0, 0])
        row[0] += 1
        row[1] += a.nbytes
    rate = total / seconds / 1e9 if seconds > 0 else float("inf")
    out.write(f"loaded {len(arrays)} tensors, {_fmt(total)} ({total} bytes) from {args.file}\n")
    out.write(f"onto device {dev.ordinal} ({dev.name}, {dev.backend.name} backend) in {seconds:.3f} s: "
              f"{rate:.2f} GB/s\n")
    if by_dtype:
        out.write(f"  {'dtype':<14}{'tensors':>8}{'bytes':>16}\n")
        for name, (count, nbytes) in sorted(by_dtype.items(), key=lambda kv: -kv[1][1]):
            out.write(f"  {name:<14}{count:>8}{_fmt(nbytes):>16}\n")
    if not dev.backend.gpu_timings:
        out.write("note: emulated backend: the rate is a host memcpy speed and says nothing about a GPU\n")
    del arrays
    return 0
