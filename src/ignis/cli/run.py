"""``ignis run``: run a user's script (or a module, as ``python -m`` does) under Ignis's
checks and report at exit.

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
- ``--leaks``: every array is tracked with its allocation site. At the end,
  arrays still alive once the script's globals are gone are leaks (problems);
  arrays the globals still held are listed as such (freed with them, not
  problems). Both are grouped by allocation site.

(``ignis.cli.checks`` turns them on and off; the pytest plugin uses the same.)

The script runs as Python runs it: ``__main__`` with an absolute ``__file__``,
``sys.argv`` as given, its folder first on ``sys.path``; ``-m MODULE`` runs a
module as ``python -m`` does (``runpy.run_module`` with ``alter_sys``: the
module's file as ``sys.argv[0]``, the current folder first on ``sys.path``). A
script that does not compile is reported as Python reports it, with no report
block (nothing ran); tracebacks start at the script's own frames.

Under ``torchrun`` or ``ignis launch`` (``WORLD_SIZE`` above 1) the ranks'
reports are merged into one (``ignis.cli.ranks``): each block once, prefixed
with its ranks, and a line per rank; ``--report-dir`` keeps each rank's whole
report in a file of its own.

Exit status: the script's own if it failed (130 for ``KeyboardInterrupt``, as
Python), else 1 when any problem was found, else 0; 2 when there is nothing
to run (a missing script or module). ``add_parser(subparsers)`` adds the command;
``run_script`` and ``run_module`` run a script or a module under the checks (the
command calls them).
"""

from __future__ import annotations

import argparse
import builtins
import gc
import io
import os
import runpy
import sys
import traceback
import types
import zipfile
from typing import Any, Callable, TextIO

from ..units import format_bytes as _fmt_bytes
from .args import MISSING_FILE_STATUS, file_problem
from .checks import Checks
from .ranks import Report, deliver

__all__ = ["run_script", "run_module", "add_parser"]

INTERRUPTED_STATUS = 130  # KeyboardInterrupt, as Python (and a shell: 128 + SIGINT)


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
        The exit status: the script's own if it failed (130 for ``KeyboardInterrupt``), else
        1 when a problem was found, else 0; 2 when ``script`` is not a file (nor, as Python
        also runs, a folder or zip archive with a ``__main__.py``); 1 when it does not
        compile (reported as Python reports it, with no report: nothing ran).
    """
    out = sys.stderr if out is None else out
    path = os.path.abspath(script)
    checks = Checks(sanitize=sanitize, guard=guard, leaks=leaks, ordering=ordering)
    if os.path.isfile(os.path.join(path, "__main__.py")) or (os.path.isfile(path) and zipfile.is_zipfile(path)):
        # a folder or a zip archive with a __main__.py: Python runs that, and so does this
        return _run(lambda: runpy.run_path(path, run_name="__main__"), [script, *argv], path, checks,
                    leak_threshold, out, report_dir)
    problem = file_problem(script, "script")
    if problem:
        if os.path.isdir(script):
            problem = f"{script} is a directory with no __main__.py, not a script"
        print(f"ignis run: {problem}", file=out)
        return MISSING_FILE_STATUS
    try:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        traceback.print_exception(type(e), e, None, file=out)
        return 1
    _not_the_users(sys.argv[0] if sys.argv else "", path)

    def execute() -> dict[str, Any]:
        from importlib.machinery import SourceFileLoader
        main = types.ModuleType("__main__")  # as Python makes it for a script
        main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                             __loader__=SourceFileLoader("__main__", path), __spec__=None, __package__=None)
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = main
        try:
            exec(code, main.__dict__)
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
        return main.__dict__

    return _run(execute, [script, *argv], os.path.dirname(path), checks, leak_threshold, out, report_dir)


def run_module(module: str, argv: list[str], *, sanitize: bool = False, guard: bool = False,
               leaks: bool = False, ordering: str | None = None, leak_threshold: float = 0.0,
               out: TextIO | None = None, report_dir: str | None = None) -> int:
    """Run ``module`` as ``python -m module`` does (``runpy.run_module`` with ``alter_sys``:
    ``sys.argv[0]`` is the module's file, the current folder is first on ``sys.path``) under
    the checks asked for, then print the report. The arguments are ``run_script``'s.

    Returns:
        The exit status, as ``run_script``'s; 2 when there is no such module.
    """
    import importlib.util

    out = sys.stderr if out is None else out
    cwd = os.getcwd()
    sys.path.insert(0, cwd)  # what python -m searches first
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:  # a parent package that is missing or fails to import
        spec, why = None, f"{type(e).__name__}: {e}"
    else:
        why = ""
    finally:
        sys.path.remove(cwd)
    if spec is None:
        print(f"ignis run: no module named {module!r}{f' ({why})' if why else ''}", file=out)
        return MISSING_FILE_STATUS
    if spec.origin:
        _not_the_users(sys.argv[0] if sys.argv else "", os.path.abspath(spec.origin))

    def execute() -> dict[str, Any]:
        return runpy.run_module(module, run_name="__main__", alter_sys=True)

    return _run(execute, ["-m", *argv], cwd, Checks(sanitize=sanitize, guard=guard, leaks=leaks,
                                                   ordering=ordering), leak_threshold, out, report_dir)


def _not_the_users(launcher: str, target: str) -> None:
    """The ``ignis`` command's own file is not the user's code (in reports' stacks)."""
    launcher = os.path.abspath(launcher) if launcher else ""
    if os.path.isfile(launcher) and launcher != target:
        from ..safety.frames import add_library_dir
        add_library_dir(launcher, machinery=True)


_MACHINERY = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def _users_traceback(tb: Any) -> Any:
    """``tb`` from the first frame that is not this module's or runpy's: the user's."""
    while tb is not None and tb.tb_frame.f_code.co_filename in _MACHINERY:
        tb = tb.tb_next
    return tb


def _run(execute: Callable[[], dict[str, Any]], argv: list[str], path0: str, checks: Checks,
         leak_threshold: float, out: TextIO, report_dir: str | None) -> int:
    """Run ``execute`` (the script or module) with ``argv`` and ``path0`` first on ``sys.path``,
    under ``checks``; then build the report and deliver it. Returns the exit status."""
    import ignis as ig

    checks.start()
    status = 0
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = list(argv)
    sys.path.insert(0, path0)
    left: Any = None
    raised: list[BaseException] = []  # the error Ignis's checks raised to the script: a problem found
    try:
        left = execute()
    except SystemExit as e:
        status = _exit_status(e.code, out)
    except BaseException as e:  # the script's own failure, reported as Python reports it
        traceback.print_exception(type(e), e, _users_traceback(e.__traceback__), file=out)
        status = INTERRUPTED_STATUS if isinstance(e, KeyboardInterrupt) else 1
        if isinstance(e, ig.IgnisError):
            raised.append(e)
        del e
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    checks.settle()  # the script is over: what its globals free now cannot race its own work
    held: dict[int, str] = {}
    alive: dict[int, dict[str, Any]] = {}
    if checks.leaks:  # what is alive while the globals still are, and which global holds it
        alive = {r["array_id"]: r for r in ig.contract.audit(older_than=leak_threshold) if not r["freed"]}
        held = _held_by_globals(left or {}) if alive else {}
    left = None
    gc.collect()
    from ..array.nvarray import drain_deferred
    drain_deferred()  # what the collector freed goes back now, before the figures are read

    report = Report()
    problems = len(raised)
    if raised and not checks.sanitize:  # the sanitizer's summary shows it with its own
        e = raised[0]
        report.add(f"ignis run: the script stopped on an error Ignis's checks raised (a problem found): "
                   f"{type(e).__name__}: {e}", problem=True)
    text, n, reported = checks.finish_guard()
    problems += n
    report.add(text, problem=reported)
    if checks.sanitize:
        problems += len(ig.sanitizer.reports())
        lines = ig.sanitizer.sanitizer.summary(raised).split("\n--- ")
        report.add(lines[0])
        for block in lines[1:]:
            report.add("--- " + block, problem=True)
    buf = io.StringIO()
    checks.stop(buf)
    report.add(buf.getvalue())
    if checks.leaks:
        problems += _leak_report(ig, report, leak_threshold, alive, held)
    report.add(_summary(ig))
    report.problems = problems
    deliver(report, out, report_dir)
    if status:
        return status
    return 1 if problems else 0


def _exit_status(code: Any, out: TextIO) -> int:
    """The status ``sys.exit(code)`` gives, as Python gives it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=out)
    return 1


# -- the leak audit ----------------------------------------------------------------------
def _held_by_globals(ns: dict[str, Any], depth: int = 4) -> dict[int, str]:
    """Array id -> the global name that holds it, directly or through containers and objects'
    attributes (up to ``depth`` steps; modules, classes and functions are not entered)."""
    from ..array.nvarray import NvArray

    found: dict[int, str] = {}
    seen: set[int] = set()
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)

    def walk(obj: Any, name: str, left: int) -> None:
        if id(obj) in seen or isinstance(obj, skip):
            return
        seen.add(id(obj))
        if isinstance(obj, NvArray):
            found.setdefault(obj.id, name)
            base = obj._base
            if base is not None:  # a view keeps its root alive
                walk(base, name, left)
            return
        if left <= 0 or isinstance(obj, (str, bytes, bytearray, int, float, complex)):
            return
        if isinstance(obj, dict):
            items = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
        else:
            d = getattr(obj, "__dict__", None)
            items = list(d.values()) if isinstance(d, dict) else []
        for item in items:
            walk(item, name, left - 1)

    for name, value in list(ns.items()):
        if not (name.startswith("__") and name.endswith("__")):
            walk(value, name, depth)
    return found


def _leak_report(ig: Any, report: Report, threshold: float, alive: dict[int, dict[str, Any]],
                 held: dict[int, str]) -> int:
    """The leak audit's sections of ``report``; returns the number of problems (leak sites)."""
    rows = ig.contract.audit(older_than=threshold)
    live = [r for r in rows if not r["freed"]]
    live_ids = {r["array_id"] for r in live}
    problems = 0
    if live:
        groups = _by_site(live)
        problems += len(groups)
        total = sum(r["nbytes"] for r in live)
        lines = [f"leaks: {len(live)} array(s), {_fmt_bytes(total)}, still alive after the script finished and "
                 f"its globals were gone, from {len(groups)} allocation site(s):"]
        for g in groups:
            lines += _site_lines(g, held)
        report.add("\n".join(lines), problem=True)
    else:
        nums = {i: ig.get_current_resource(i).memory_numbers()["live_bytes"] for i in range(ig.device_count())}
        nums = {i: n for i, n in nums.items() if n}
        if nums:  # no array, yet memory is still allocated: blocks taken from a resource directly
            problems += 1
            where = ", ".join(f"{_fmt_bytes(n)} on device {i}" for i, n in nums.items())
            report.add(f"leaks: no array is still alive, but {where} are still allocated outside arrays "
                       "(blocks from resource.allocate() never deallocated)", problem=True)
        else:
            report.add("leaks: none")
    gone = [r for i, r in alive.items() if i not in live_ids]  # alive at the script's end, freed with its globals
    if gone:
        lines = [f"leaks: {len(gone)} array(s), {_fmt_bytes(sum(r['nbytes'] for r in gone))}, were held by the "
                 "script's globals at its end and freed with them (not counted as problems):"]
        names: dict[str, list[dict[str, Any]]] = {}
        for r in gone:
            names.setdefault(held.get(r["array_id"], "(through other objects)"), []).append(r)
        for name, members in names.items():
            lines.append(f"  {name}: {len(members)} array(s), {_fmt_bytes(sum(r['nbytes'] for r in members))} "
                         f"({_ids([r['array_id'] for r in members])})")
        report.add("\n".join(lines))
    return problems


def _by_site(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows grouped by allocation site and tag, in the order their first array was made."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("site"), r["tag"]), []).append(r)
    return list(groups.values())


def _ids(ids: list[int], most: int = 8) -> str:
    shown = ", ".join(f"NvArray#{i}" for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def _site_lines(group: list[dict[str, Any]], held: dict[int, str]) -> list[str]:
    first = group[0]
    kinds = sorted({(tuple(r["shape"]), r["dtype"]) for r in group})
    what = ", ".join(f"{list(shape)} {dtype}" for shape, dtype in kinds[:3]) + (", ..." if len(kinds) > 3 else "")
    names = sorted({held[r["array_id"]] for r in group if r["array_id"] in held})
    lines = [f"  {len(group)} array(s), {_fmt_bytes(sum(r['nbytes'] for r in group))}: {what} "
             f"owner={first['owner']} tag={first['tag']!r}, age {max(r['age_ms'] for r in group)} ms "
             f"({_ids([r['array_id'] for r in group])})"]
    if names:
        lines.append(f"    held by the global(s) {', '.join(names)} (and by something still alive after them)")
    if first.get("site"):
        lines.append("    allocated at:\n" + "\n".join("    " + ln for ln in first["site"].splitlines()))
    return lines


def _summary(ig: Any) -> str:
    lines = ["memory:"]
    for i in range(ig.device_count()):
        mr = ig.get_current_resource(i)
        nums = mr.memory_numbers()
        lines.append(f"  device {i}: {type(mr).__name__} live {_fmt_bytes(nums['live_bytes'])}, "
                     f"cached {_fmt_bytes(nums['cached_bytes'])}")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------
_USAGE = ("ignis run [-h] [--sanitize] [--guard] [--leaks] [--ordering {auto,manual}]\n"
          "                 [--leak-threshold SECONDS] [--report-dir DIR]\n"
          "                 (SCRIPT [ARGS ...] | -m MODULE [ARGS ...])")


def _command(args: argparse.Namespace) -> int:
    """``ignis run``: ``run_script`` or ``run_module`` with the parsed flags."""
    flags = dict(sanitize=args.sanitize, guard=args.guard, leaks=args.leaks, ordering=args.ordering,
                 leak_threshold=args.leak_threshold, report_dir=args.report_dir)
    if args.module is not None:  # (-m takes every argument after it: no script, no args)
        return run_module(args.module[0], args.module[1:], **flags)
    return run_script(args.script, args.args, **flags)


def _check_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.module is not None and not args.module:
        parser.error("-m needs the name of a module to run (ignis run -m MODULE [ARGS ...])")
    if args.module is None and args.script is None:
        parser.error("nothing to run: give a Python script (ignis run [options] SCRIPT [ARGS ...]) or a module "
                     "(ignis run [options] -m MODULE [ARGS ...])")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns its parser."""
    run = subparsers.add_parser("run", usage=_USAGE,
                                help="run a Python script (or -m module) under the sanitizer, the debug guard "
                                     "and/or the leak audit",
                                description="Run SCRIPT (or -m MODULE, as python -m does) with Ignis's checks on "
                                            "and print their reports at exit. The exit status is non-zero when "
                                            "a problem was found.")
    run.add_argument("--sanitize", action="store_true",
                     help="check cross-stream races, uses after free, reuse races and uninitialized reads, in "
                          "Ignis's tracked uses and in PyTorch ops on CUDA tensors (the script's ordering "
                          "policy is kept)")
    run.add_argument("--guard", action="store_true",
                     help="canaries, poison and quarantine on every allocation (DebugGuardResource)")
    run.add_argument("--leaks", action="store_true",
                     help="report arrays still alive at exit, grouped by allocation site: those alive once the "
                          "script's globals are gone are leaks (problems); those the globals held are listed")
    run.add_argument("--ordering", choices=("auto", "manual"), default=None,
                     help="ordering policy for Ignis's tracked uses (default: the script's own; 'manual' "
                          "with --sanitize checks the script's synchronization instead of supplying it)")
    run.add_argument("--leak-threshold", type=float, default=0.0, metavar="SECONDS",
                     help="only report arrays older than this (default 0)")
    run.add_argument("--report-dir", default=None, metavar="DIR",
                     help="also write the report to DIR (rank<R>.txt for each rank of a distributed run)")
    run.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None,
                     help="run a module as python -m does (everything after its name is its arguments), "
                          "e.g. ignis run --sanitize -m pytest -x tests/")
    run.add_argument("script", nargs="?", default=None, help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    run.extras_into = "module"  # type: ignore[attr-defined]  # -mpytest -q: -q is pytest's
    run.check_args = lambda ns: _check_target(run, ns)  # type: ignore[attr-defined]
    run.set_defaults(func=_command)
    return run
