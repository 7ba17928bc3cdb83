"""Layers without climbs back up (DESIGN.md, "Layers").

Every module under ``src/ignis`` belongs to one layer; each layer uses only
those below it. This test reads the source (``ast``, nothing is imported) and
checks that:

(a) no module imports from a higher layer. Every import counts, wherever it
    is (a function body too: a lazy import is still a dependency), except
    under ``if TYPE_CHECKING:``. The few arrows still pointing up are in
    ``ALLOWED_UPWARD``, each with its reason and the change that removes it;
    a new one fails, and so does an entry that no longer happens (delete it:
    the goal is an empty list).
(b) no module-level imports form a cycle (those run at import; an import in a
    function body runs later and cannot deadlock the import system). A parent
    package that Python imports first (``ignis.memory`` before
    ``ignis.memory.types``) is not an edge: a submodule importing a sibling
    would otherwise always close a loop through its package's ``__init__``.

The layer of a module is ``layer_of``'s answer; ``LAYERS`` is the picture of
DESIGN.md; the command line (layer 8) is the ``ignis/cli/`` package.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "ignis"

FOUNDATION = -1
CLI = 8
LAYER_NAMES = {FOUNDATION: "foundation", 0: "backends", 1: "runtime", 2: "memory", 3: "safety", 4: "arrays",
               5: "subsystems", 6: "front ends", 7: "telemetry", 8: "cli / facade"}

# Module (or package: it covers its submodules) -> layer; the longest name that matches wins.
LAYERS: dict[str, int] = {
    # foundation: imports nothing above itself
    "ignis.errors": FOUNDATION, "ignis.dtypes": FOUNDATION, "ignis.units": FOUNDATION,
    "ignis._types": FOUNDATION, "ignis._version": FOUNDATION, "ignis._environment": FOUNDATION,
    "ignis._cpython": FOUNDATION,  # CPython helpers the compiled modules cimport (a .pxd alone)
    "ignis._cython_shim": FOUNDATION,  # Cython's class decorators where Cython is absent
    "ignis._dlpack": FOUNDATION,  # the DLPack ABI (ctypes), shared by the array's export and interop's import
    "ignis.backends": 0,
    "ignis.runtime": 1,
    "ignis.memory": 2,
    "ignis.safety": 3,
    "ignis.array": 4,
    "ignis.io": 5, "ignis.collective": 5, "ignis.ipc": 5, "ignis.interop": 5,
    "ignis.torch": 6, "ignis.cupy": 6,
    "ignis.telemetry": 7,
    # the command line: the ignis/cli/ package
    "ignis.cli": CLI, "ignis.__main__": CLI,
    "ignis.pytest_plugin": CLI,  # pytest's entry into the command line's checks (ignis.cli.checks)
}
FACADE = "ignis"  # the public facade: it may import anything; below the cli, nothing may import it

# Upward imports that remain: (importer, imported) -> why, and the change that removes it.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    """The layer of ``module`` (a dotted name under ``ignis``)."""
    if module == FACADE:
        return CLI
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        layer = LAYERS.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    raise KeyError(f"{module} has no layer: add it (or its package) to LAYERS in {Path(__file__).name}, "
                   "as DESIGN.md draws it")


# -- reading the imports -------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    target: str      # the module imported (the package, for a name taken from its __init__)
    line: int
    top_level: bool  # runs when the importing module is imported (not inside a function)


def module_names() -> dict[str, Path]:
    """Every module of the package: name -> source file (for compiled ones, their C source)."""
    out: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    # compiled modules: ignis/memory/pool.pyx -> ignis.memory.pool; a .pxd alone declares
    # inline functions that its cimporters compile in (ignis/_cpython.pxd)
    for ext in ("*.pyx", "*.c", "*.pxd"):
        for path in sorted(PACKAGE.rglob(ext)):
            out.setdefault(".".join(path.relative_to(SRC).with_suffix("").parts), path)
    return out


_CY_IMPORT = re.compile(r"^([ \t]*)(from\s+\S+\s+c?import\b|c?import\s)")


def cython_imports(source: str) -> str:
    """The import statements of a Cython source (``.pyx`` / ``.pxd``) as Python that ``ast``
    reads, on their own lines: ``cimport`` counts as ``import`` (a compile-time dependency
    is a dependency); an indented import stays indented under a function, so it is not
    top level; one under ``if TYPE_CHECKING:`` is dropped. Every other line is blank."""
    lines = source.splitlines()
    out = [""] * len(lines)
    type_checking = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace():
            type_checking = line.startswith("if TYPE_CHECKING")
        m = _CY_IMPORT.match(line)
        if not m or type_checking:
            i += 1
            continue
        stmt = [line]
        while "".join(stmt).count("(") > "".join(stmt).count(")") or stmt[-1].rstrip().endswith("\\"):
            i += 1
            stmt.append(lines[i])
        text = " ".join(s.strip().rstrip("\\") for s in stmt)
        text = re.sub(r"\bcimport\b", "import", text)
        out[i - len(stmt) + 1] = f"def _(): {text}" if m.group(1) else text
        i += 1
    return "\n".join(out)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """The imports of Ignis modules in ``source`` (the text of ``module``), not counting
    those under ``if TYPE_CHECKING:``."""
    found: list[Import] = []

    def resolve(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                pkg = ".".join(base + ([node.module] if node.module else []))
            else:
                pkg = node.module or ""
            # ``from pkg import name``: the submodule if ``name`` is one, else pkg itself
            names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in known else pkg for a in node.names]
        out = []
        for name in names:
            if name.split(".")[0] != "ignis":
                continue
            while name not in known and "." in name:  # a name inside a module: the module
                name = name.rsplit(".", 1)[0]
            out.append(name)
        return out

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for c in child.orelse:
                    visit_one(c, top)
                continue
            visit_one(child, top)

    def visit_one(node: ast.AST, top: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(Import(t, node.lineno, top) for t in resolve(node))
        visit(node, top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), True)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    """Module -> its imports of other Ignis modules."""
    names = module_names()
    known = set(names)
    out: dict[str, list[Import]] = {}
    for m, p in names.items():
        if p.suffix == ".py":
            source = p.read_text()
        elif p.suffix == ".pyx":  # a compiled module: its .pyx and the .pxd that declares it
            pxd = p.with_suffix(".pxd")
            source = cython_imports(p.read_text())
            if pxd.exists():
                extra = cython_imports(pxd.read_text())
                source = source + "\n" + extra
        elif p.suffix == ".pxd":  # declarations alone
            source = cython_imports(p.read_text())
        else:
            continue
        out[m] = [i for i in imports_of(m, source, p.name == "__init__.py", known) if i.target != m]
    return out


def upward(graph: dict[str, list[Import]]) -> dict[tuple[str, str], list[int]]:
    """(importer, imported) -> lines, for every import of a higher layer."""
    out: dict[tuple[str, str], list[int]] = {}
    for m, imps in graph.items():
        if m == FACADE:
            continue
        for i in imps:
            if layer_of(i.target) > layer_of(m):
                out.setdefault((m, i.target), []).append(i.line)
    return out


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected
    group of module-level imports."""
    edges = {m: sorted({i.target for i in imps if i.top_level}) for m, imps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    out = []
    for group in groups:  # a shortest way from the group's first module back to itself
        inside, start = set(group), group[0]
        paths = {w: [start, w] for w in edges[start] if w in inside}
        todo = list(paths)
        while start not in paths:
            v = todo.pop(0)
            for w in edges[v]:
                if w in inside and w not in paths:
                    paths[w] = paths[v] + [w]
                    todo.append(w)
        out.append(paths[start])
    return out


# -- the checks --------------------------------------------------------------------------------
def test_every_module_has_a_layer(graph):
    for m in graph:
        layer_of(m)


def test_no_import_climbs_to_a_higher_layer(graph):
    found = upward(graph)
    new = {k: v for k, v in found.items() if k not in ALLOWED_UPWARD}
    lines = [f"  {a} (layer {layer_of(a)}, {LAYER_NAMES[layer_of(a)]}) imports {b} (layer {layer_of(b)}, "
             f"{LAYER_NAMES[layer_of(b)]}) at line(s) {', '.join(map(str, ls))}" for (a, b), ls in sorted(new.items())]
    assert not new, ("imports that climb to a higher layer (DESIGN.md: each layer uses only those below; move "
                     "the shared code down, or let the upper layer register itself):\n" + "\n".join(lines))


def test_the_allowlist_holds_only_what_still_happens(graph):
    stale = sorted(set(ALLOWED_UPWARD) - set(upward(graph)))
    assert not stale, f"these imports are gone: delete them from ALLOWED_UPWARD: {stale}"


def test_no_module_level_import_cycle(graph):
    found = cycles(graph)
    lines = []
    for cycle in found:
        hops = []
        for a, b in zip(cycle, cycle[1:]):
            line = next(i.line for i in graph[a] if i.target == b and i.top_level)
            hops.append(f"{a} (line {line})")
        lines.append("  " + " -> ".join(hops) + f" -> {cycle[-1]}")
    assert not found, "module-level import cycles:\n" + "\n".join(lines)


# Import circles inside one package that close only through an import in a function body
# (lazy), each with its reason. A new one fails, and so does an entry that no longer happens.
ALLOWED_LAZY_CIRCLES: dict[frozenset[str], str] = {
}


def _package_of(module: str) -> str:
    return module.rsplit(".", 1)[0]


def test_no_import_circle_inside_a_package_lazy_imports_included(graph):
    inner = {m: [Import(i.target, i.line, True) for i in imps
                 if _package_of(i.target) == _package_of(m) and i.target != _package_of(m)]
             for m, imps in graph.items()}
    found = {frozenset(c): c for c in cycles(inner)}
    new = [" -> ".join(c) for k, c in found.items() if k not in ALLOWED_LAZY_CIRCLES]
    assert not new, "import circles inside a package (lazy imports counted):\n  " + "\n  ".join(new)
    gone = [sorted(k) for k in ALLOWED_LAZY_CIRCLES if k not in found]
    assert not gone, f"these circles are gone: delete them from ALLOWED_LAZY_CIRCLES: {gone}"


# -- the reader itself -------------------------------------------------------------------------
def test_the_reader_counts_lazy_imports_and_skips_type_checking():
    source = ("from typing import TYPE_CHECKING\n"
              "from ..memory import Access\n"                    # a name from the package's __init__
              "from . import stream\n"                           # a sibling module
              "if TYPE_CHECKING:\n"
              "    from ..array import NvArray\n"                # for annotations only: not counted
              "else:\n"
              "    import ignis.units\n"
              "def f():\n"
              "    from ..telemetry.stats import memory_stats\n"  # lazy: counted, not module-level
              "class C:\n"
              "    from .. import _version\n")
    known = {"ignis", "ignis.memory", "ignis.runtime", "ignis.runtime.kernel", "ignis.runtime.stream",
             "ignis.array", "ignis.units", "ignis.telemetry", "ignis.telemetry.stats", "ignis._version"}
    got = {(i.target, i.line, i.top_level) for i in imports_of("ignis.runtime.kernel", source, False, known)}
    assert got == {("ignis.memory", 2, True), ("ignis.runtime.stream", 3, True), ("ignis.units", 7, True),
                   ("ignis.telemetry.stats", 9, False), ("ignis._version", 11, True)}
    g = {"ignis.runtime.kernel": [Import(t, ln, top) for t, ln, top in got]}
    assert upward(g) == {("ignis.runtime.kernel", "ignis.memory"): [2],
                         ("ignis.runtime.kernel", "ignis.telemetry.stats"): [9]}


def test_the_reader_reads_cython_imports_and_cimports():
    source = ("from libc.stdint cimport uintptr_t\n"
              "from ..runtime.stream cimport Stream\n"            # a cimport is a dependency
              "from .resource import (DeviceMemoryResource,\n"
              "                       check_request)\n"           # continued in parentheses
              "cdef extern from \"Python.h\":\n"                 # not an import
              "    void *PyLong_AsVoidPtr(object)\n"
              "cdef class P:\n"
              "    cdef object f(self):\n"
              "        from ..telemetry import stats\n"          # indented: not module-level
              "if TYPE_CHECKING:\n"
              "    from ..array import NvArray\n")
    known = {"ignis.memory", "ignis.memory.pool", "ignis.memory.resource", "ignis.runtime.stream",
             "ignis.telemetry", "ignis.telemetry.stats", "ignis.array"}
    got = {(i.target, i.line, i.top_level)
           for i in imports_of("ignis.memory.pool", cython_imports(source), False, known)}
    assert got == {("ignis.runtime.stream", 2, True), ("ignis.memory.resource", 3, True),
                   ("ignis.telemetry.stats", 9, False)}


def test_the_compiled_modules_are_in_the_graph(graph):
    assert {"ignis.memory.pool", "ignis.memory.resource", "ignis.memory.block", "ignis.runtime.stream"} <= set(graph)
    assert "ignis.memory.resource" in {i.target for i in graph["ignis.memory.pool"]}


def test_the_cycle_finder_reports_the_loop():
    g = {"ignis.a": [Import("ignis.b", 1, True)], "ignis.b": [Import("ignis.c", 3, True)],
         "ignis.c": [Import("ignis.a", 5, True), Import("ignis.d", 6, True)],
         "ignis.d": [Import("ignis.c", 2, False)]}  # lazy: no cycle through d
    assert cycles(g) == [["ignis.a", "ignis.b", "ignis.c", "ignis.a"]]


def test_layer_of_follows_the_picture():
    assert layer_of("ignis.errors") == layer_of("ignis._types") == FOUNDATION
    assert layer_of("ignis.memory.types") == 2 and layer_of("ignis.safety.contract") == 3
    assert layer_of("ignis.cli.io") == layer_of("ignis.cli.tour") == layer_of("ignis.cli.run") == CLI
    assert layer_of("ignis.telemetry.stats") == 7 and layer_of(FACADE) == CLI
    with pytest.raises(KeyError, match="no layer"):
        layer_of("ignis.newthing")


# -- what the layering rests on -----------------------------------------------------------------
def test_access_lives_in_the_foundation_and_keeps_its_public_homes():
    import ignis as ig
    from ignis import _types
    from ignis.memory import types

    assert _types.Access.__module__ == "ignis._types"
    assert ig.Access is ig.memory.Access is types.Access is _types.Access
    assert _types.Access.parse("read-write") is _types.Access.READ_WRITE


def test_upper_layers_plug_themselves_in():
    import ignis as ig
    from ignis.telemetry import _torch

    assert ig.torch.memory_views is _torch.torch_memory_views  # the guard's torch.cuda.memory_* answers


