"""``ignis launch``: the command-line face of ``ignis.collective.launch``.

``add_parser(subparsers)`` adds the ``launch`` command to an argparse
sub-parser set; ``run(args)`` executes it and returns the exit status (that of
the first rank that failed, else 0). With ``--sanitize``, ``--guard`` or
``--leaks`` each rank runs under ``ignis run``; the ranks leave their reports
in a folder of this command's and it prints them merged (``ignis.cli.ranks``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from .args import int_arg

_ranks = int_arg("a positive number of processes", 1)
_port = int_arg("a TCP port (1..65535)", 1, 65536)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``launch`` to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "launch", help="run a script in N local processes, one per device, as one process group",
        description="Start N processes of SCRIPT with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                    "MASTER_PORT set (as torchrun does), so ig.collective.init_process_group() joins them; "
                    "forward their output prefixed with the rank; exit non-zero if any rank fails.")
    p.add_argument("-n", "--nproc", type=_ranks, required=True, metavar="N", help="number of processes (ranks)")
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's rendezvous address (default 127.0.0.1)")
    p.add_argument("--master-port", type=_port, default=None, help="rendezvous port (default: a free one)")
    p.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                   help="how long the other ranks may run on after one fails (default 30)")
    p.add_argument("--sanitize", action="store_true", help="run every rank under `ignis run --sanitize`")
    p.add_argument("--guard", action="store_true", help="run every rank under `ignis run --guard`")
    p.add_argument("--leaks", action="store_true", help="run every rank under `ignis run --leaks`")
    p.add_argument("--ordering", choices=("auto", "manual"), default=None,
                   help="with the checks: the ordering policy of Ignis's tracked uses (see `ignis run`)")
    p.add_argument("--report-dir", default=None, metavar="DIR",
                   help="with the checks: also write each rank's report to DIR/rank<R>.txt")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ignis launch`` with the parsed ``args``.

    Args:
        args: the namespace ``add_parser``'s parser gave (``nproc``, ``script``, ``args``,
            ``master_addr``, ``master_port``, ``grace``).

    Returns:
        The exit status: that of the first rank that failed, else 0.
    """
    from ..collective.launch import launch
    checks = [f"--{name}" for name in ("sanitize", "guard", "leaks") if getattr(args, name, False)]
    if not checks:
        return launch(args.nproc, args.script, args.args, master_addr=args.master_addr,
                      master_port=args.master_port, grace=args.grace)
    from .ranks import collect, merge
    if args.ordering:
        checks += ["--ordering", args.ordering]
    if args.report_dir:
        checks += ["--report-dir", os.path.abspath(args.report_dir)]
    exchange = tempfile.mkdtemp(prefix="ignis-launch-")
    try:
        status = launch(args.nproc, "-m", ["ignis", "run", *checks, args.script, *args.args],
                        master_addr=args.master_addr, master_port=args.master_port, grace=args.grace,
                        env={"IGNIS_RUN_EXCHANGE": exchange, "IGNIS_RUN_MERGE": "launcher"})
        ranks = list(range(args.nproc))
        print("\n" + merge(collect(exchange, ranks, timeout=0.0), ranks), flush=True)
    finally:
        shutil.rmtree(exchange, ignore_errors=True)
    return status
