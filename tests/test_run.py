"""``ignis run``: real scripts run under the checks, in a subprocess, with the exit status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import IMPORT_ROOT

RACY = """
import ignis as ig
d = ig.Device(0)
a, b = d.create_stream(), d.create_stream()
x = ig.empty(1024, "float32", stream=a)
y = ig.empty(1024, "float32", stream=b)
d.synchronize()
ig.kernels.fill(x, 1.0, stream=a)
ig.kernels.copy(y, x, stream=b)   # no wait: a race under manual ordering
d.synchronize()
print("script done")
"""

CORRECT = """
import ignis as ig
d = ig.Device(0)
a, b = d.create_stream(), d.create_stream()
x = ig.empty(1024, "float32", stream=a)
y = ig.empty(1024, "float32", stream=b)
d.synchronize()
ig.kernels.fill(x, 1.0, stream=a)
b.wait(a.record())
ig.kernels.copy(y, x, stream=b)
assert (y.to_numpy(stream=b) == 1.0).all()
print("script done")
"""

LEAKY = """
import ignis as ig
CACHE = []
def load():
    CACHE.append(ig.zeros(256, tag="forgotten"))
load()
keep_alive = CACHE  # a module-level cache that outlives the script's own names
import builtins
builtins._ignis_leak = CACHE
print("script done")
"""


def run(tmp_path, body: str, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT + os.pathsep + env_path(), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ignis", "run", *flags, str(script), "--flag"],
                          capture_output=True, text=True, env=env, timeout=120)


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


RACY_LOOP = """
import ignis as ig
d = ig.Device(0)
a, b = d.create_stream(), d.create_stream()
x = ig.empty(1024, "float32", stream=a)
y = ig.empty(1024, "float32", stream=b)
d.synchronize()
def step():
    ig.kernels.fill(x, 1.0, stream=a)
    ig.kernels.copy(y, x, stream=b)   # no wait: a race under manual ordering
for _ in range(100):
    step()
d.synchronize()
print("script done")
"""

MANUAL_ITSELF = "import ignis as ig\nig.set_ordering('manual')\n" + RACY

RELIES_ON_AUTO = """
import numpy as np
import ignis as ig
d = ig.Device(0)
a, b = d.create_stream(), d.create_stream()
for i in range(20):
    x = ig.empty(1 << 14, "float32", stream=a)
    y = ig.empty(1 << 14, "float32", stream=b)
    ig.kernels.fill(x, float(i), stream=a)
    ig.kernels.copy(y, x, stream=b)     # auto ordering queues the wait
    assert (y.to_numpy(stream=b) == i).all(), "wrong result"
print("script done", ig.get_ordering())
"""


def test_sanitize_keeps_the_scripts_ordering(tmp_path):
    # ignis run --sanitize no longer switches to manual: the script means what it means
    # without the flag, as under IGNIS_SANITIZE=1.
    p = run(tmp_path, RACY, "--sanitize")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "script done" in p.stdout and "no problems found" in p.stderr
    jitter = {"IGNIS_EMU_JITTER": "7:300"}
    p = run(tmp_path, RELIES_ON_AUTO, "--sanitize", env=jitter)
    assert p.returncode == 0 and "script done auto" in p.stdout, p.stdout + p.stderr
    p = run(tmp_path, RELIES_ON_AUTO, env={**jitter, "IGNIS_SANITIZE": "1"})
    assert p.returncode == 0 and "script done auto" in p.stdout, p.stdout + p.stderr


def test_sanitize_finds_the_race_under_manual_ordering(tmp_path):
    for flags, body in ((("--sanitize", "--ordering", "manual"), RACY), (("--sanitize",), MANUAL_ITSELF)):
        p = run(tmp_path, body, *flags)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "script done" in p.stdout
        assert "read-after-write race" in p.stderr and "1 problem(s) found" in p.stderr
        assert "script.py" in p.stderr  # the user's stack


def test_reports_are_grouped_by_site_pair_with_the_users_frames(tmp_path):
    p = run(tmp_path, RACY_LOOP, "--sanitize", "--ordering", "manual")
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr
    # 100 read-after-write races and 99 write-after-read races: two groups, counted
    assert "2 problem(s) found (199 report(s)" in err, err
    assert "(seen 100 times)" in err and "(seen 99 times)" in err
    assert len(err.splitlines()) < 60
    assert "in step" in err and "script.py" in err
    assert "runpy" not in err and "/ignis/" not in err.split("== ignis run report ==")[1].split("memory:")[0]


def test_sanitize_passes_a_correct_script(tmp_path):
    p = run(tmp_path, CORRECT, "--sanitize", "--ordering", "manual")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no problems found" in p.stderr and "memory:" in p.stderr


def test_a_script_without_torch_does_not_import_it(tmp_path):
    p = run(tmp_path, "import sys\nprint('torch' in sys.modules)\n", "--sanitize")
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr


def test_a_torch_script_without_cuda_runs_unchanged(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")
    body = """
import torch
x = torch.arange(10.0)
print("sum", float((x * 2).sum()))
"""
    p = run(tmp_path, body, "--sanitize")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sum 90.0" in p.stdout
    assert "nothing on the CPU is checked" in p.stderr or "op(s) on CUDA tensors checked" in p.stderr


def test_leaks_are_reported_with_sites(tmp_path):
    p = run(tmp_path, LEAKY, "--leaks")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "forgotten" in p.stderr and "allocated at" in p.stderr and "in load" in p.stderr


def test_script_arguments_and_exit_status(tmp_path):
    p = run(tmp_path, "import sys\nprint(sys.argv[1:])\nsys.exit(3)\n")
    assert p.returncode == 3 and "['--flag']" in p.stdout


def test_missing_script(tmp_path):
    from ignis.cli import main
    assert main(["run", str(tmp_path / "nope.py")]) == 2

OVERRUN = """
import ignis as ig
def shifted(dst, v, start, n):
    dst[int(start):int(start) + int(n)] = v
src = r'''extern "C" __global__ void shifted_fill(float* dst, float v, long long start, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) dst[start + i] = v; }'''
k = ig.Kernel(src, "shifted_fill", ("write", "float32", "int64", "int64"), shifted)
x = ig.empty(64, "float32", tag="activations")
ig.launch(k, 1, 64, x, 1.0, 60, 8)   # four elements past the end
ig.Device(0).synchronize()
KEEP = x                              # still alive at exit: the guard checks it there
print("script done")
"""


def test_guard_finds_the_overrun(tmp_path):
    p = run(tmp_path, OVERRUN, "--guard")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "OutOfBoundsError" in p.stderr and "activations" in p.stderr
    assert p.stderr.count("OutOfBoundsError") == 1, p.stderr  # the report, not the report and again at exit


def test_ignis_sanitize_env_also_turns_on_the_pytorch_front_end():
    pytest.importorskip("torch", reason="the PyTorch front end needs torch")
    code = ("import sys, ignis; assert 'torch' not in sys.modules; import torch, ignis.torch as it; "
            "print('enabled', it.is_enabled())")
    env = dict(os.environ, IGNIS_SANITIZE="1", IGNIS_BACKEND="emulated")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "enabled True" in out.stdout


def test_reports_show_no_frame_of_the_ignis_command_itself(tmp_path):
    from pathlib import Path
    launcher = Path(sys.executable).parent / "ignis"
    if not launcher.exists():
        pytest.skip("the ignis console script is not installed beside this interpreter")
    script = Path(__file__).parent.parent / "examples" / "stream_race.py"
    env = dict(os.environ, IGNIS_BACKEND="emulated")
    out = subprocess.run([str(launcher), "run", "--sanitize", "--ordering", "manual", str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "read-after-write race" in out.stderr
    assert "stream_race.py\", line 30" in out.stderr and str(launcher) not in out.stderr


def test_leaks_never_say_none_while_memory_is_still_allocated(tmp_path):
    script = tmp_path / "raw_block.py"
    script.write_text("import builtins, ignis as ig\n"
                      "mr = ig.get_current_resource()\n"
                      "builtins._kept = mr.allocate(4096, ig.Device(0).default_stream)\n")
    env = dict(os.environ, IGNIS_BACKEND="emulated")
    out = subprocess.run([sys.executable, "-m", "ignis", "run", "--leaks", str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "leaks: none" not in out.stderr and "4.0 KiB on device 0 are still allocated outside arrays" in out.stderr


USE_AFTER_FREE = """
import ignis as ig
x = ig.zeros(256)
x.free()
ig.kernels.fill(x, 1.0)   # UseAfterFreeError: the check stops the script
"""


@pytest.mark.parametrize("flags", [("--sanitize",), ()])
def test_an_error_the_checks_raised_is_a_problem_in_the_report(tmp_path, flags):
    """A script that dies of UseAfterFreeError: the report counts it and shows it, and never
    says "no problems found"."""
    p = run(tmp_path, USE_AFTER_FREE, *flags)
    assert p.returncode == 1, p.stdout + p.stderr
    report = p.stderr.split("== ignis run report ==")[1]
    assert "no problems found" not in report, report
    assert "UseAfterFreeError" in report and "it was freed" in report, report
    if flags:
        assert "ignis sanitizer: 1 problem(s) found" in report and "raised to the program" in report


WRITE_AFTER_FREE_THEN_CLOSE = """
import ignis as ig
d = ig.Device(0)
s = d.create_stream()
x = ig.zeros(1024, stream=s, tag="scratch")
ptr = x.device_ptr
x.free()                                    # poisoned, quarantined; its check waits in s's batch
d.backend.memset_d8_async(ptr, 7, 16, s.handle)   # a write through a stale pointer
s.synchronize()
s.close()                                   # the stream of the pending check is gone
print("script done")
"""


def test_guard_final_check_survives_a_closed_stream(tmp_path):
    p = run(tmp_path, WRITE_AFTER_FREE_THEN_CLOSE, "--guard")
    assert p.returncode == 1, p.stdout + p.stderr
    report = p.stderr.split("== ignis run report ==")[1]
    assert "UseAfterFreeError" in report and "written after it was freed" in report, report
    assert "no problems found" not in report and "failed" not in report, report


GLOBAL_AND_A_FUNCTION = """
import ignis as ig
weights = ig.zeros(1024)       # a global; the module's function below makes a reference cycle
def total():
    return weights.nbytes
print("script done", total())
"""


def test_leaks_passes_a_correct_script_whose_globals_the_collector_frees(tmp_path):
    """The script's globals die in a reference cycle (a function's __globals__): the cyclic
    collector frees the array, and its memory must be back before the report reads the figures."""
    p = run(tmp_path, GLOBAL_AND_A_FUNCTION, "--leaks")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "leaks: none" in p.stderr and "live 0 B" in p.stderr.split("device 0:")[1].splitlines()[0], p.stderr


# -- the script runs as Python runs it ------------------------------------------------------------
def run_in(cwd, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT + os.pathsep + env_path(), IGNIS_BACKEND="emulated", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ignis", "run", *argv], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_failing_scripts_traceback_starts_at_its_own_frames(tmp_path):
    (tmp_path / "fails.py").write_text("def f():\n    raise ValueError('boom')\nf()\n")
    p = run_in(tmp_path, "fails.py")
    assert p.returncode == 1, p.stderr
    tb = p.stderr.split("== ignis run report ==")[0]
    frames = [ln for ln in tb.splitlines() if ln.startswith("  File ")]
    assert tb.startswith("Traceback (most recent call last):") and "ValueError: boom" in tb, tb
    assert len(frames) == 2 and all("fails.py" in f for f in frames), tb  # no runpy, no Ignis


def test_a_script_that_does_not_compile_gets_no_report(tmp_path):
    (tmp_path / "broken.py").write_text("x = (\n")
    p = run_in(tmp_path, "--sanitize", "broken.py")
    assert p.returncode == 1
    assert "SyntaxError" in p.stderr and "broken.py" in p.stderr, p.stderr
    assert "ignis run report" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_keyboard_interrupt_exits_130(tmp_path):
    (tmp_path / "interrupted.py").write_text("raise KeyboardInterrupt\n")
    p = run_in(tmp_path, "interrupted.py")
    assert p.returncode == 130 and "KeyboardInterrupt" in p.stderr, p.stderr


def test_file_is_absolute_and_argv_as_given(tmp_path):
    (tmp_path / "where.py").write_text("import sys\nprint(__file__)\nprint(sys.argv)\nprint(__name__)\n"
                                       "print(sys.modules['__main__'].__file__)\nsys.exit('bye')\n")
    p = run_in(tmp_path, "where.py", "x")
    lines = p.stdout.splitlines()
    assert lines[0] == str(tmp_path / "where.py") == lines[3], p.stdout + p.stderr
    assert lines[1] == "['where.py', 'x']" and lines[2] == "__main__"
    assert p.returncode == 1 and "bye" in p.stderr  # sys.exit(message): printed, status 1, as Python


@pytest.mark.parametrize("argv, message", [
    (["run", "--bogus", "x.py"], "unrecognized arguments: --bogus"),
    (["run"], "nothing to run: give a Python script"),
    (["run", "--sanitize"], "nothing to run: give a Python script"),
    (["run", "-m"], "-m needs the name of a module"),
    (["demo", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_run_usage_errors_show_the_commands_usage(capsys, argv, message):
    from ignis.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: ignis {argv[0]} ") and message in err, err


def test_a_directory_is_not_a_script(tmp_path, capsys):
    from ignis.cli import main
    assert main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"ignis run: {tmp_path} is a directory with no __main__.py, not a script", err


def test_a_folder_or_zip_with_a_main_runs_as_python_runs_it(tmp_path):
    import zipfile
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import sys\nprint('main of', __name__, sys.argv[1:])\n")
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as z:
        z.write(app / "__main__.py", "__main__.py")
    for target in ("app", "app.pyz"):
        p = run_in(tmp_path, target, "x")
        assert p.returncode == 0 and p.stdout.strip() == "main of __main__ ['x']", p.stdout + p.stderr


LEAKS_AND_GLOBALS = """
import builtins
import ignis as ig
CACHE = []
def load():
    for _ in range(5):
        CACHE.append(ig.zeros(256, tag="forgotten"))
load()
builtins._kept = CACHE          # still alive once the globals are gone: five leaks, one site
weights = ig.zeros(1024)        # held by a global: listed, not a problem
class Model:
    pass
model = Model()
model.bias = ig.ones(8)         # held by a global, through an object
print("script done")
"""


def test_leaks_groups_a_sites_arrays_and_lists_what_globals_held(tmp_path):
    p = run(tmp_path, LEAKS_AND_GLOBALS, "--leaks")
    assert p.returncode == 1, p.stdout + p.stderr
    report = p.stderr.split("== ignis run report ==")[1]
    assert "leaks: 5 array(s), 5.0 KiB, still alive after the script finished" in report, report
    assert "from 1 allocation site(s)" in report and report.count("allocated at:") == 1, report
    assert "5 array(s), 5.0 KiB: [256] float32" in report and "held by the global(s) CACHE" in report, report
    assert "2 array(s), 4.0 KiB, were held by the script's globals" in report, report
    assert "weights: 1 array(s), 4.0 KiB" in report and "model: 1 array(s), 32 B" in report, report


# -- module mode: ignis run -m MODULE, as python -m ---------------------------------------------
def test_module_mode_runs_a_module_as_python_m(tmp_path):
    body = "import sys\nprint(__name__, __file__, sys.argv, sys.path[0])\n"
    (tmp_path / "tool.py").write_text(body)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=env_path())
    for module in ("tool", "pkg"):
        p = run_in(tmp_path, "--sanitize", "-m", module, "a", "--sanitize")
        expected = subprocess.run([sys.executable, "-m", module, "a", "--sanitize"], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60).stdout
        assert p.returncode == 0, p.stderr
        assert p.stdout == expected and "__main__" in expected, (p.stdout, expected)
        assert "ignis sanitizer: no problems found" in p.stderr


def test_module_mode_reports_what_the_module_did(tmp_path):
    (tmp_path / "racy.py").write_text(textwrap.dedent(RACY))
    p = run_in(tmp_path, "--sanitize", "--ordering", "manual", "-m", "racy")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "script done" in p.stdout and "read-after-write race" in p.stderr and "racy.py" in p.stderr


def test_module_mode_without_such_a_module(tmp_path):
    p = run_in(tmp_path, "-m", "no_such_module_here")
    assert p.returncode == 2 and p.stderr.strip() == "ignis run: no module named 'no_such_module_here'", p.stderr
