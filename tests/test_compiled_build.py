"""The compiled build is the one in use: every module setup.py compiles (its ``.pyx``
modules and the plain-Python modules compiled as they are) loads as an extension,
never from a ``.py`` beside it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "setup.py"


def _listed(name: str) -> list[str]:
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"setup.py has no {name} list")


@pytest.mark.parametrize("module", _listed("CYTHON_MODULES") + _listed("PURE_PYTHON_MODULES"))
def test_each_compiled_module_loads_as_an_extension(module):
    if module.startswith("ignis.torch."):
        pytest.importorskip("torch", reason="the PyTorch front end's modules import torch")
    mod = importlib.import_module(module)
    assert mod.__file__.endswith((".so", ".pyd")), f"{module} loaded from {mod.__file__}: rebuild (setup.py build_ext)"


def test_the_sanitizers_records_are_extension_types():
    from ignis.safety import records as s
    r = s._Rec(1, "s", 1, "write", 16, 32, "op", None, 1, 0)
    assert not hasattr(r, "__dict__")  # fields at fixed offsets, not an instance dictionary
    assert (r.lo, r.hi, r.per, r.ch) == (16, 32, 0, 0)
    with pytest.raises(AttributeError):
        r.kind = "read"  # read-only from Python: the sanitizer's compiled code is its one writer
