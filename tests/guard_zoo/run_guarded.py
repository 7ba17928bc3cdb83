"""Run a program as ``ignis run --guard [--sanitize] PROGRAM`` will, until runner.py is wired:

    python tests/guard_zoo/run_guarded.py [--guard] [--sanitize] PROGRAM [ARGS...]

--guard: the debug guard becomes PyTorch's and CuPy's allocator as soon as the
program imports them (ignis.torch._guard.install_on_import); at the end every
quarantine is flushed, everything checked, and the reports printed.
--sanitize: the sanitizer collects, with the PyTorch op front end on torch's import.
Exit status: the program's own if it failed, else 1 when anything was reported.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> int:
    args = sys.argv[1:]
    flags = set()
    while args and args[0].startswith("--"):
        flags.add(args.pop(0))
    script, argv = args[0], args[1:]
    import ignis as ig
    if "--guard" in flags:
        from ignis.torch import _guard
        _guard.install_on_import()
    if "--sanitize" in flags:
        ig.sanitizer.enable("collect")
        from ignis.torch import _hook
        _hook.enable_on_import("collect")
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    problems = 0
    if "--guard" in flags:
        problems += _guard.finish(sys.stderr)
    if "--sanitize" in flags:
        problems += len(ig.sanitizer.reports())
        print(ig.sanitizer.sanitizer.summary(), file=sys.stderr)
        ig.sanitizer.sanitizer.clear()
    sys.stdout.flush()
    return status or (1 if problems else 0)


if __name__ == "__main__":
    sys.exit(main())
