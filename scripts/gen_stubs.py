"""Write the type stubs (``.pyi``) of Ignis's Cython modules from their sources.

    python scripts/gen_stubs.py           # write src/ignis/**/<module>.pyi
    python scripts/gen_stubs.py --check   # exit 1, naming the files, where a stub differs

A compiled module is opaque to a type checker (``ig.zeros(...)`` would be ``Any``); its stub
gives the types its ``.pyx`` already states. The stub of a module is made from its ``.pyx``
(the public functions, classes, methods and properties, with their annotations; bodies and
defaults become ``...``) and its ``.pxd`` (the ``cdef public`` / ``cdef readonly``
attributes, typed from the C type, or from ``ATTRIBUTE_TYPES`` for an ``object`` field).
A public name without a type (a parameter-less return annotation, an ``object`` attribute
missing from the table) stops the script, naming it: annotate the source. The modules
compiled from plain Python (setup.py's PURE_PYTHON_MODULES) need no stub: their ``.py``
ships beside the extension and a type checker reads it. tests/test_stubs.py runs
``--check``, so a source changed without its stub fails the suite.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# setup.py's CYTHON_MODULES: read, not imported (setup.py runs setup() on import).
_setup = ast.parse((ROOT / "setup.py").read_text())
MODULES: list[str] = next(list(ast.literal_eval(n.value)) for n in _setup.body if isinstance(n, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == "CYTHON_MODULES" for t in n.targets))

# Types of the public attributes declared ``object`` in a .pxd: module -> class -> name -> type.
ATTRIBUTE_TYPES: dict[str, dict[str, dict[str, str]]] = {
    "ignis.array.nvarray": {
        "NvArray": {"id": "int", "shape": "tuple[int, ...]", "dtype": "DType", "device": "Device", "stream": "Stream",
                    "owner": "str", "ref_count": "int", "created_at": "float", "numel": "int", "nbytes": "int"},
        "TrackedUse": {"stream": "Stream", "access": "Access"}},
    "ignis.memory.block": {"DeviceBlock": {
        "ptr": "int", "alloc_stream": "Stream", "bytes": "int", "requested": "int", "tag": "str",
        "generation": "int", "state": "BlockState"}},
    "ignis.backends.direct": {"DirectCalls": {
        "backend": "Any", "current": "Any", "epoch": "list[int] | None"}},
    "ignis.memory.hooks": {"Hooks": {
        "checker": "object | None", "recorder": "Callable[[str, Any, int, int, Any, Any], None] | None",
        "format_frames": "Callable[[Any], str] | None"}},
    "ignis.safety.records": {"_Rec": {"stream_id": "int | str", "frames": "Any", "gen": "int"}},
    "ignis.runtime.stream": {"Stream": {
        "handle": "int", "device": "Device", "id": "int", "ordering": "str"}},
    "ignis.runtime.kernel": {"Kernel": {
        "source": "str | None", "name": "str", "host_impl": "Callable[..., None] | None"}},
    "ignis.memory.resource": {
        "EventPool": {"generation": "int", "state": "DeviceState"},
        "DeviceMemoryResource": {"device": "Device"}},
    "ignis.memory.pool": {"PoolResource": {"upstream": "DeviceMemoryResource"}},
    "ignis.memory.guard_alloc": {"State": {
        "opts": "dict[str, Any] | None", "lock": "Any", "torch": "bool", "cupy": "bool", "lib": "Any",
        "problems": "list[Any]", "groups": "dict[Any, Any]", "tls": "Any", "last_live": "float", "atexit": "bool",
        "hooks": "list[Any]", "saved": "dict[str, Any]", "tag": "str",
        "graph_alloc": "Callable[[int, int], int] | None", "current_stream": "Callable[[int], int] | None"}},
    "ignis.memory.guard_base": {"GuardBase": {
        "upstream": "DeviceMemoryResource", "quarantine_count": "int | None", "quarantine_bytes": "int | None",
        "stack_depth": "int"}},
}

PROBLEMS: list[str] = []  # what stops the script, all said at once

# Private members a stub keeps: those a Protocol of the package requires (NvArray satisfies
# ignis.safety._array.SafeArray, which the ownership contract and GpuRef take).
PRIVATE_MEMBERS: dict[str, dict[str, set[str]]] = {
    "ignis.array.nvarray": {"NvArray": {"_lock", "_root", "_set_owner", "_check_live"}},
}

# Imports the types of ATTRIBUTE_TYPES need, by module.
ATTRIBUTE_IMPORTS: dict[str, list[str]] = {
    "ignis.memory.resource": ["from ..runtime.device import DeviceState"],
}

C_TYPES = {"bint": "bool", "int": "int", "Py_ssize_t": "int", "size_t": "int", "long": "int", "long long": "int",
           "unsigned long long": "int", "unsigned long": "int", "unsigned int": "int", "double": "float",
           "float": "float", "dict": "dict[Any, Any]", "list": "list[Any]", "tuple": "tuple[Any, ...]",
           "str": "str", "bytes": "bytes"}

HEADER = ('# Type stub of the compiled module {module} (its source: {source}).\n'
          '# Written by scripts/gen_stubs.py from that source; do not edit by hand.\n')


# -- a lexer for Cython source, enough to find the logical lines outside strings and comments --

_STRING_START = re.compile(r"""(?i)([rbuf]{0,2})('''|\"\"\"|'|")""")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(indent, text) of each logical line: continuation lines joined, comments dropped,
    strings kept as written."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    depth = 0
    i, n = 0, len(text)
    line_start = True
    indent = 0
    cur: list[str] = []
    while i < n:
        c = text[i]
        if line_start and not buf and not cur:
            j = i
            while j < n and text[j] in " \t":
                j += 1
            indent = j - i
            i = j
            line_start = False
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        m = _STRING_START.match(text, i) if c in "'\"rRbBuUfF" else None
        if m and (c in "'\"" or (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            q = m.group(2)
            j = m.end()
            while j < n:
                if text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(q, j):
                    j += len(q)
                    break
                j += 1
            cur.append(text[i:j])
            i = j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i += 2
            continue
        if c == "\n":
            if depth > 0:
                cur.append(" ")
                i += 1
                continue
            line = "".join(cur).strip()
            if line:
                out.append((indent, line))
            cur = []
            line_start = True
            i += 1
            continue
        cur.append(c)
        i += 1
    line = "".join(cur).strip()
    if line:
        out.append((indent, line))
    return out


_INCLUDE = re.compile(r'^include\s+"([^"]+)"', re.M)


def with_includes(pyx: Path) -> str:
    """The text of ``pyx`` with each module-level ``include "file.pxi"`` replaced by that
    file's text (what Cython compiles: a module may be split by concern into .pxi parts)."""
    return _INCLUDE.sub(lambda m: with_includes(pyx.parent / m.group(1)), pyx.read_text())


# -- the skeleton: the .pyx's Python-visible declarations, as Python source -----------------------

def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


_DEF = re.compile(r"^(?:async\s+)?def\s+(\w+)\s*\(")
_CLASS = re.compile(r"^(?:cdef\s+)?class\s+(\w+)\s*(\([^)]*\))?\s*:")
_CPDEF = re.compile(r"^cpdef\s+(.*?)\b(\w+)\s*\((.*)\)\s*(?:(?:except|noexcept)\b[^:]*?)?\s*(?:nogil)?\s*:$")


def _cpdef(line: str) -> "re.Match[str] | None":
    """``_CPDEF``'s match of a ``cpdef`` line; a ``cpdef`` line it cannot read stops the script."""
    if not line.startswith("cpdef"):
        return None
    m = _CPDEF.match(line)
    if m is None:
        raise SystemExit(f"gen_stubs: cannot read the cpdef line {line!r}: extend _CPDEF")
    return m


def _cpdef_as_def(m: "re.Match[str]") -> str:
    """A ``cpdef [ctype] name(args):`` line (``_CPDEF``'s match) as the Python ``def`` it exposes:
    C types as their Python types, ``object`` and an untyped return as ``Any``, a class kept; a
    default as ``...``; ``not None`` dropped."""
    def py(ctype: str) -> str:
        ctype = " ".join(ctype.split())
        return "Any" if ctype in ("", "object") else C_TYPES.get(ctype, ctype)
    args = []
    for arg in (a.strip() for a in m.group(3).split(",") if a.strip()):
        arg, eq, _ = arg.partition("=")
        words = arg.replace(" not None", "").split()
        name, ctype = words[-1], " ".join(words[:-1])
        args.append(name if name == "self" else f"{name}: {py(ctype)}{'=...' if eq else ''}")
    return f"def {m.group(2)}({', '.join(args)}) -> {py(m.group(1))}:"


_CIMPORT = re.compile(r"^from\s+(\S+)\s+cimport\s+(.+)$")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*(?::\s*([^=]+?))?\s*=\s*(.+)$")


def _block_end(lines: list[tuple[int, str]], i: int) -> int:
    """The index after the block opened by line ``i`` (its body: the lines indented deeper)."""
    indent = lines[i][0]
    j = i + 1
    while j < len(lines) and lines[j][0] > indent:
        j += 1
    return j


def skeleton(module: str, text: str) -> tuple[list[str], dict[str, list[str]], list[str]]:
    """(module-level statements, class name -> body statements, class order), as Python source."""
    lines = logical_lines(text)
    top: list[str] = []
    classes: dict[str, list[str]] = {}
    order: list[str] = []
    decorators: list[str] = []
    i = 0
    while i < len(lines):
        indent, line = lines[i]
        if indent != 0:
            i += 1
            continue
        if line.startswith("@"):
            decorators.append(line)
            i += 1
            continue
        m_def, m_class, m_cpdef = _DEF.match(line), _CLASS.match(line), _cpdef(line)
        if m_def or m_cpdef:
            if _public((m_def or m_cpdef).group(1 if m_def else 2)):
                top += decorators + [(line if m_def else _cpdef_as_def(m_cpdef)) + " ..."]
            decorators = []
            i = _block_end(lines, i)
            continue
        if m_class:
            name = m_class.group(1)
            classes[name] = [f"class {name}{m_class.group(2) or ''}:"]
            order.append(name)
            body_end = _block_end(lines, i)
            keep = PRIVATE_MEMBERS.get(module, {}).get(name, set())
            classes[name] += _class_body(module, name, lines[i + 1:body_end], keep)
            decorators = []
            i = body_end
            continue
        decorators = []
        if line.startswith(("import ", "from ")) and " cimport " not in line:
            if line != "from __future__ import annotations":
                top.append(line)
        elif (m := _CIMPORT.match(line)) and (m.group(1).startswith(".") or m.group(1).startswith("ignis")):
            top.append(f"from {m.group(1)} import {m.group(2)}")
        elif line.startswith("if TYPE_CHECKING"):
            j = _block_end(lines, i)
            top += [ln for _, ln in lines[i + 1:j] if ln.startswith(("import ", "from "))]
            i = j
            continue
        elif (m := _ASSIGN.match(line)) and _public(m.group(1)) and not line.startswith("cdef"):
            top.append(line)
        i += 1 if not line.endswith(":") else 0
        if line.endswith(":"):
            i = _block_end(lines, i)
    return top, classes, order


def _class_body(module: str, cls: str, body: list[tuple[int, str]], keep: set[str]) -> list[str]:
    if not body:
        return []
    indent = body[0][0]
    out: list[str] = []
    decorators: list[str] = []
    i = 0
    while i < len(body):
        ind, line = body[i]
        if ind != indent:
            i += 1
            continue
        if line.startswith("@"):
            decorators.append(line)
            i += 1
            continue
        m_def = _DEF.match(line)
        m_cpdef = _cpdef(line)
        if m_def or m_cpdef:
            name = (m_def or m_cpdef).group(1 if m_def else 2)
            if name == "__cinit__" and not any(_DEF.match(ln) and _DEF.match(ln).group(1) == "__init__"
                                                for ind2, ln in body if ind2 == indent):
                name, line = "__init__", line.replace("__cinit__", "__init__", 1)  # Cython's constructor
            if (_public(name) or name in keep) and name not in ("__cinit__", "__dealloc__"):
                if m_cpdef:
                    line = _cpdef_as_def(m_cpdef)
                out += ["    " + d for d in decorators] + ["    " + line + " ..."]
            decorators = []
            j = i + 1
            while j < len(body) and body[j][0] > indent:
                j += 1
            i = j
            continue
        decorators = []
        if (m := _ASSIGN.match(line)) and _public(m.group(1)) and not line.startswith(("cdef", "ctypedef")):
            out.append("    " + line)
        i += 1
    return out


# -- the .pxd's attributes ----------------------------------------------------------------------

_PXD_CLASS = re.compile(r"^cdef\s+class\s+(\w+)")
_PXD_ATTR = re.compile(r"^cdef\s+(public|readonly)\s+((?:(?:unsigned|signed)\s+)?(?:long\s+)?[\w.]+)\s+(.+)$")


def pxd_attributes(module: str, text: str) -> dict[str, list[tuple[str, str, bool]]]:
    """class -> [(name, type, readonly)] of the public attributes declared ``cdef public`` or
    ``cdef readonly`` in ``text`` (a .pxd, or a .pyx's class bodies)."""
    out: dict[str, list[tuple[str, str, bool]]] = {}
    cls = None
    for indent, line in logical_lines(text):
        if indent == 0:
            if not line.startswith("cdef class"):
                cls = None
            m = _PXD_CLASS.match(line)
            cls = m.group(1) if m else None
            continue
        if indent > 4:
            continue
        m = _PXD_ATTR.match(line)
        if cls is None or not m:
            continue
        kind, ctype, names = m.groups()
        ctype = " ".join(ctype.split())
        for name in (n.strip() for n in names.split(",")):
            if not _public(name):
                continue
            out.setdefault(cls, []).append((name, ctype, kind == "readonly"))
    return out


# -- the stub ---------------------------------------------------------------------------------

class _Stub(ast.NodeTransformer):
    """Bodies and defaults to ``...``, string annotations to expressions; an unannotated return
    of a public function stops the script."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _annotation(self, node: ast.expr | None) -> ast.expr | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return ast.parse(node.value, mode="eval").body
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        is_setter = any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in node.decorator_list)
        if node.returns is None and not is_setter:
            if node.name in ("__init__", "__del__", "__dealloc__", "__setitem__", "__delitem__"):
                node.returns = ast.Constant(None)
            else:
                PROBLEMS.append(f"{self.where}: {node.name}() has no return annotation: annotate the source")
        elif is_setter and node.returns is None:
            node.returns = ast.Constant(None)
        node.returns = self._annotation(node.returns)
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None:
                arg.annotation = self._annotation(arg.annotation)
        a.defaults = [ast.Constant(...) for _ in a.defaults]
        a.kw_defaults = [None if d is None else ast.Constant(...) for d in a.kw_defaults]
        node.body = [ast.Expr(ast.Constant(...))]
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AnnAssign:
        node.annotation = self._annotation(node.annotation)
        node.value = None
        return node


def _attribute_type(module: str, cls: str, name: str, ctype: str) -> str:
    if ctype != "object":
        return C_TYPES.get(ctype, ctype)
    t = ATTRIBUTE_TYPES.get(module, {}).get(cls, {}).get(name)
    if t is None:
        PROBLEMS.append(f"{module}.{cls}.{name} is declared `object`: give its type in ATTRIBUTE_TYPES of "
                        f"scripts/gen_stubs.py")
    return t or "Any"


def _names(tree: ast.AST) -> set[str]:
    """The names ``tree`` uses, also inside string annotations."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            try:
                out |= _names(ast.parse(n.value, mode="eval"))
            except SyntaxError:
                pass
    return out


def _parse_member(line: str) -> ast.AST:
    line = line.strip()
    return ast.parse(line[1:] if line.startswith("@") else line)


def _value_type(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant):
        return type(node.value).__name__ if node.value is not None else "None"
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                       for e in node.elts):
        return "list[str]" if isinstance(node, ast.List) else "tuple[str, ...]"
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return "dict[str, Any]"
    return None


def stub(module: str) -> str:
    base = SRC / module.replace(".", "/")
    pyx, pxd = base.with_suffix(".pyx"), base.with_suffix(".pxd")
    source = with_includes(pyx)
    top, classes, order = skeleton(module, source)
    attrs = pxd_attributes(module, pxd.read_text()) if pxd.exists() else {}
    for cls, found in pxd_attributes(module, source).items():
        attrs.setdefault(cls, []).extend(found)
    body: list[str] = list(ATTRIBUTE_IMPORTS.get(module, []))
    for stmt in top:
        body.append(stmt)
    # Private classes only where a public declaration names them (a method's return type).
    named = {n for stmt in top for n in _names(_parse_member(stmt))}
    for name in order:
        if _public(name):
            named |= {n for line in classes[name][1:] for n in _names(_parse_member(line))}
    for name in order:
        if not _public(name) and name not in named:
            continue
        lines = classes[name]
        members = []
        for aname, ctype, readonly in attrs.get(name, []):
            atype = _attribute_type(module, name, aname, ctype)
            if readonly:
                members += ["    @property", f"    def {aname}(self) -> {atype}: ..."]
            else:
                members.append(f"    {aname}: {atype}")
        body += [lines[0], *members, *lines[1:]]
        if len(lines) == 1 and not members:
            body.append("    ...")
    tree = ast.parse("\n".join(body))
    stubber = _Stub(module)
    out: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            # a public module constant: its type from the value (a literal), or left out
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "__all__":
                out.append(node)
                continue
            t = _value_type(node.value)
            if t is None or not isinstance(target, ast.Name):
                PROBLEMS.append(f"{module}: the type of {ast.unparse(target)} cannot be told from its value: "
                                f"annotate it in the source")
                continue
            out.append(ast.AnnAssign(target=target, annotation=ast.parse(t, mode="eval").body, simple=1))
            continue
        if isinstance(node, ast.ClassDef):
            new_body: list[ast.stmt] = []
            methods = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
            for m in node.body:
                if isinstance(m, ast.Assign) and isinstance(m.value, ast.Name) and m.value.id in methods:
                    new_body.append(m)  # another name of a method: an alias in the stub too
                    continue
                if isinstance(m, ast.Assign):
                    t = _value_type(m.value)
                    if t is None:
                        PROBLEMS.append(f"{module}.{node.name}: the type of {ast.unparse(m.targets[0])} "
                                        f"cannot be told from its value: annotate it in the source")
                        continue
                    m = ast.AnnAssign(target=m.targets[0], annotation=ast.parse(f"ClassVar[{t}]", mode="eval").body,
                                      simple=1)
                new_body.append(stubber.visit(m))
            node.body = new_body or [ast.Expr(ast.Constant(...))]
            out.append(node)
            continue
        out.append(stubber.visit(node))
    tree.body = [ast.ImportFrom(module="typing", names=[ast.alias("Any"), ast.alias("ClassVar")], level=0)] + out
    tree.body = _used_imports(tree.body)
    text = ast.unparse(ast.fix_missing_locations(tree))
    return HEADER.format(module=module, source=pyx.relative_to(ROOT)) + text + "\n"


def _used_imports(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` with only the imported names its declarations use, each once (a stub's import
    is no re-export, and a .pyx imports much that only its code needs)."""
    used = {n.id for stmt in body if not isinstance(stmt, (ast.Import, ast.ImportFrom))
            for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    seen: set[tuple] = set()
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = []
            for a in stmt.names:
                bound = a.asname or a.name.split(".")[0]
                key = (getattr(stmt, "module", None), getattr(stmt, "level", 0), a.name, a.asname)
                if bound in used and key not in seen:
                    seen.add(key)
                    names.append(a)
            if names:
                stmt.names = names
                out.append(stmt)
        else:
            out.append(stmt)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="report stubs that differ from their sources; write nothing")
    args = ap.parse_args()
    stale = []
    texts = {m: stub(m) for m in MODULES}
    if PROBLEMS:
        print("\n".join(PROBLEMS), file=sys.stderr)
        return 2
    for module, text in texts.items():
        path = (SRC / module.replace(".", "/")).with_suffix(".pyi")
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("stale stubs (run python scripts/gen_stubs.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
