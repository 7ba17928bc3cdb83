"""Sphinx configuration for the Ignis documentation.

Build (from the repository root, with the ``docs`` extra installed)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The API reference is generated from the docstrings by autodoc (with napoleon
for their ``Args:`` / ``Returns:`` / ``Raises:`` sections). Docstrings are
written for ``help()`` first, so a few are not valid reStructuredText; the
``ignis_docs`` extension (``_ext/ignis_docs.py``) shows those verbatim instead of
failing the warning-free build, and lists them at the end of the build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Document the source tree next to this file where it is built in place (its compiled
# modules are there); else the installed ignis (a fresh clone installed with pip).
if any((ROOT / "src" / "ignis" / "memory").glob("pool.*.so")) or any((ROOT / "src" / "ignis" / "memory").glob("pool.*.pyd")):
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE / "_ext"))
# Importing ignis must not probe for a GPU, and must not switch checks on.
os.environ["IGNIS_BACKEND"] = "emulated"
os.environ.pop("IGNIS_SANITIZE", None)

import ignis  # noqa: E402

project = "Ignis"
author = "The Ignis authors"
copyright = "The Ignis authors"
release = ignis.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "ignis_docs",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
root_doc = "index"
default_role = "code"          # `x` in the guide is code, as ``x`` is
highlight_language = "python3"
pygments_style = "sphinx"
nitpicky = False               # type hints name private and third-party types: no link, no warning

# -- autodoc -------------------------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autoclass_content = "both"     # the class docstring, then __init__'s
autodoc_inherit_docstrings = True
add_module_names = False
python_use_unqualified_type_names = True

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_param = True
napoleon_attr_annotations = True
napoleon_use_ivar = True       # Attributes: sections as fields, not as second descriptions of the members

# -- HTML ----------------------------------------------------------------------------
html_theme = "alabaster"
html_title = f"Ignis {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "A memory-safe GPU memory runtime for Python",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "240px",
    "show_relbars": True,
}
html_sidebars = {"**": ["about.html", "navigation.html", "relations.html", "searchbox.html"]}
html_show_sourcelink = False
