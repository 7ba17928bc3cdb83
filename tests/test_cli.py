"""The ``ignis`` command line: doctor, doctor --json and demo, in-process through
``main`` and as ``python -m ignis``; usage errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ignis as ig
from helpers import IMPORT_ROOT
from ignis.cli import main

SRC = Path(__file__).resolve().parents[1] / "src"
SMALL_PROBE = ["--size-mib", "4", "--repeats", "2"]


def run_module(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "ignis", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def check_doctor_text(out: str) -> None:
    assert f"backend: {ig.backend_name()}" in out
    assert f"devices: {ig.device_count()}" in out
    for key in ("device 0:", "total memory", "multiprocessors", "compute capability", "uuid",
                "capabilities        vmm:", "versions:", "python", "numpy", "ml_dtypes", "cuda-bindings",
                "host<->device copy bandwidth"):
        assert key in out, key
    for case in ("pinned    htod", "pinned    dtoh", "pageable  htod", "pageable  dtoh"):
        assert case in out, case
    assert ("mean nothing about a GPU" in out) == (ig.backend_name() == "emulated")
    assert "problems:" not in out
    import importlib.util
    assert ("PyTorch front end: torch" in out) == (importlib.util.find_spec("torch") is not None)


def check_doctor_json(text: str) -> None:
    report = json.loads(text)
    assert report["backend"] == ig.backend_name()
    assert report["device_count"] == ig.device_count() == len(report["devices"])
    assert report["problems"] == []
    dev = report["devices"][0]
    assert dev["ordinal"] == 0 and dev["total_memory"] > 0 and dev["uuid"]
    assert set(dev["capabilities"]) == {"vmm", "memory_pools", "posix_fd_ipc"}
    assert {"python", "numpy", "ml_dtypes", "cuda-bindings", "backend"} <= set(report["versions"])
    bw = report["bandwidth"]
    assert {(r["host_memory"], r["direction"]) for r in bw["results"]} == {
        ("pinned", "htod"), ("pinned", "dtoh"), ("pageable", "htod"), ("pageable", "dtoh")}
    for r in bw["results"]:
        assert len(r["ms"]) == bw["repeats"]
        assert r["gbps_median"] is None or r["gbps_median"] > 0
    assert ("note" in bw) == (report["backend"] == "emulated")
    fe = report["torch_front_end"]
    try:
        import torch
    except ImportError:
        assert fe is None
    else:
        from ignis.torch._native import observer_path
        path = observer_path()  # doctor builds nothing: what it saw is what the cache holds now
        assert fe["torch"] == torch.__version__
        assert fe["observer"] == (path if os.path.exists(path) else None)


def check_demo(out: str) -> None:
    for key in ("created streams A", "tracked WRITE", "B waits on it", "src -> dst",
                "bytes match", "the pool handed back", "DoubleFreeError: double free",
                "pool statistics: reserved", "cross-stream waits", "demo passed"):
        assert key in out, key
    assert "FAILED" not in out


# -- in-process -------------------------------------------------------------------------------
def test_doctor(capsys):
    assert main(["doctor", *SMALL_PROBE]) == 0
    check_doctor_text(capsys.readouterr().out)


def test_doctor_json(capsys):
    assert main(["doctor", "--json", *SMALL_PROBE]) == 0
    check_doctor_json(capsys.readouterr().out)


def test_doctor_without_probe(capsys):
    assert main(["doctor", "--json", "--no-bandwidth"]) == 0
    assert json.loads(capsys.readouterr().out)["bandwidth"] is None


def test_doctor_reports_a_missing_device(capsys):
    assert main(["doctor", "--json", "--device", str(ig.device_count())]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1 and "does not exist" in problems[0]


@pytest.mark.parametrize("argv", [["demo", "--device", "99"], ["load", "x.safetensors", "--device", "99"]])
def test_a_bad_device_is_one_line_and_status_1(argv, capsys):
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if not line.startswith("ignis: no usable")]
    assert len(lines) == 1 and "--device 99 does not exist" in lines[0] and "Traceback" not in captured.err


def test_demo(capsys):
    assert main(["demo"]) == 0
    check_demo(capsys.readouterr().out)


def test_demo_on_another_device(capsys):
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    assert main(["demo", "--device", "1"]) == 0
    assert "FAILED" not in capsys.readouterr().out


def test_demo_twice_in_one_process(capsys):
    assert main(["demo"]) == 0
    assert main(["demo"]) == 0
    check_demo(capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["bogus"], "invalid choice: 'bogus'"),
    ([], "required: COMMAND"),
    (["doctor", "--repeats", "0"], "expected a positive integer"),
    (["doctor", "--size-mib", "x"], "expected a positive integer"),
    (["demo", "--device", "-1"], "expected a device ordinal"),
    (["demo", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_usage_errors_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ignis") and message in err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ignis {ig.__version__}"


# -- as a program ------------------------------------------------------------------------------
def test_module_doctor():
    p = run_module("doctor")  # the default probe size
    assert p.returncode == 0, p.stdout + p.stderr
    check_doctor_text(p.stdout)


def test_module_doctor_json():
    p = run_module("doctor", "--json", *SMALL_PROBE)
    assert p.returncode == 0, p.stdout + p.stderr
    check_doctor_json(p.stdout)  # stdout is pure JSON: backend notices go to stderr


def test_module_demo():
    p = run_module("demo")
    assert p.returncode == 0, p.stdout + p.stderr
    check_demo(p.stdout)


def test_module_bad_subcommand():
    p = run_module("bogus")
    assert p.returncode == 2
    assert "usage: ignis" in p.stderr and "invalid choice" in p.stderr


# -- every command's --help, through the real entry points ------------------------------------
COMMANDS = ["doctor", "demo", "run", "load", "launch", "snapshot", "snapshot plot", "snapshot summary", "replay",
            "bench"]


def _commands(parser, prefix=()):
    """Every command path of ``parser`` (``("snapshot", "plot")`` for a nested one)."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield " ".join((*prefix, name))
                yield from _commands(sub, (*prefix, name))


def test_the_command_list_is_complete():
    from ignis.cli import build_parser
    assert sorted(_commands(build_parser())) == sorted(COMMANDS)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_module_help(command):
    from ignis.cli import build_parser
    p = run_module(*command.split(), "--help")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith(f"usage: ignis {command}".rstrip()) and p.stderr == ""
    parser = build_parser()
    for word in command.split():
        parser = next(a for a in parser._actions if a.dest.endswith("command")).choices[word]
    description = " ".join((parser.description or parser.prog).split())
    assert description[:40] in " ".join(p.stdout.split())


def test_console_script_entry_point():
    """``[project.scripts] ignis`` in pyproject.toml names a function that runs the command line."""
    import importlib
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    target = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["scripts"]["ignis"]
    module, func = target.split(":")
    assert getattr(importlib.import_module(module), func) is main
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    code = f"import sys; from {module} import {func}; sys.exit({func}())"
    p = subprocess.run([sys.executable, "-c", code, "run", "--help"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "--sanitize" in p.stdout and "--guard" in p.stdout and "--leaks" in p.stdout, \
        p.stdout + p.stderr


def test_the_library_does_not_import_the_command_line():
    """Layer 8 sits on top: no module outside ``ignis.cli`` imports it (``ignis/__main__.py``,
    the ``python -m ignis`` entry, and ``ignis/pytest_plugin.py``, pytest's, excepted)."""
    import ast

    pkg = SRC / "ignis"
    offenders = []
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        if rel.parts[0] == "cli" or rel in (Path("__main__.py"), Path("pytest_plugin.py")):
            continue
        package = ["ignis", *rel.parts[:-1]]   # what "from . import" means in this file
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            offenders += [f"{rel}:{node.lineno} {n}" for n in names if n == "ignis.cli" or n.startswith("ignis.cli.")]
    assert offenders == []


# -- the edges a new user meets -----------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["run", "{}"], ["load", "{}"], ["snapshot", "plot", "{}"], ["snapshot", "summary", "{}"],
                                  ["replay", "{}"]])
@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_an_input_file_that_is_not_there_exits_2_with_one_clean_line(tmp_path, capsys, argv, kind):
    path = tmp_path / "nope" if kind == "missing" else tmp_path
    assert main([a.format(path) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("ignis: no usable")]
    assert len(lines) == 1 and str(path) in lines[0], err
    assert ("no such" in lines[0]) if kind == "missing" else ("is a directory" in lines[0]), err
    assert "Errno" not in err and "Traceback" not in err


def test_doctor_names_a_missing_device_without_the_probe_too(capsys):
    assert main(["doctor", "--device", str(ig.device_count()), "--no-bandwidth"]) == 1
    out = capsys.readouterr().out
    assert f"device {ig.device_count()} does not exist" in out.split("problems:")[1]
