"""The distributed zoo on two GPUs: each program in ``tests/dist_zoo`` runs unmodified under
``torchrun --nproc_per_node 2 -m ignis run --sanitize`` (and the DDP and FSDP2 programs under
``--guard``). Correct programs must be silent on every rank and compute the same loss as
without Ignis; each bug must be reported on every rank it happens on, with both stacks.

Set ``IGNIS_ZOO_LOG=FILE`` to append each run's output there.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "tests", "dist_zoo")
from helpers import IMPORT_ROOT, run_logged  # noqa: E402

# program -> (kind, a line of the earlier access's stack, a line of the later access's stack)
BUGS = {
    "bug_read_before_wait.py": ("read-after-write race", "work = dist.all_reduce(t, async_op=True)",
                                "early = t.sum()"),
    "bug_write_before_wait.py": ("write-after-read race", "dist.all_gather_into_tensor(whole, shard",
                                 "shard.fill_(-1.0)"),
    "bug_uninitialized_output.py": ("uninitialized read", "whole = torch.empty", "stale = whole.max()"),
    "bug_send_while_writing.py": ("read-after-write race", "msg.copy_(", "dist.send(msg"),
    "bug_resize_before_wait.py": ("use-after-free race", "work = dist.all_reduce(t, async_op=True)",
                                  "t.untyped_storage().resize_(0)"),
}
CORRECT = ["ok_ddp.py", "ok_fsdp2.py", "ok_pipeline.py", "ok_functional.py", "ok_poll_completed.py"]
GUARDED = ["ok_ddp.py", "ok_fsdp2.py"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(program: str, *ignis: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 [-m ignis run FLAGS] program``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([IMPORT_ROOT, ZOO, os.environ.get("PYTHONPATH", "")]),
               IGNIS_BACKEND="cuda", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master-port", str(_port())]
    cmd += ["-m", "ignis", "run", *ignis] if ignis else []
    cmd.append(os.path.join(ZOO, program))
    return run_logged(cmd, f"torchrun {' '.join(ignis)} {program}", env=env, cwd=ZOO)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, tuple[str, ...]], subprocess.CompletedProcess]:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from ignis.torch._native import observer, observer_error
    assert observer() is not None, observer_error()
    jobs = [(p, ()) for p in CORRECT] + [(p, ("--sanitize",)) for p in CORRECT + sorted(BUGS)]
    jobs += [(p, ("--guard",)) for p in GUARDED + ["bug_guard_overrun_rank1.py"]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(jobs, pool.map(lambda j: torchrun(j[0], *j[1]), jobs)))


def losses(p: subprocess.CompletedProcess) -> dict[int, float]:
    return {int(r): float(v) for r, v in re.findall(r"ZOO rank (\d) loss ([-+]?[0-9]+\.[0-9]+)", p.stdout + p.stderr)}


def merged(p: subprocess.CompletedProcess) -> str:
    text = p.stdout + p.stderr
    assert "== ignis run report (2 ranks) ==" in text, text[-4000:]
    return text.split("== ignis run report (2 ranks) ==")[1]


@pytest.mark.parametrize("program", CORRECT)
@pytest.mark.parametrize("flag", ["--sanitize", "--guard"])
def test_correct_programs_are_silent_with_the_same_loss(runs, program, flag):
    if flag == "--guard" and program not in GUARDED:
        pytest.skip("guarded: the DDP and FSDP2 programs")
    plain, checked = runs[(program, ())], runs[(program, (flag,))]
    assert plain.returncode == 0, plain.stderr[-4000:]
    report = merged(checked)
    assert checked.returncode == 0, report
    # An error inside a callback PyTorch calls is printed and dropped ("Exception ignored"):
    # whatever it was to do (an access, an ordering) silently did not happen.
    assert "Exception ignored" not in checked.stdout + checked.stderr, (checked.stdout + checked.stderr)[-4000:]
    assert "[rank 0] no problems found" in report and "[rank 1] no problems found" in report
    want, got = losses(plain), losses(checked)
    assert set(want) == {0, 1} and got.keys() == want.keys()
    for r in want:
        assert got[r] == pytest.approx(want[r], rel=1e-5, abs=1e-6), (r, want, got)


@pytest.mark.parametrize("program", sorted(BUGS))
def test_each_bug_is_reported_on_every_rank_with_both_stacks(runs, program):
    kind, first, second = BUGS[program]
    p = runs[(program, ("--sanitize",))]
    report = merged(p)
    assert p.returncode != 0, report
    assert "Exception ignored" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-4000:]
    assert "[rank 0] 1 problem(s) found" in report or "[rank 0] 2 problem(s) found" in report, report
    blocks = re.split(r"\n\[[^\]]*\] --- \d+: ", report)[1:]
    hit = [b for b in blocks if kind in b and first in b and second in b]
    assert hit, f"no {kind} naming {first!r} and {second!r}:\n{report}"
    # On both ranks: once, where both ranks' reports are the same; else each rank's own.
    assert re.search(r"\[ranks 0-1\] --- \d+: ", report) or (
        re.search(r"\[rank 0\] --- \d+: ", report) and re.search(r"\[rank 1\] --- \d+: ", report)), report


def test_the_guard_reports_an_overrun_on_the_rank_it_happened_on(runs):
    p = runs[("bug_guard_overrun_rank1.py", ("--guard",))]
    report = merged(p)
    assert p.returncode != 0, report
    assert "[rank 1] 1 problem(s) found" in report and "[rank 0] no problems found" in report, report
    assert "SITE:victim" in report and "[rank 1]" in report.split("SITE:victim")[0].splitlines()[-1]
    assert (p.stdout + p.stderr).count("OutOfBoundsError") == 1  # reported once (not again at exit)
