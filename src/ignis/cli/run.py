"""``ignis run``: run a user's script under Ignis's checks and report at exit.

- ``--sanitize``: the sanitizer in collect mode, for Ignis's own tracked uses
  and, once the script imports torch, for every PyTorch op on CUDA tensors
  (``ignis.torch``). The script's ordering policy is kept (``auto`` unless it
  sets one), so it computes what it computes without the flag;
  ``--ordering manual`` makes Ignis's tracked uses queue no waits, so the
  sanitizer checks the script's own synchronization instead. Reports are
  grouped by the pair of sites, with a count, and show the script's frames.
- ``--guard``: every device's current resource becomes a debug guard over a
  fresh pool (canaries, poison, quarantine; ``ignis.torch._guard``), and so
  does PyTorch's and CuPy's allocator once the script imports them; checked at
  synchronize points, by ``ignis.torch.check()`` and at exit.
- ``--leaks``: every array is tracked with its allocation site; arrays still
  alive once the script's globals are gone are reported as leaks.

Under ``torchrun`` or ``ignis launch`` (``WORLD_SIZE`` above 1) the ranks'
reports are merged into one (``ignis.cli.ranks``): each block once, prefixed
with its ranks, and a line per rank; ``--report-dir`` keeps each rank's whole
report in a file of its own.

Exit status: the script's own if it failed, else 1 when any problem was
found, else 0. ``add_parser(subparsers)`` adds the command; ``run_script`` runs
a script under the checks (the command calls it).
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import runpy
import sys
import traceback
from typing import Any, TextIO

from ..units import format_bytes as _fmt_bytes
from .ranks import Report, deliver

__all__ = ["run_script", "add_parser"]


def run_script(script: str, argv: list[str], *, sanitize: bool = False, guard: bool = False,
               leaks: bool = False, ordering: str | None = None, leak_threshold: float = 0.0,
               out: TextIO | None = None, report_dir: str | None = None) -> int:
    """Run ``script`` as ``__main__`` under the checks asked for, then print the report
    (see the module's description for what each check does).

    Args:
        script: the path of the Python script.
        argv: the script's arguments (``sys.argv[1:]`` while it runs).
        sanitize: run the sanitizer in collect mode (Ignis's tracked uses, and PyTorch's ops
            once the script imports torch).
        guard: make every device's current resource, and PyTorch's and CuPy's allocator, a
            debug guard.
        leaks: track every array with its allocation site and report those still alive.
        ordering: the ordering policy to set first (``"auto"`` / ``"manual"``); None keeps
            the script's.
        leak_threshold: with ``leaks``, report arrays older than this many seconds.
        out: where the report (and the script's traceback, if it fails) is written (default:
            ``sys.stderr`` as it is at the call).
        report_dir: also write the report to a file in this folder (``rank<R>.txt`` for a rank
            of a distributed run, else ``report.txt``).

    Returns:
        The exit status: the script's own if it failed, else 1 when a problem was
        found, else 0; 2 when ``script`` is not a file.
    """
    import ignis as ig

    out = sys.stderr if out is None else out
    if not os.path.isfile(script):
        print(f"ignis run: no such script: {script}", file=out)
        return 2
    launcher = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.isfile(launcher) and os.path.abspath(script) != launcher:
        from ..safety.frames import add_library_dir
        add_library_dir(launcher, machinery=True)  # the `ignis` command's own file is not the user's code
    problems = 0
    tguard: Any = None
    if guard:
        # One guard per device (canaries, poison, quarantine over a fresh pool), the current
        # resource of Ignis there and, once the script imports them, PyTorch's and CuPy's allocator.
        from ignis.torch import _guard as tguard
        for i in range(ig.device_count()):
            tguard.guard_resource(i)
        tguard.install_on_import()
    if leaks:
        ig.contract.track_all = True
        ig.contract.capture_sites = True
    if sanitize:
        ig.sanitizer.enable("collect")
        from ignis.torch import _hook
        _hook.enable_on_import("collect")
    if ordering:
        ig.set_ordering(ordering)

    status = 0
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    left: Any = None
    raised: list[BaseException] = []  # the error Ignis's checks raised to the script: a problem found
    try:
        left = runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # the script's own failure, reported as such
        traceback.print_exc(file=out)
        status = 1
        if isinstance(e, ig.IgnisError):
            raised.append(e)
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    if sanitize:
        _settle_torch()  # the script is over: what its globals free now cannot race its own work
    left = None
    gc.collect()
    from ..array.nvarray import drain_deferred
    drain_deferred()  # what the collector freed goes back now, before the figures are read

    report = Report()
    problems += len(raised)
    if raised and not sanitize:  # the sanitizer's summary shows it with its own
        e = raised[0]
        report.add(f"ignis run: the script stopped on an error Ignis's checks raised (a problem found): "
                   f"{type(e).__name__}: {e}", problem=True)
    if tguard is not None:
        buf = io.StringIO()
        problems += tguard.finish(buf)
        report.add(buf.getvalue(), problem=bool(tguard.reports()))
    if sanitize:
        reports = ig.sanitizer.reports()
        problems += len(reports)
        lines = ig.sanitizer.sanitizer.summary(raised).split("\n--- ")
        report.add(lines[0])
        for block in lines[1:]:
            report.add("--- " + block, problem=True)
        buf = io.StringIO()
        _stop_torch(buf)
        report.add(buf.getvalue())
        ig.sanitizer.sanitizer.clear()
        ig.sanitizer.disable()
    if leaks:
        rows = ig.contract.audit(older_than=leak_threshold)
        live = [r for r in rows if not r["freed"]]
        if live:
            problems += len(live)
            lines = [f"leaks: {len(live)} array(s) still alive after the script finished:"]
            for r in live:
                lines.append(f"  NvArray#{r['array_id']} {list(r['shape'])} {r['dtype']} {_fmt_bytes(r['nbytes'])} "
                             f"owner={r['owner']} tag={r['tag']!r} age={r['age_ms']} ms")
                if r.get("site"):
                    lines.append("    allocated at:\n" + "\n".join("    " + ln for ln in r["site"].splitlines()))
            report.add("\n".join(lines), problem=True)
        else:
            held = {i: ig.get_current_resource(i).memory_numbers()["live_bytes"] for i in range(ig.device_count())}
            held = {i: n for i, n in held.items() if n}
            if held:  # no array, yet memory is still allocated: blocks taken from a resource directly
                problems += 1
                where = ", ".join(f"{_fmt_bytes(n)} on device {i}" for i, n in held.items())
                report.add(f"leaks: no array is still alive, but {where} are still allocated outside arrays "
                           "(blocks from resource.allocate() never deallocated)", problem=True)
            else:
                report.add("leaks: none")
    report.add(_summary(ig))
    report.problems = problems
    deliver(report, out, report_dir)
    if status:
        return status
    return 1 if problems else 0


def _settle_torch() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _stop_torch(out: TextIO) -> None:
    import ignis.torch as igt
    from ignis.torch import _hook
    _hook.remove()
    try:
        igt.disable()
    except RuntimeError as e:  # the script left its own dispatch mode entered above ours
        print(f"ignis run: {e}", file=out)


def _summary(ig: Any) -> str:
    lines = ["memory:"]
    for i in range(ig.device_count()):
        mr = ig.get_current_resource(i)
        nums = mr.memory_numbers()
        lines.append(f"  device {i}: {type(mr).__name__} live {_fmt_bytes(nums['live_bytes'])}, "
                     f"cached {_fmt_bytes(nums['cached_bytes'])}")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------
def _command(args: argparse.Namespace) -> int:
    """``ignis run``: ``run_script`` with the parsed flags."""
    return run_script(args.script, args.args, sanitize=args.sanitize, guard=args.guard, leaks=args.leaks,
                      ordering=args.ordering, leak_threshold=args.leak_threshold, report_dir=args.report_dir)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns its parser."""
    run = subparsers.add_parser("run", help="run a Python script under the sanitizer, the debug guard and/or "
                                            "the leak audit",
                                description="Run SCRIPT with Ignis's checks on and print their reports at exit. "
                                            "The exit status is non-zero when a problem was found.")
    run.add_argument("--sanitize", action="store_true",
                     help="check cross-stream races, uses after free, reuse races and uninitialized reads, in "
                          "Ignis's tracked uses and in PyTorch ops on CUDA tensors (the script's ordering "
                          "policy is kept)")
    run.add_argument("--guard", action="store_true",
                     help="canaries, poison and quarantine on every allocation (DebugGuardResource)")
    run.add_argument("--leaks", action="store_true", help="report arrays still alive at exit, with their sites")
    run.add_argument("--ordering", choices=("auto", "manual"), default=None,
                     help="ordering policy for Ignis's tracked uses (default: the script's own; 'manual' "
                          "with --sanitize checks the script's synchronization instead of supplying it)")
    run.add_argument("--leak-threshold", type=float, default=0.0, metavar="SECONDS",
                     help="only report arrays older than this (default 0)")
    run.add_argument("--report-dir", default=None, metavar="DIR",
                     help="also write the report to DIR (rank<R>.txt for each rank of a distributed run)")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.set_defaults(func=_command)
    return run
