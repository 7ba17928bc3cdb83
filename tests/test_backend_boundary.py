"""Nothing above the backends layer branches on which backend it runs on.

Every difference between backends is a method or a capability of the Backend
protocol (``ignis/backends/base.py``: ``host_memory``, ``host_kernels``,
``cuda_driver``, ``gpu_timings``, ``host_view``...). This test reads every
module of ``ignis`` outside ``ignis/backends/`` (the Cython sources of the
compiled modules too, line by line) and fails on:

- a comparison of a backend's name with ``"cuda"`` or ``"emulated"``: ``x.name
  == "emulated"``, ``backend_name() != "cuda"``, ``report["backend"] ==
  "emulated"``, ``name in ("cuda", ...)``, or a local name assigned from one of
  those (``ig = get_backend().name`` ... ``ig == "cuda"``);
- a use of a backend class (``isinstance(b, EmulatedBackend)``, ``CudaBackend``);
- an import of a backend's own module (``ignis.backends.emulated``, ``.cuda``,
  ``.vmm_*``): only ``ignis.backends`` chooses a backend by name.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ignis"  # the source text (the .pyx files too)
BACKEND_NAMES = {"cuda", "emulated"}
BACKEND_CLASSES = {"EmulatedBackend", "CudaBackend", "EmulatedVmm", "CudaVmm"}
BACKEND_MODULES = {"emulated", "cuda", "vmm_emulated", "vmm_cuda", "_cu"}


def _names_a_backend(node: ast.AST, derived: set[str]) -> bool:
    """``node`` evaluates to a backend's name (as far as a reading can tell)."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        return True
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "backend_name") or \
            (isinstance(f, ast.Attribute) and f.attr == "backend_name")
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value == "backend"
    return isinstance(node, ast.Name) and node.id in derived


def _is_backend_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_backend_literal(e) for e in node.elts)
    return False


def _derived_names(scope: ast.AST) -> set[str]:
    """Local names assigned from a backend's name anywhere in ``scope``."""
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _names_a_backend(node.value, out):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id not in out:
                        out.add(t.id)
                        changed = True
    return out


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Each backend-name branch, backend-class use or backend-module import in ``source``."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    for scope in scopes:
        derived = _derived_names(scope)
        for node in ast.walk(scope):
            if id(node) in seen:
                continue
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_backend_literal(s) for s in sides) and any(_names_a_backend(s, derived) for s in sides):
                    seen.add(id(node))
                    found.append(f"{filename}:{node.lineno}: compares a backend's name: {ast.unparse(node)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in BACKEND_CLASSES:
            found.append(f"{filename}:{node.lineno}: uses the backend class {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in BACKEND_CLASSES:
            found.append(f"{filename}:{node.lineno}: uses the backend class {node.attr}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            parts = mod.split(".")
            if "backends" in parts and parts[-1] in BACKEND_MODULES:
                found.append(f"{filename}:{node.lineno}: imports the backend module {mod}")
            elif parts[-1] == "backends":
                for alias in node.names:
                    if alias.name in BACKEND_MODULES | BACKEND_CLASSES:
                        found.append(f"{filename}:{node.lineno}: imports {alias.name} from {mod}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if "backends" in parts and parts[-1] in BACKEND_MODULES:
                    found.append(f"{filename}:{node.lineno}: imports the backend module {alias.name}")
    return found


def _modules_above_backends(suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    out = []
    for root, dirs, files in os.walk(SRC):
        dirs[:] = [d for d in dirs if d != "__pycache__" and Path(root, d) != SRC / "backends"]
        out += [Path(root, f) for f in files if f.endswith(suffixes)]
    return sorted(out)


def test_nothing_above_the_backends_layer_branches_on_a_backend_name():
    files = _modules_above_backends()
    assert len(files) > 50 and not any("backends" in f.relative_to(SRC).parts for f in files)
    found = [v for f in files for v in violations(f.read_text(), str(f.relative_to(SRC.parent)))]
    compiled = _modules_above_backends((".pyx", ".pxd"))
    assert any(f.name == "resource.pyx" for f in compiled)
    found += [v for f in compiled for v in cython_violations(f.read_text(), str(f.relative_to(SRC.parent)))]
    assert not found, "ask the Backend protocol (a capability or a method) instead:\n  " + "\n  ".join(found)


# Cython sources (the compiled memory layer: ignis/memory/*.pyx, ignis/runtime/stream.pyx) are
# not Python that ``ast`` reads, so they are read line by line: a comparison with a backend's
# name as a string literal, a backend class, or an import of a backend's own module.
_CY_NAME_COMPARE = re.compile(r"""(?:[!=]=|\bin)\s*[(\[{]?\s*["'](?:cuda|emulated)["']|["'](?:cuda|emulated)["']\s*[!=]=""")
_CY_CLASS = re.compile(r"\b(" + "|".join(sorted(BACKEND_CLASSES)) + r")\b")
_CY_MODULE = re.compile(r"^\s*(?:from\s+\S*\bbackends\.(?:" + "|".join(sorted(BACKEND_MODULES)) +
                        r")\b|from\s+\S*\bbackends\s+c?import\s.*\b(?:" + "|".join(sorted(BACKEND_MODULES)) +
                        r")\b|c?import\s+\S*\bbackends\.(?:" + "|".join(sorted(BACKEND_MODULES)) + r")\b)")


def cython_violations(source: str, filename: str = "<source>") -> list[str]:
    """Each backend-name comparison, backend-class use or backend-module import in a Cython source."""
    found = []
    for n, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if _CY_NAME_COMPARE.search(code):
            found.append(f"{filename}:{n}: compares with a backend's name: {line.strip()}")
        m = _CY_CLASS.search(code)
        if m:
            found.append(f"{filename}:{n}: uses the backend class {m.group(1)}")
        if _CY_MODULE.search(code):
            found.append(f"{filename}:{n}: imports a backend's module: {line.strip()}")
    return found


@pytest.mark.parametrize("code", [
    'if self._backend.name == "emulated":',
    'cdef bint emu = backend.name in ("emulated",)',
    'if "cuda" != b.name: pass',
    'if isinstance(b, CudaBackend):',
    'from ..backends.emulated import ALIGNMENT',
    'from ..backends cimport cuda',
])
def test_the_cython_scan_catches_each_kind_of_backend_branch(code):
    assert cython_violations(code), code


@pytest.mark.parametrize("code", [
    'if self._backend.host_memory:',
    'from ..backends import get_backend',
    'x = 1  # not for the "emulated" == name case',
])
def test_the_cython_scan_leaves_other_lines_alone(code):
    assert not cython_violations(code), code


@pytest.mark.parametrize("code", [
    'if backend.name == "emulated": pass',
    'x = dev.backend.name != "cuda"',
    'def f():\n    ig = get_backend().name\n    return "nccl" if ig == "cuda" else "gloo"',
    'ok = backend_name() in ("cuda",)',
    'if report["backend"] == "emulated": pass',
    'if "emulated" == b.name: pass',
    'isinstance(b, EmulatedBackend)',
    'from ..backends.emulated import ALIGNMENT',
    'from ..backends import cuda',
    'import ignis.backends.vmm_emulated',
])
def test_the_scan_catches_each_kind_of_backend_branch(code):
    assert violations(code), code


@pytest.mark.parametrize("code", [
    'if backend.host_memory: pass',
    'if device_type == "cuda": pass',            # PyTorch's device type, not an Ignis backend
    'if op.name == "send": pass',
    'name = str(transport).lower()\nif name == "emulated": pass',  # a collective transport's name
    'from ..backends import get_backend',
])
def test_the_scan_leaves_other_comparisons_alone(code):
    assert not violations(code), code


def test_the_backends_state_their_differences_as_capabilities():
    from ignis.backends.base import Backend
    from ignis.backends.cuda import CudaBackend
    from ignis.backends.emulated import EmulatedBackend
    caps = ("host_memory", "host_kernels", "cuda_driver", "gpu_timings")
    assert {c: getattr(EmulatedBackend, c) for c in caps} == \
        {"host_memory": True, "host_kernels": True, "cuda_driver": False, "gpu_timings": False}
    assert {c: getattr(CudaBackend, c) for c in caps} == \
        {"host_memory": False, "host_kernels": False, "cuda_driver": True, "gpu_timings": True}
    assert not any(getattr(Backend, c) for c in caps)


@pytest.mark.parametrize("call", [
    lambda b: b.host_view(4096, 16), lambda b: b.host_address(4096), lambda b: b.allocation_view(4096),
    lambda b: b.adopt_host_memory(0, 4096, 16), lambda b: b.release_host_memory(0, 4096),
])
def test_host_memory_methods_raise_unsupported_where_memory_is_not_host_memory(call):
    from ignis.backends.base import Backend
    from ignis.errors import UnsupportedError

    class NotHost(Backend):
        name = "not-host"

    with pytest.raises(UnsupportedError, match="'not-host' backend"):
        call(NotHost())
