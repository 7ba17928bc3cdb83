"""The ``ignis`` command line (layer 8): one module per command, each with
``add_parser(subparsers)``; this package only assembles them and runs one.

    ignis doctor [--json] [--device N] [--size-mib N] [--repeats N] [--no-bandwidth]   (doctor)
    ignis demo [--device N]                                                            (demo, tour)
    ignis run [--sanitize] [--guard] [--leaks] [--ordering auto|manual] SCRIPT [ARGS...] | -m MODULE [ARGS...]  (run)
    ignis load FILE [--device N]                                                       (io)
    ignis launch -n N SCRIPT [ARGS...]                                                 (collective)
    ignis snapshot plot|summary FILE [-o OUT.png]                                      (telemetry)
    ignis replay LOG.csv --resource pool|async|direct|guard [--budget BYTES]           (telemetry)
    ignis bench [--out DIR]                                                            (telemetry, bench)

``main(argv)`` returns the exit status instead of exiting (argparse's usage
errors give 2), so it can be called in-process; the console script and
``python -m ignis`` hand it to ``sys.exit``.

Rules: the library never imports this package; these modules import the
library (downward only), and each command imports what it runs only when it
runs, so ``ignis --help`` stays quick.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .doctor import doctor_report

__all__ = ["main", "build_parser", "doctor_report"]


def build_parser() -> argparse.ArgumentParser:
    """The ``ignis`` argument parser: every command, each with its handler as ``func``."""
    from .. import __version__
    from . import collective, demo, doctor, io, run, telemetry
    from .args import Parser

    parser = Parser(
        prog="ignis", description="Ignis: a memory-safe GPU buffer runtime.",
        epilog="The backend is chosen by IGNIS_BACKEND=auto|cuda|emulated (default auto).")
    parser.add_argument("--version", action="version", version=f"ignis {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    doctor.add_parser(sub)
    demo.add_parser(sub)
    run.add_parser(sub)
    io.add_parser(sub)            # load
    collective.add_parser(sub)    # launch
    telemetry.add_parsers(sub)    # snapshot, replay, bench
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ignis`` command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (already printed)
        return e.code if isinstance(e.code, int) else 2
    device = getattr(args, "device", None)  # (doctor reports a missing device in its own report)
    if isinstance(device, int) and not isinstance(device, bool) and args.command != "doctor":
        problem = _bad_device(device)
        if problem:
            print(f"ignis {args.command}: {problem}", file=sys.stderr)
            return 1
    return args.func(args)


def _bad_device(ordinal: int) -> str | None:
    """Why ``--device ordinal`` cannot be used on this machine, or None."""
    from ..backends import get_backend
    try:
        backend = get_backend()
        count = backend.device_count()
    except Exception as e:  # no backend at all: the command itself says more
        return f"no device can be used ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    if not 0 <= ordinal < count:
        return (f"--device {ordinal} does not exist: the {backend.name} backend has {count} device(s) "
                f"(valid: {'0..' + str(count - 1) if count else 'none'}); `ignis doctor` lists them")
    return None
