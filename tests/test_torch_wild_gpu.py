"""Real programs Ignis's authors did not write the patterns of, on a GPU: each program in
``tests/wild_zoo`` uses PyTorch, torchvision or transformers the way their documentation
shows (transformers' generate with its KV cache and a BERT classifier, torchvision's Faster
R-CNN with its custom ops, fused attention under activation checkpointing, sparse gradients
and the fused, capturable and foreach optimizers, cuSOLVER and cuFFT with complex tensors,
views and in-place ops over shared storage, threads with their own streams). Each runs
unmodified, plain and under ``ignis run --sanitize`` (both engines) and ``--guard``: all correct, so
each must be silent, exit 0 and print the same result as plain. The ``bug_`` programs hold
the bugs such programs make (a pinned buffer read before its copy finished, threads' streams
not waited for): each is reported with both stacks.

Set ``IGNIS_ZOO_LOG=FILE`` to append each run's output there.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]  # (the fixture runs every program, 8 at a time)
torch = pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "tests", "wild_zoo")
from helpers import run_zoo_program, zoo_result  # noqa: E402

NEEDS = {"hf_generate_and_bert.py": "transformers", "detection.py": "torchvision", "compile_default.py": "triton"}
PROGRAMS = sorted(f for f in os.listdir(ZOO) if f.endswith(".py") and not f.startswith("bug_"))
# The bugs of such programs: program -> (kind, a line of the earlier access's stack, of the later's)
BUGS = {
    "bug_d2h_read_before_sync.py": ("read-after-write race", "host.copy_(y, non_blocking=True)", "host.sum()"),
    "bug_thread_streams_no_wait.py": ("read-after-write race", "opt.step()", "models[0].weight + models[1].weight"),
    "bug_generic_event_too_early.py": ("read-after-write race", "host.copy_(dev, non_blocking=True)", "host.sum()"),
}
FLAGS = [("--sanitize", "observer"), ("--sanitize", "mode"), ("--guard", "observer")]
# Known failures, with why (each a defect to fix, not an accepted difference):
KNOWN: dict[tuple[str, str], str] = {}  # (program, engine) -> why it is expected to fail


def _missing(program: str) -> str | None:
    mod = NEEDS.get(program)
    if mod is None:
        return None
    try:
        __import__(mod)
    except ImportError:
        return mod
    return None


def run(program: str, *flags: str, engine: str = "observer") -> subprocess.CompletedProcess:
    return run_zoo_program(ZOO, program, *flags, engine=engine)


@pytest.fixture(scope="module")
def runs() -> dict[tuple, subprocess.CompletedProcess]:
    from ignis.torch._native import observer, observer_error
    assert observer() is not None, observer_error()
    present = [p for p in PROGRAMS if _missing(p) is None]
    jobs = [(p, (), "observer") for p in present]
    jobs += [(p, (flag,), engine) for p in present for flag, engine in FLAGS]
    jobs += [(p, ("--sanitize",), engine) for p in sorted(BUGS) for engine in ("observer", "mode")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(jobs, pool.map(lambda j: run(j[0], *j[1], engine=j[2]), jobs)))


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("flag,engine", FLAGS)
def test_real_programs_are_silent_with_the_same_result(runs, program, flag, engine):
    if _missing(program):
        pytest.skip(f"{_missing(program)} is not installed")
    if (program, engine) in KNOWN:
        pytest.xfail(KNOWN[(program, engine)])
    plain, checked = runs[(program, (), "observer")], runs[(program, (flag,), engine)]
    assert plain.returncode == 0, plain.stderr[-4000:]
    assert "== ignis run report ==" in checked.stderr, checked.stdout[-2000:] + checked.stderr[-6000:]
    text = checked.stderr.split("== ignis run report ==")[1]
    assert checked.returncode == 0 and "no problems found" in text, checked.stderr[-8000:]
    assert zoo_result(checked) == pytest.approx(zoo_result(plain), rel=1e-3, abs=1e-6)
    if flag == "--guard":
        # No program here compiles a graph: the guard's note on graph trees would mislead.
        assert "graph trees" not in text, text
        # cuDNN's autotuner, which a pluggable allocator cannot serve, is kept off and said to be.
        assert ("cudnn.benchmark = True) was off" in text) == (program == "views_and_inplace.py"), text


@pytest.mark.parametrize("program", sorted(BUGS))
@pytest.mark.parametrize("engine", ["observer", "mode"])
def test_their_bugs_are_reported_with_both_stacks(runs, program, engine):
    kind, first, second = BUGS[program]
    p = runs[(program, ("--sanitize",), engine)]
    assert "== ignis run report ==" in p.stderr, p.stdout[-2000:] + p.stderr[-6000:]
    text = p.stderr.split("== ignis run report ==")[1]
    assert p.returncode == 1, text
    blocks = [b for b in re.split(r"\n--- \d+: ", text)[1:] if kind in b]
    assert blocks, text
    earlier, later = blocks[0].split("earlier access:")[1].split("later access:")
    assert first in earlier and second in later, blocks[0]
