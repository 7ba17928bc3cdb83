"""Every script in examples/ runs, on the emulated backend, with the command its docstring gives.

Each example's docstring names the exact command that runs it (``.venv/bin/python
examples/x.py`` or ``.venv/bin/ignis ...``). This test reads those commands
from the docstring, runs them from the repository root with this interpreter
(``.venv/bin/python`` becomes ``sys.executable``, ``.venv/bin/ignis`` becomes
``sys.executable -m ignis``) and checks the exit status and a key line of
output. So a docstring command that stops working fails here, and a new
example without an entry in ``EXPECT`` fails ``test_every_example_is_covered``.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import ignis as ig

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
IMPORT_ROOT = str(Path(ig.__file__).resolve().parents[1])  # the ignis this test imports
TIMEOUT = 240


def _has(module: str) -> bool:
    try:
        __import__(module)
    except Exception:  # noqa: BLE001 - absent or broken: the example skips either way
        return False
    return True


# script -> one (exit status, lines that must be in the output) per docstring command, in order
EXPECT: dict[str, list[tuple[int, tuple[str, ...]]]] = {
    "stream_race.py": [
        (0, ("[1. 1. 1. 1.]",)),
        (1, ("read-after-write race", "earlier access:", "later access:",
             "ig.kernels.fill(x, 1.0, stream=producer)", "ig.kernels.copy(y, x, stream=consumer)")),
    ],
    "two_stream_pipeline.py": [(0, ("the sanitizer found no race", "pipeline OK"))],
    "kv_cache_append.py": [(0, ("refused, wrong row shape", "refused, past the end",
                                "refused, free while a view is alive", "kv cache OK"))],
    "catch_bugs.py": [(0, ("race between streams        caught RaceError", "use after free              caught",
                           "double free                 caught", "out-of-bounds write         caught",
                           "free while exported         caught", "every planted bug was caught"))],
    "safetensors_roundtrip.py": [(0, ("every byte matches", "hostile header refused",
                                      "safetensors round trip OK"))],
    "ipc_producer_consumer.py": [(0, ("consumer: all 16777216 elements match", "-> shared"))],
    "allreduce_two_ranks.py": [(0, ("[rank 0] rank 0: all-reduce OK", "[rank 1] rank 1: all-reduce OK"))],
    "telemetry_snapshot.py": [(0, ("Ignis memory summary", "drag it onto https://pytorch.org/memory_viz",
                                   "timeline plot:", "telemetry OK"))],
    "torch_interop.py": [(0, ("free while the tensor is alive: refused", "torch interop OK") if _has("torch")
                          else ("torch interop: skipped",))],
    "cupy_interop.py": [(0, ("cupy interop: skipped",))],   # the emulated backend: CuPy needs a GPU
}

# Arguments added to a command: a socket name of its own, a folder of the test's.
EXTRA_ARGS = {
    "ipc_producer_consumer.py": lambda tmp: ["--address", f"ignis-test-examples-{os.getpid()}"],
    "telemetry_snapshot.py": lambda tmp: [str(tmp)],
}


def docstring_commands(script: Path) -> list[str]:
    """The commands in the docstring's literal blocks: lines starting with ``.venv/bin/``
    (a line ending in ``&`` starts one half of a two-program run and is left out)."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    out = []
    for line in doc.splitlines():
        cmd = line.split("#", 1)[0].strip()
        if line.startswith("    .venv/bin/") and not cmd.endswith("&"):
            out.append(cmd)
    return out


def to_argv(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    assert not any(w.startswith(("[", "<")) for w in words), f"a placeholder in a docstring command: {cmd}"
    if words[0] == ".venv/bin/python":
        return [sys.executable, *words[1:]]
    if words[0] == ".venv/bin/ignis":
        return [sys.executable, "-m", "ignis", *words[1:]]
    raise AssertionError(f"unexpected command in a docstring: {cmd}")


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, IGNIS_BACKEND="emulated")
    for var in ("IGNIS_SANITIZE", "IGNIS_SANITIZE_MODE", "IGNIS_EMU_JITTER"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)


SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def test_every_example_is_covered() -> None:
    assert SCRIPTS, "no examples found"
    missing = [s for s in SCRIPTS if s not in EXPECT]
    assert not missing, f"examples with no entry in EXPECT (what they must print): {missing}"
    assert not [s for s in EXPECT if s not in SCRIPTS], "EXPECT names an example that does not exist"


@pytest.mark.parametrize("script", SCRIPTS)
def test_docstring_names_its_command(script: str) -> None:
    cmds = docstring_commands(EXAMPLES / script)
    assert cmds, f"examples/{script}: the docstring gives no command (an indented line '.venv/bin/...')"
    for cmd in cmds:
        assert f"examples/{script}" in cmd, f"examples/{script}: the command {cmd!r} does not run it"


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s in EXPECT])
def test_example_runs(script: str, tmp_path: Path) -> None:
    cmds = docstring_commands(EXAMPLES / script)
    expected = EXPECT[script]
    assert len(cmds) >= len(expected), f"examples/{script}: expected {len(expected)} command(s), found {cmds}"
    for cmd, (status, needles) in zip(cmds, expected):
        argv = to_argv(cmd) + EXTRA_ARGS.get(script, lambda tmp: [])(tmp_path)
        r = run(argv)
        assert r.returncode == status, (f"`{cmd}` exited {r.returncode}, expected {status}; output:\n"
                                        f"{r.stdout}")
        for needle in needles:
            assert needle in r.stdout, f"`{cmd}` did not print {needle!r}; output:\n{r.stdout}"


def test_telemetry_example_writes_its_files(tmp_path: Path) -> None:
    r = run([sys.executable, str(EXAMPLES / "telemetry_snapshot.py"), str(tmp_path)])
    assert r.returncode == 0, r.stdout
    assert (tmp_path / "ignis-telemetry-snapshot.pickle").stat().st_size > 0
    png = tmp_path / "ignis-telemetry-timeline.png"
    if _has("matplotlib"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", r.stdout
    else:
        assert "timeline plot: skipped" in r.stdout and "pip install" in r.stdout
        assert not png.exists()
