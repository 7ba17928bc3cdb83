"""The PyTorch bug zoo on a GPU: each program in ``tests/torch_zoo`` runs unmodified under
``ignis run --sanitize``, with each of the front end's engines (the C++ op observer, the
default there, and the dispatch mode). Every bug program must be flagged with the right kind and both
Python stacks (each naming the program's own lines); every correct program must be silent.

Set ``IGNIS_ZOO_LOG=FILE`` to append each program's output there.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.gpu
pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "tests", "torch_zoo")
from helpers import run_zoo_program  # noqa: E402

# program -> [(kind, a line of the earlier access's stack, a line of the later access's stack)]
BUGS = {
    "bug_race_two_streams.py": [("read-after-write race", "x.fill_(1.0)", "total = x.sum()")],
    "bug_free_without_record_stream.py": [("use-after-free race", "y = x * 2", "del x"),
                                          ("reuse race", "y = x * 2", "z = torch.zeros")],
    "bug_uninitialized_read.py": [("uninitialized read", "scores = torch.empty", "scores.mean()")],
    "bug_pinned_host_write.py": [("write-after-read race", "staging.to(", "staging.fill_")],
    "bug_dlpack_mixed.py": [("read-after-write race", "ig.kernels.fill", "total = t.sum()")],
    "bug_declared_kernel.py": [("read-after-write race", "ignis.torch.use", "out.sum()")],
}
CORRECT = sorted(f for f in os.listdir(ZOO) if f.startswith("ok_"))


ENGINES = ["observer", "mode"]


def run_zoo(engine_program: tuple[str, str]) -> subprocess.CompletedProcess:
    engine, program = engine_program
    return run_zoo_program(ZOO, program, "--sanitize", engine=engine, timeout=300)


@pytest.fixture(scope="module")
def zoo() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every program's run with each engine, several at a time (each is mostly start-up:
    imports, CUDA). The observer is built first, once, if this torch has none cached."""
    from ignis.torch._native import observer, observer_error
    assert observer() is not None, observer_error()
    runs = [(e, p) for e in ENGINES for p in sorted(BUGS) + CORRECT]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(runs, pool.map(run_zoo, runs)))


def sections(stderr: str) -> list[str]:
    """The report's problems, one text each."""
    body = stderr.split("== ignis run report ==")[-1]
    return re.split(r"\n--- \d+: ", body)[1:]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("program", sorted(BUGS))
def test_every_bug_is_flagged_with_both_stacks(program, engine, zoo):
    if program == "bug_declared_kernel.py":
        pytest.importorskip("cupy", reason="the declared-kernel program writes with CuPy")
    p = zoo[(engine, program)]
    assert p.returncode == 1, p.stdout + p.stderr
    found = sections(p.stderr)
    for kind, earlier, later in BUGS[program]:
        match = [s for s in found if f": {kind}: " in s.split("\n")[0]]
        assert match, f"no {kind} in:\n{p.stderr}"
        text = match[0]
        first, _, second = text.partition("\nlater access:\n") if "later access:" in text else \
            text.partition("\nallocated at:\n")[::-1]
        assert program in first and program in second, text  # both stacks show the program's own frames
        assert earlier in text and later in text, text
        assert "site-packages/torch" not in text and "runpy" not in text


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("program", CORRECT)
def test_correct_programs_are_silent(program, engine, zoo):
    p = zoo[(engine, program)]
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok" in p.stdout and "no problems found" in p.stderr, p.stderr
    how = "the op observer" if engine == "observer" else "the dispatch mode"
    if engine == "observer":  # (and PyTorch's GPU trace went to its handlers below Python)
        how += " and its GPU trace hook"
    assert f"op(s) on CUDA tensors checked (seen by {how})" in p.stderr, p.stderr  # the engine asked for ran
