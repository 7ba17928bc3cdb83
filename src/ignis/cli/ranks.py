"""Reports of ``ignis run`` from the N ranks of a distributed program.

Design:
- A run's report is a list of blocks (a problem each, and the other sections: the
  guard's, the leak audit's, the memory summary), with the number of problems.
- One rank (no ``WORLD_SIZE`` above 1 in the environment): the report is printed as
  it is.
- N ranks (``torchrun`` or ``ignis launch`` set ``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``): each rank writes its report to an exchange
  folder (``IGNIS_RUN_EXCHANGE``, set by ``ignis launch``; under torchrun one per run,
  named by ``TORCHELASTIC_RUN_ID``, the master port and the restart count). The
  merger (``ignis launch`` itself, else local rank 0) waits for every local rank's
  report, then prints one report: each block once, prefixed with the ranks that had it
  (blocks are the same when they differ only in addresses and handles), and one line
  per rank. The other ranks print their one line and wait until the merger is done
  (torchrun stops every rank as soon as one exits with a failure).
- ``--report-dir DIR``: each rank's whole report also goes to ``DIR/rank<R>.txt``.
- A rank whose report never comes (it died) is named as such after
  ``IGNIS_RUN_MERGE_TIMEOUT`` seconds (default 60).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["Report", "RankInfo", "rank_info", "deliver", "merge", "exchange_dir"]

_HEX = re.compile(r"0x[0-9a-fA-F]+")


@dataclass
class Report:
    """One rank's report: its blocks (each with whether it is a problem) and its problem count."""

    blocks: list[tuple[str, bool]] = field(default_factory=list)
    problems: int = 0

    def add(self, text: str, problem: bool = False) -> None:
        """Add a block of ``text`` (a problem's when ``problem``); an empty one is left out."""
        text = text.rstrip("\n")
        if text:
            self.blocks.append((text, problem))

    def text(self) -> str:
        """The whole report, as one rank prints it."""
        return "\n".join(t for t, _ in self.blocks)

    def verdict(self) -> str:
        """"N problem(s) found" or "no problems found"."""
        return f"{self.problems} problem(s) found" if self.problems else "no problems found"


@dataclass(frozen=True)
class RankInfo:
    """This process's rank and local rank, and the sizes of the world and of its host's part."""

    rank: int
    local_rank: int
    world: int
    local_world: int


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def rank_info() -> RankInfo | None:
    """This process's place in a distributed run (from the launcher's environment), or None."""
    world = _int_env("WORLD_SIZE", 1)
    if world <= 1 or "RANK" not in os.environ:
        return None
    rank = _int_env("RANK", 0)
    local = _int_env("LOCAL_RANK", rank)
    return RankInfo(rank, local, world, _int_env("LOCAL_WORLD_SIZE", world))


def exchange_dir() -> str | None:
    """Where this run's ranks leave their reports, or None when there is no such place."""
    d = os.environ.get("IGNIS_RUN_EXCHANGE")
    if d:
        return d
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return None
    tag = "-".join(re.sub(r"[^0-9A-Za-z_.]", "_", x) for x in
                   (run_id, os.environ.get("MASTER_PORT", ""), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    return os.path.join(tempfile.gettempdir(), f"ignis-run-{os.getuid()}-{tag}")


def _timeout() -> float:
    try:
        return float(os.environ.get("IGNIS_RUN_MERGE_TIMEOUT", "60"))
    except ValueError:
        return 60.0


def _key(text: str) -> str:
    return _HEX.sub("0x…", text)


def _ranks(rs: list[int]) -> str:
    """"rank 3", "ranks 0-3", "ranks 0, 2"."""
    rs = sorted(rs)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def merge(reports: dict[int, dict[str, Any]], expected: list[int]) -> str:
    """One report from several ranks' (``{rank: {"blocks": [[text, problem]], "problems": n}}``):
    each block once, prefixed with the ranks that had it; then a line per expected rank."""
    order: list[str] = []
    seen: dict[str, tuple[str, list[int]]] = {}
    for rank in sorted(reports):
        for text, _ in reports[rank]["blocks"]:
            k = _key(text)
            if k not in seen:
                seen[k] = (text, [])
                order.append(k)
            if rank not in seen[k][1]:
                seen[k][1].append(rank)
    lines = [f"== ignis run report ({len(expected)} ranks) =="]
    for k in order:
        text, rs = seen[k]
        prefix = f"[{_ranks(rs)}] "
        lines += [prefix + ln for ln in text.splitlines()]
    lines.append("== ignis run: per rank ==")
    for rank in expected:
        r = reports.get(rank)
        if r is None:
            lines.append(f"[rank {rank}] no report: the rank ended before it could write one (see its output)")
        else:
            n = r["problems"]
            lines.append(f"[rank {rank}] {n} problem(s) found" if n else f"[rank {rank}] no problems found")
    return "\n".join(lines)


def _write_atomic(path: str, data: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def deliver(report: Report, out: TextIO, report_dir: str | None = None) -> None:
    """Print ``report`` as this process's place in the run asks (see the module's description)."""
    info = rank_info()
    if report_dir:
        os.makedirs(report_dir, exist_ok=True)
        name = f"rank{info.rank}.txt" if info is not None else "report.txt"
        _write_atomic(os.path.join(report_dir, name), report.text() + "\n")
    ex = exchange_dir() if info is not None else None
    if info is None or ex is None:
        prefix = f"[rank {info.rank}] " if info is not None else ""
        print("\n" + prefix + "== ignis run report ==", file=out)
        for text, _ in report.blocks:
            print("\n".join(prefix + ln for ln in text.splitlines()), file=out)
        if info is not None:
            print(f"[rank {info.rank}] ignis run: {report.verdict()}", file=out)
        return
    os.makedirs(ex, exist_ok=True)
    payload = {"blocks": report.blocks, "problems": report.problems}
    _write_atomic(os.path.join(ex, f"rank{info.rank}.json"), json.dumps(payload))
    launcher_merges = os.environ.get("IGNIS_RUN_MERGE") == "launcher"
    if launcher_merges or info.local_rank != 0:
        print(f"[rank {info.rank}] ignis run: {report.verdict()} (the report comes from "
              f"{'ignis launch' if launcher_merges else 'local rank 0'})", file=out)
        out.flush()
        if not launcher_merges:
            _wait_for(lambda: os.path.exists(os.path.join(ex, "done")) or not os.path.isdir(ex))
        return
    # Local rank 0 merges this host's ranks (their global ranks: RANK - LOCAL_RANK onwards).
    first = info.rank - info.local_rank
    expected = list(range(first, first + info.local_world))
    reports = collect(ex, expected)
    print("\n" + merge(reports, expected), file=out)
    out.flush()
    _write_atomic(os.path.join(ex, "done"), "")
    shutil.rmtree(ex, ignore_errors=True)  # (a rank still waiting sees it gone: done)


def collect(ex: str, expected: list[int], timeout: float | None = None) -> dict[int, dict[str, Any]]:
    """The reports of ``expected`` ranks in ``ex``, waiting up to ``timeout`` seconds for them."""
    got: dict[int, dict[str, Any]] = {}

    def all_in() -> bool:
        for r in expected:
            if r not in got:
                try:
                    with open(os.path.join(ex, f"rank{r}.json")) as f:
                        got[r] = json.load(f)
                except (OSError, ValueError):
                    pass
        return len(got) == len(expected)
    _wait_for(all_in, timeout)
    return got


def _wait_for(cond: Any, timeout: float | None = None) -> bool:
    deadline = time.monotonic() + (_timeout() if timeout is None else timeout)
    delay = 0.01
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    return True
