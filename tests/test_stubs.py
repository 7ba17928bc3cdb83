"""Type stubs of the compiled modules: a type checker (mypy) sees real types through them.

Each compiled module ships a ``.pyi`` beside it (package data), written from its source by
``scripts/gen_stubs.py``. Checked here: the stubs match their sources; every name a stub
declares exists at run time; a typed snippet gets the types, not ``Any``
(``reveal_type``, and ``--disallow-any-expr``); the examples type-check."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import IMPORT_ROOT

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "setup.py"


def _compiled_from_pyx() -> list[str]:
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CYTHON_MODULES"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no CYTHON_MODULES list")


MODULES = _compiled_from_pyx()


def _stub_of(module: str) -> Path:
    mod = importlib.import_module(module) if not module.startswith("ignis.torch.") else None
    if mod is None:
        return Path(IMPORT_ROOT, *module.split(".")).with_suffix(".pyi")
    return Path(mod.__file__).parent / (module.rsplit(".", 1)[1] + ".pyi")


def test_the_stubs_match_their_sources():
    """scripts/gen_stubs.py --check: a source changed without its stub fails here."""
    if not (ROOT / "scripts" / "gen_stubs.py").is_file() or not (ROOT / "src" / "ignis").is_dir():
        pytest.skip("no source tree here")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_stubs.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout


@pytest.mark.parametrize("module", MODULES)
def test_each_compiled_module_has_its_stub_and_its_names_exist(module):
    """The stub lies beside the module that is imported (so a wheel ships it), and each name it
    declares, and each member of its classes, is there at run time."""
    stub = _stub_of(module)
    assert stub.is_file(), f"{module} has no stub at {stub}"
    if module.startswith("ignis.torch."):
        pytest.importorskip("torch", reason="the PyTorch front end's modules import torch")
    mod = importlib.import_module(module)
    tree = ast.parse(stub.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert hasattr(mod, node.name), f"{module}.{node.name} is in the stub, not in the module"
        elif isinstance(node, ast.AnnAssign):
            assert hasattr(mod, node.target.id), f"{module}.{node.target.id} is in the stub, not in the module"
        if isinstance(node, ast.ClassDef):
            cls = getattr(mod, node.name)
            for m in node.body:
                name = m.name if isinstance(m, ast.FunctionDef) else getattr(getattr(m, "target", None), "id", None)
                if name is not None and name not in ("__slots__",):
                    assert hasattr(cls, name), f"{module}.{node.name}.{name} is in the stub, not on the class"


def _mypy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """mypy with the repository's settings (pyproject.toml), on the ignis that the tests import."""
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install '.[test]'")
    env = dict(os.environ)
    src = ROOT / "src"
    if Path(IMPORT_ROOT) == src:  # the source tree built in place: found through MYPYPATH
        env["MYPYPATH"] = str(src)
    # else an installed ignis: mypy finds it (py.typed) in this interpreter's site-packages
    config = ["--config-file", str(ROOT / "pyproject.toml")] if (ROOT / "pyproject.toml").is_file() else []
    return subprocess.run([sys.executable, "-m", "mypy", *config, "--cache-dir", str(tmp_path / "mypy-cache"),
                           "--python-executable", sys.executable, "--no-error-summary", *args],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)


SNIPPET = '''
import numpy as np
import ignis as ig

a = ig.zeros((2, 3))
reveal_type(a)
reveal_type(a.shape)
reveal_type(a.dtype)
reveal_type(a.nbytes)
reveal_type(a.device)
reveal_type(a.to_numpy())
reveal_type(a.reshape(3, 2))
reveal_type(a[0])
reveal_type(ig.full((4,), 1.5, dtype="float32"))
reveal_type(ig.from_numpy(np.zeros(4, np.float32)))
reveal_type(ig.current_stream())
reveal_type(ig.current_stream().record())
reveal_type(ig.Device(0).create_stream())
reveal_type(a.use())
'''

EXPECTED = [
    "ignis.array.nvarray.NvArray",
    "tuple[int, ...]",
    "ignis.dtypes.DType",
    "int",
    "ignis.runtime.device.Device",
    "numpy.ndarray[",
    "ignis.array.nvarray.NvArray",
    "ignis.array.nvarray.NvArray",
    "ignis.array.nvarray.NvArray",
    "ignis.array.nvarray.NvArray",
    "ignis.runtime.stream.Stream",
    "ignis.runtime.event.Event",
    "ignis.runtime.stream.Stream",
    "ignis.array.nvarray.TrackedUse",
]


def test_a_type_checker_sees_the_types_of_the_compiled_api(tmp_path):
    """Without the stubs every line here reveals ``Any``."""
    (tmp_path / "snippet.py").write_text(SNIPPET)
    out = _mypy(tmp_path, "snippet.py")
    revealed = re.findall(r'Revealed type is "([^"]*)"', out.stdout)
    assert len(revealed) == len(EXPECTED), out.stdout + out.stderr
    for got, want in zip(revealed, EXPECTED):
        assert got.startswith(want), (got, want)


TYPED_USE = '''
import ignis as ig


def pipeline(n: int) -> float:
    dev = ig.Device(0)
    s = dev.create_stream()
    try:
        a = ig.zeros((n, 4), dtype="float32", stream=s)
        rows: tuple[int, ...] = a.shape
        b = a.reshape(rows[0] * 4)
        b.fill_(2.0, stream=s)
        done = s.record()
        ig.current_stream().wait(done)
        s.synchronize()
        total = b.nbytes / b.dtype.itemsize
        b.free()
        return total
    finally:
        s.close()
'''


def test_no_expression_of_typed_code_is_Any(tmp_path):
    """``--disallow-any-expr``: each expression of code using the array, stream and event API
    has a real type (an ``Any`` from a compiled module is an error). NumPy's arrays are left
    out: their own types hold ``Any`` (``ndarray[tuple[Any, ...], dtype[Any]]``)."""
    (tmp_path / "typed_use.py").write_text(TYPED_USE)
    out = _mypy(tmp_path, "--disallow-any-expr", "--strict", "typed_use.py")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_examples_type_check(tmp_path):
    examples = ROOT / "examples"
    if not examples.is_dir():
        pytest.skip("no examples here")
    out = _mypy(tmp_path, str(examples))
    assert out.returncode == 0, out.stdout + out.stderr
