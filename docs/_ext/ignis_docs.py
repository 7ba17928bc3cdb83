"""Sphinx helpers for the Ignis docs.

1. Docstrings that are not valid reStructuredText do not fail the build.

   Ignis's docstrings are written for ``help()``: plain text with ``code``
   marks, Google-style ``Args:`` sections (napoleon turns those into fields)
   and the odd layout that reST reads differently (a list with no blank line
   before it, a ``Design:`` paragraph with indented lines). Before autodoc
   hands a docstring to the reST parser, ``check_docstring`` parses it on its
   own, in the same nested context (under a directive, where section titles
   are not allowed), with every Sphinx role and directive replaced by a
   harmless stand-in. If that parse reports anything at WARNING level or
   above, the docstring is shown as written (without napoleon's rewriting if
   that parses cleanly; else as a preformatted block). So the build stays
   warning-free whatever the docstrings say, nothing is dropped, and the
   build lists what it showed verbatim (``ignis_docs: N docstring(s) shown
   verbatim``, an info line, not a warning) for whoever wants to fix them.

2. ``.. ignis-cli-help:: [COMMAND ...]`` inserts the ``--help`` text of the
   ``ignis`` command line (``ignis.cli.build_parser``), so the command-line
   page cannot drift from the code.

3. ``.. ignis-optional-module:: NAME`` is ``automodule`` for a module that
   may be absent from a build (it then says so instead of failing).

4. ``.. ignis-environment::`` inserts the table of the environment variables
   Ignis reads (``ignis._environment.VARIABLES``, which the README's table is
   checked against), so the docs and the README cannot disagree.
"""

from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Iterator

from docutils import nodes
from docutils.frontend import get_default_settings
from docutils.parsers.rst import Directive, Parser
from docutils.parsers.rst import directives as _directives
from docutils.parsers.rst import roles as _roles
from docutils.utils import new_document
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

# The lookups as docutils defines them, taken before Sphinx patches them for a read.
_ORIG_ROLE = _roles.role
_ORIG_DIRECTIVE = _directives.directive
# Directives whose content is not reST: the stand-in must not parse it.
_VERBATIM_DIRECTIVES = {"code", "code-block", "sourcecode", "literalinclude", "math", "highlight", "raw",
                        "parsed-literal", "doctest", "testcode", "testoutput", "productionlist", "graphviz"}


# -- 1. docstring check ----------------------------------------------------------------------
def _stand_in_role(name: str, rawtext: str, text: str, lineno: int, inliner: Any,
                   options: Any = None, content: Any = None) -> tuple[list, list]:
    return [nodes.literal(rawtext, text)], []


class _AnyOptions(dict):
    def __missing__(self, key: str) -> Any:
        return _directives.unchanged


class _StandIn(Directive):
    """Accepts any arguments and options; parses its content as reST (unless verbatim)."""

    has_content = True
    optional_arguments = 32
    final_argument_whitespace = True
    option_spec = _AnyOptions()
    verbatim = False

    def run(self) -> list[nodes.Node]:
        node = nodes.container()
        if self.content and not self.verbatim:
            self.state.nested_parse(self.content, self.content_offset, node)
        return [node]


class _VerbatimStandIn(_StandIn):
    verbatim = True


class _Checker:
    """Parses docstrings in isolation and says whether reST reads them without complaint."""

    def __init__(self, app: Sphinx) -> None:
        self.app = app
        self._known_roles: set[str] | None = None
        self._known_directives: set[str] | None = None

    def _domain_names(self) -> tuple[set[str], set[str]]:
        if self._known_roles is None:
            roles: set[str] = set()
            directives: set[str] = set()
            default = self.app.config.primary_domain or "py"
            domains = self.app.env.domains
            for domain in (domains.sorted() if hasattr(domains, "sorted") else domains.values()):
                for r in domain.roles:
                    roles.add(f"{domain.name}:{r}")
                    if domain.name in (default, "std"):
                        roles.add(r)
                for d in domain.directives:
                    directives.add(f"{domain.name}:{d}")
                    if domain.name in (default, "std"):
                        directives.add(d)
            self._known_roles, self._known_directives = roles, directives
        return self._known_roles, self._known_directives  # type: ignore[return-value]

    def _role(self, name: str, language: Any, lineno: int, reporter: Any) -> tuple[Any, list]:
        roles, _ = self._domain_names()
        if not name or name.lower() in roles:
            return _stand_in_role, []
        fn, _ = _ORIG_ROLE(name, language, lineno, reporter)
        return (_stand_in_role if fn is not None else None), []

    def _directive(self, name: str, language: Any, document: Any) -> tuple[Any, list]:
        if name == "ignis-docstring":
            return _StandIn, []
        _, directives = self._domain_names()
        known = name.lower() in directives or _ORIG_DIRECTIVE(name, language, document)[0] is not None
        if not known:
            return None, []
        return (_VerbatimStandIn if name.lower() in _VERBATIM_DIRECTIVES else _StandIn), []

    @contextlib.contextmanager
    def _stand_ins(self) -> Iterator[None]:
        saved = _roles.role, _directives.directive
        _roles.role, _directives.directive = self._role, self._directive
        try:
            yield
        finally:
            _roles.role, _directives.directive = saved

    def problems(self, lines: list[str]) -> list[str]:
        """The WARNING-or-worse messages reST gives for ``lines`` inside a directive body."""
        if not any(line.strip() for line in lines):
            return []
        text = ".. ignis-docstring::\n\n" + "\n".join("   " + line if line else "" for line in lines) + "\n"
        settings = get_default_settings(Parser)
        settings.report_level = 5
        settings.halt_level = 5
        settings.warning_stream = io.StringIO()
        settings.env = self.app.env
        settings.tab_width = 8
        document = new_document("<docstring>", settings)
        found: list[str] = []
        document.reporter.attach_observer(
            lambda msg: found.append(msg.astext()) if msg["level"] >= 2 else None)
        with self._stand_ins():
            try:
                Parser().parse(text, document)
            except Exception as e:  # noqa: BLE001 - a parse that breaks is a problem too
                found.append(f"{type(e).__name__}: {e}")
        return found


class _DocstringGuard:
    """The two ``autodoc-process-docstring`` listeners: one before napoleon keeps the
    docstring as written, one after it checks what napoleon made."""

    def __init__(self, app: Sphinx) -> None:
        self.checker = _Checker(app)
        self.raw: list[str] = []
        self.verbatim: list[tuple[str, str]] = []

    def before(self, app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
        self.raw = list(lines)

    def after(self, app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
        problems = self.checker.problems(lines)
        if not problems:
            return
        if os.environ.get("IGNIS_DOCS_DEBUG"):
            logger.info(f"ignis_docs: {name}: " + " | ".join(p.replace("\n", " ") for p in problems))
        raw = self.raw
        if raw != lines and not self.checker.problems(raw):
            lines[:] = raw                      # napoleon's rewrite was the trouble
            return
        self.verbatim.append((what, name))
        lines[:] = [".. code-block:: text", ""] + ["   " + line if line else "" for line in raw] + [""]

    def report(self, app: Sphinx, exc: BaseException | None) -> None:
        if exc is None and self.verbatim:
            names = ", ".join(sorted({n for _, n in self.verbatim}))
            logger.info(f"ignis_docs: {len(self.verbatim)} docstring(s) shown verbatim (not valid reST): {names}")


# -- builtin type names in docstring fields ------------------------------------------------------
def unlink_builtin_types(app: Sphinx, doctree: nodes.document) -> None:
    """``bytes``, ``int``, ``str``... in a field's type are Python's own: link them nowhere.

    A type in an ``Args:`` field is a "specific" cross-reference, which Sphinx also
    matches against any documented member of that name (``DeviceBlock.bytes``), so
    ``bytes`` would be an ambiguous reference or a wrong link."""
    from sphinx.addnodes import pending_xref, pending_xref_condition

    for node in list(doctree.findall(pending_xref)):
        if node.get("refdomain") != "py" or node.get("reftarget") not in _BUILTIN_NAMES:
            continue
        content = list(node.children)
        conditions = [c for c in content if isinstance(c, pending_xref_condition)]
        if conditions:  # python_use_unqualified_type_names: keep the "otherwise" text
            fallback = next((c for c in conditions if c.get("condition") == "*"), conditions[-1])
            content = list(fallback.children)
        node.replace_self(content or [nodes.Text(node["reftarget"])])


_BUILTIN_NAMES = {n for n in dir(__import__("builtins")) if not n.startswith("_")}


# -- 2. the command line's help ------------------------------------------------------------------
class CliHelp(SphinxDirective):
    """``.. ignis-cli-help:: run`` -> the output of ``ignis run --help`` (no argument: ``ignis --help``)."""

    has_content = False
    optional_arguments = 8
    final_argument_whitespace = False

    def run(self) -> list[nodes.Node]:
        import argparse

        from ignis.cli import build_parser

        parser = build_parser()
        for word in self.arguments:
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is None or word not in sub.choices:
                raise self.error(f"ignis-cli-help: no command {' '.join(self.arguments)!r}")
            parser = sub.choices[word]
        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "88"          # the same wrapping on every machine
        try:
            text = parser.format_help()
        finally:
            if old is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = old
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


class OptionalModule(SphinxDirective):
    """``.. ignis-optional-module:: ignis.torch``: ``automodule`` of a module that may not be in
    this build (a front end still being written): documented if it imports, else a note."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        import importlib

        from docutils.statemachine import StringList

        name = self.arguments[0]
        try:
            importlib.import_module(name)
        except ImportError as e:
            para = nodes.paragraph(text=f"{name} is not part of this build ({e}).")
            return [para]
        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(StringList([f".. automodule:: {name}"], source=self.get_source_info()[0]),
                                self.content_offset, node)
        return list(node.children)


class Environment(SphinxDirective):
    """``.. ignis-environment::`` -> the table of ``ignis._environment.VARIABLES``."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from docutils.statemachine import StringList

        from ignis._environment import rst_list_table

        node = nodes.section()
        node.document = self.state.document
        self.state.nested_parse(StringList(rst_list_table().splitlines(), source=self.get_source_info()[0]),
                                self.content_offset, node)
        return list(node.children)


def skip_reexported_errors(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    """Errors are documented once, on the ``ignis.errors`` page; subpackages that
    re-export some (``ig.io.SafetensorsError``) do not describe them a second time."""
    if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == "ignis.errors" \
            and app.env.docname != "api/errors":
        return True
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.autodoc")
    guard = _DocstringGuard(app)
    app.connect("autodoc-process-docstring", guard.before, priority=100)
    app.connect("autodoc-process-docstring", guard.after, priority=900)
    app.connect("build-finished", guard.report)
    app.connect("doctree-read", unlink_builtin_types)
    app.connect("autodoc-skip-member", skip_reexported_errors)
    app.add_directive("ignis-cli-help", CliHelp)
    app.add_directive("ignis-optional-module", OptionalModule)
    app.add_directive("ignis-environment", Environment)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
