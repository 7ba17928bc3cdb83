"""``ignis run`` in the ranks of a distributed program: reports merged across ranks, each
block once with the ranks that had it, a line per rank, ``--report-dir``, the exit status.

Real processes: ``ignis launch`` (which merges the ranks' reports itself), and two ranks
started as torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID set),
where local rank 0 merges and the other rank waits for it before it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

from helpers import IMPORT_ROOT

from ignis.cli.ranks import Report, merge

# A race on rank 1 only, a race on every rank, or nothing, as RANK says (manual ordering).
SCRIPT = """
import os
import ignis as ig
rank = int(os.environ.get("RANK", "0"))
mode = os.environ["ZOO_MODE"]
d = ig.Device(0)
a, b = d.create_stream(), d.create_stream()
x = ig.empty(1024, "float32", stream=a)
y = ig.empty(1024, "float32", stream=b)
d.synchronize()
ig.kernels.fill(x, 1.0, stream=a)
if mode == "correct" or (mode == "rank1" and rank != 1):
    b.wait(a.record())
ig.kernels.copy(y, x, stream=b)
d.synchronize()
print("rank", rank, "done")
"""


def _env(**extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=IMPORT_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def _script(tmp_path) -> str:
    p = tmp_path / "ranks.py"
    p.write_text(textwrap.dedent(SCRIPT))
    return str(p)


def test_launch_merges_identical_reports_and_names_each_rank(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ignis", "launch", "-n", "2", "--sanitize", "--ordering", "manual",
                        "--report-dir", str(tmp_path / "reports"), _script(tmp_path)],
                       capture_output=True, text=True, env=_env(ZOO_MODE="all"), timeout=240)
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    merged = out.split("== ignis run report (2 ranks) ==")[1]
    assert merged.count("RaceError") == 1 and "[ranks 0-1] --- 1: RaceError" in merged  # once, not twice
    assert "[rank 0] 1 problem(s) found" in merged and "[rank 1] 1 problem(s) found" in merged
    for r in (0, 1):
        text = (tmp_path / "reports" / f"rank{r}.txt").read_text()
        assert "RaceError" in text and "ig.kernels.copy(y, x, stream=b)" in text
        assert f"[rank {r}] rank {r} done" in out


def test_launch_names_the_one_rank_with_a_problem(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ignis", "launch", "-n", "2", "--sanitize", "--ordering", "manual",
                        _script(tmp_path)], capture_output=True, text=True, env=_env(ZOO_MODE="rank1"), timeout=240)
    merged = p.stdout.split("== ignis run report (2 ranks) ==")[1]
    assert p.returncode == 1
    assert "[rank 1] --- 1: RaceError" in merged and "[ranks 0-1] --- 1" not in merged
    assert "[rank 0] no problems found" in merged and "[rank 1] 1 problem(s) found" in merged


def test_launch_of_a_correct_program_exits_zero(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ignis", "launch", "-n", "2", "--sanitize", "--ordering", "manual",
                        _script(tmp_path)], capture_output=True, text=True, env=_env(ZOO_MODE="correct"), timeout=240)
    assert p.returncode == 0, p.stdout
    assert "[rank 0] no problems found" in p.stdout and "[rank 1] no problems found" in p.stdout


def test_ranks_started_as_torchrun_starts_them_merge_on_local_rank_zero(tmp_path):
    run_id = uuid.uuid4().hex
    procs = []
    for r in (0, 1):
        env = _env(ZOO_MODE="all", RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   TORCHELASTIC_RUN_ID=run_id, MASTER_PORT="1", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, "-m", "ignis", "run", "--sanitize", "--ordering", "manual",
                                       _script(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [1, 1]
    rank0, rank1 = outs[0][1], outs[1][1]
    assert "[ranks 0-1] --- 1: RaceError" in rank0 and "[rank 1] 1 problem(s) found" in rank0
    assert "RaceError" not in rank1 and "[rank 1] ignis run: 1 problem(s) found" in rank1


def test_without_an_exchange_each_rank_prefixes_its_own_report(tmp_path):
    env = _env(ZOO_MODE="all", RANK="3", LOCAL_RANK="3", WORLD_SIZE="4")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("IGNIS_RUN_EXCHANGE", None)
    p = subprocess.run([sys.executable, "-m", "ignis", "run", "--sanitize", "--ordering", "manual", _script(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1
    lines = p.stderr.split("[rank 3] == ignis run report ==")[1].strip().splitlines()
    assert all(ln.startswith("[rank 3] ") for ln in lines) and "[rank 3] ignis run: 1 problem(s) found" in lines


def test_merge_groups_blocks_that_differ_only_in_addresses_and_names_a_silent_rank():
    a, b = Report(), Report()
    a.add("--- 1: RaceError: write of block 0x7f00 on stream 0x10", problem=True)
    b.add("--- 1: RaceError: write of block 0x9a00 on stream 0x30", problem=True)
    a.problems = b.problems = 1
    text = merge({0: {"blocks": a.blocks, "problems": 1}, 2: {"blocks": b.blocks, "problems": 1}}, [0, 1, 2])
    assert text.count("RaceError") == 1 and "[ranks 0, 2] --- 1: RaceError: write of block 0x7f00" in text
    assert "[rank 1] no report: the rank ended before it could write one" in text
