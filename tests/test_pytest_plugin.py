"""The pytest plugin (``pytest --ignis-sanitize`` / ``--ignis-guard``): a small real test suite,
written to a folder of its own and run by pytest in a subprocess, with each report failing
the test (or the setup / teardown) that caused it, and problems found after the last test
failing the session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import IMPORT_ROOT

ROOT = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest
import ignis as ig


@pytest.fixture
def streams():
    d = ig.Device(0)
    a, b = d.create_stream(), d.create_stream()
    yield d, a, b
    d.synchronize()


def race(d, a, b):
    x = ig.empty(1024, "float32", stream=a)
    y = ig.empty(1024, "float32", stream=b)
    d.synchronize()
    ig.kernels.fill(x, 1.0, stream=a)
    ig.kernels.copy(y, x, stream=b)   # no wait: a race under manual ordering
    d.synchronize()


def test_racy(streams):
    race(*streams)


def test_clean(streams):
    d, a, b = streams
    x = ig.zeros(16, stream=a)
    b.wait(a.record())
    assert (x.to_numpy(stream=b) == 0).all()


@pytest.fixture
def racy_teardown(streams):
    yield
    race(*streams)


def test_teardown_races(racy_teardown):
    pass


def test_fails_and_races(streams):
    race(*streams)
    assert False, "its own failure"


def test_checks_are_on():
    assert ig.sanitizer.is_enabled() == ("--ignis-sanitize" in __import__("sys").argv)
'''

RACE_AFTER_THE_LAST_TEST = '''
import ignis as ig


def pytest_sessionfinish(session):
    d = ig.Device(0)
    a, b = d.create_stream(), d.create_stream()
    x = ig.empty(64, "float32", stream=a)
    y = ig.empty(64, "float32", stream=b)
    d.synchronize()
    ig.kernels.fill(x, 1.0, stream=a)
    ig.kernels.copy(y, x, stream=b)   # after every test: the session's
    d.synchronize()
'''

OVERRUN = '''
import ignis as ig


def shifted(dst, v, start, n):
    dst[int(start):int(start) + int(n)] = v


SRC = r"""extern "C" __global__ void shifted_fill(float* dst, float v, long long start, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) dst[start + i] = v; }"""
K = ig.Kernel(SRC, "shifted_fill", ("write", "float32", "int64", "int64"), shifted)


def test_overrun():
    x = ig.empty(64, "float32", tag="activations")
    ig.launch(K, 1, 64, x, 1.0, 60, 8)   # four elements past the end
    ig.Device(0).synchronize()


def test_in_bounds():
    x = ig.empty(64, "float32", tag="fine")
    ig.launch(K, 1, 64, x, 1.0, 0, 64)
    ig.Device(0).synchronize()
'''


def pytest_run(folder: Path, *args: str, plugin: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (IMPORT_ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("IGNIS_SANITIZE", None)
    env["COLUMNS"] = "400"  # the short summary's lines whole
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfE", *args]
    if plugin:
        cmd[3:3] = ["-p", "ignis.pytest_plugin"]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def write_suite(folder: Path, **files: str) -> Path:
    folder.mkdir(exist_ok=True)
    for name, body in files.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return folder


def section(out: str, title: str) -> str:
    """The part of pytest's output under the ``___ title ___`` header, up to the next header."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("_") and f" {title} " in ln)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("___", "==="))), len(lines))
    return "\n".join(lines[start:end])


def test_a_racing_test_fails_with_its_report_and_a_clean_one_passes(tmp_path):
    suite = write_suite(tmp_path / "suite", test_suite=SUITE)
    p = pytest_run(suite, "--ignis-sanitize", "--ignis-ordering", "manual")
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert "test_suite.py::test_clean PASSED" in out and "test_suite.py::test_checks_are_on PASSED" in out, out
    assert "FAILED test_suite.py::test_racy - ignis: 1 problem(s) found during the test" in out, out
    racy = section(out, "test_racy")
    assert "RaceError: read-after-write race" in racy and "in test_racy" in racy, racy
    assert "_pytest" not in racy and "pluggy" not in racy, racy  # the test's frames, not pytest's
    # a race in a fixture's teardown is an error of that test's teardown
    assert "ERROR test_suite.py::test_teardown_races - ignis: 1 problem(s) found during its teardown" in out, out
    assert "in racy_teardown" in section(out, "ERROR at teardown of test_teardown_races"), out
    # a test that fails on its own keeps its failure, with Ignis's report beside it
    own = section(out, "test_fails_and_races")
    assert "AssertionError: its own failure" in own and "RaceError" in own, own
    summary = out.split("= ignis =")[1]
    assert "3 test(s) failed on the problems found in them" in summary, summary
    for name in ("test_racy", "test_teardown_races", "test_fails_and_races"):
        assert f"test_suite.py::{name}: 1 problem(s)" in summary, summary
    assert "test_clean" not in summary


def test_each_test_is_judged_alone(tmp_path):
    """The same race in two tests: both fail (the second is not folded into the first's group)."""
    body = SUITE + "\n\ndef test_racy_again(streams):\n    race(*streams)\n"
    suite = write_suite(tmp_path / "suite", test_suite=body)
    p = pytest_run(suite, "--ignis-sanitize", "--ignis-ordering", "manual", "-k", "racy")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "test_suite.py::test_racy FAILED" in p.stdout and "test_suite.py::test_racy_again FAILED" in p.stdout


def test_without_its_options_the_plugin_changes_nothing(tmp_path):
    suite = write_suite(tmp_path / "suite", test_suite=SUITE)
    p = pytest_run(suite, "-k", "racy or clean or checks_are_on")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "= ignis =" not in p.stdout and "3 passed" in p.stdout


def test_a_problem_after_the_last_test_fails_the_session(tmp_path):
    suite = write_suite(tmp_path / "suite", test_suite=SUITE, conftest=RACE_AFTER_THE_LAST_TEST)
    p = pytest_run(suite, "--ignis-sanitize", "--ignis-ordering", "manual", "-k", "clean")
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert "test_suite.py::test_clean PASSED" in out and "1 passed" in out
    summary = out.split("= ignis =")[1]
    assert "no test had a problem" in summary, summary
    assert "1 problem(s) found at the end of the session, after the last test (the session fails)" in summary
    assert "RaceError" in summary and "in pytest_sessionfinish" in summary, summary


def test_the_guard_fails_the_test_that_overran(tmp_path):
    suite = write_suite(tmp_path / "suite", test_overrun=OVERRUN)
    p = pytest_run(suite, "--ignis-guard")
    out = p.stdout
    assert p.returncode == 1, out + p.stderr
    assert "test_overrun.py::test_in_bounds PASSED" in out, out
    failure = section(out, "test_overrun")
    assert "OutOfBoundsError" in failure and "activations" in failure and "in test_overrun" in failure, failure
    assert "ignis guard: 1 test(s) failed" in out


def test_the_pytorch_front_end_is_on_once_torch_is_imported(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")
    body = '''
        import torch
        import ignis.torch


        def test_front_end():
            assert ignis.torch.is_enabled()
            assert float((torch.arange(4.0) * 2).sum()) == 12.0
        '''
    suite = write_suite(tmp_path / "suite", test_torch=body)
    p = pytest_run(suite, "--ignis-sanitize")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "test_torch.py::test_front_end PASSED" in p.stdout


def test_the_entry_point_names_the_module():
    """``[project.entry-points.pytest11]``: the plugin, under its module's name (so ``-p
    ignis.pytest_plugin`` and the installed entry point are one plugin); installed from this
    tree, pytest loads it with no ``-p``."""
    import importlib.metadata
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert eps == {"ignis.pytest_plugin": "ignis.pytest_plugin"}
    installed = [e for e in importlib.metadata.entry_points(group="pytest11") if e.value == "ignis.pytest_plugin"]
    if not installed:
        pytest.skip("this ignis is not installed with its entry points (pip install -e .)")
    assert installed[0].name == "ignis.pytest_plugin"


def test_installed_pytest_finds_the_plugin_without_p(tmp_path):
    import importlib.metadata
    if not [e for e in importlib.metadata.entry_points(group="pytest11") if e.value == "ignis.pytest_plugin"]:
        pytest.skip("this ignis is not installed with its entry points (pip install -e .)")
    suite = write_suite(tmp_path / "suite", test_suite=SUITE)
    p = pytest_run(suite, "--ignis-sanitize", "--ignis-ordering", "manual", "-k", "racy", plugin=False)
    assert p.returncode == 1 and "test_suite.py::test_racy FAILED" in p.stdout, p.stdout + p.stderr
