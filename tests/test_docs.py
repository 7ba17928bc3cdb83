"""The documentation: the Sphinx build is warning-free, and the user guide's code runs.

``test_docs_build`` builds the site (user guide and API reference, generated
from the docstrings) with warnings as errors into a temporary folder, as CI
does; it is skipped, saying so, where Sphinx is not installed (the ``docs``
extra). ``test_guide_code_runs`` runs the Python blocks of each guide page in
order, as one script, on the emulated backend, so the guide cannot drift from
the code. A block marked ``:class: sketch`` is shown but not run (it needs a
GPU, CuPy, or several processes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import IMPORT_ROOT

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE = sorted((DOCS / "guide").glob("*.rst"))

_BLOCK = re.compile(r"^\.\. code-block:: python\n((?:   :[^\n]*\n)*)\n((?:(?:   [^\n]*)?\n)+)", re.M)


def guide_code(page: Path) -> str:
    """The page's ``.. code-block:: python`` blocks (not marked ``sketch``), in order."""
    text = page.read_text()
    blocks = []
    for m in _BLOCK.finditer(text if text.endswith("\n") else text + "\n"):
        if "sketch" in m.group(1):
            continue
        blocks.append(textwrap.dedent(m.group(2)))
    return "\n".join(blocks)


def run_python(code: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, IGNIS_BACKEND="emulated")
    env.pop("IGNIS_SANITIZE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (IMPORT_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


GUIDE_WITH_CODE = [p for p in GUIDE if guide_code(p).strip()]


@pytest.mark.parametrize("page", GUIDE_WITH_CODE, ids=[p.stem for p in GUIDE_WITH_CODE])
def test_guide_code_runs(page: Path, tmp_path: Path) -> None:
    r = run_python(guide_code(page), tmp_path)
    assert r.returncode == 0, f"the Python blocks of docs/guide/{page.name} failed:\n{r.stdout}\n{r.stderr}"


def test_guide_pages_are_in_the_toctree() -> None:
    assert GUIDE_WITH_CODE, "no guide page has runnable code"
    index = (DOCS / "index.rst").read_text()
    for page in GUIDE:
        assert f"guide/{page.stem}" in index, f"docs/guide/{page.name} is not in index.rst's toctree"


def test_every_example_is_on_the_examples_page() -> None:
    page = (DOCS / "examples.rst").read_text()
    for script in sorted((ROOT / "examples").glob("*.py")):
        assert f"literalinclude:: ../examples/{script.name}" in page, f"docs/examples.rst lacks {script.name}"


def test_docs_build(tmp_path: Path) -> None:
    pytest.importorskip("sphinx.cmd.build", reason="Sphinx is not installed (pip install '.[docs]')")
    out = tmp_path / "html"
    env = dict(os.environ)
    env.pop("IGNIS_SANITIZE", None)
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-b", "html",
                        "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"sphinx-build failed (warnings are errors):\n{r.stdout}\n{r.stderr}"
    # every docstring is valid reST: none is shown as written (docs/_ext/ignis_docs.py says which)
    verbatim = [ln for ln in (r.stdout + r.stderr).splitlines() if "shown verbatim" in ln]
    assert not verbatim, verbatim
    for page in ("index.html", "api/arrays.html", "api/memory.html", "guide/streams.html", "examples.html"):
        assert (out / page).is_file(), page
    api = (out / "api" / "arrays.html").read_text()
    assert "NvArray" in api and "write_rows" in api, "the API reference was not generated from the docstrings"


# -- the configuration: one list of environment variables -------------------------------------------
# A read of the environment: os.environ.get("IGNIS_X"...), os.environ["IGNIS_X"], os.getenv("IGNIS_X")
_ENV_READ = re.compile(r"""(?:environ(?:\.get)?\s*[(\[]|getenv\()\s*["'](IGNIS_[A-Z0-9_]+)["']""")


def test_the_environment_variables_the_code_reads_are_the_documented_ones() -> None:
    """Every ``IGNIS_*`` variable the library's source reads from the environment is in
    ``ignis._environment.VARIABLES``, and every one listed there is read by the code."""
    from ignis._environment import VARIABLES
    listed = {v.name for v in VARIABLES}
    src = ROOT / "src" / "ignis"
    used: dict[str, str] = {}
    for path in [*src.rglob("*.py"), *src.rglob("*.pyx")]:
        if path.name == "_environment.py":
            continue
        for name in _ENV_READ.findall(path.read_text()):
            used.setdefault(name, str(path.relative_to(ROOT)))
    assert not set(used) - listed, {n: used[n] for n in set(used) - listed}
    assert not listed - set(used), f"listed but never read: {sorted(listed - set(used))}"


def test_the_readme_and_the_docs_show_the_one_list() -> None:
    from ignis._environment import markdown_table
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, "README.md's configuration table differs: paste `python -m ignis._environment`"
    assert readme.count("| Variable | Meaning |") == 1
    page = (DOCS / "guide" / "configuration.rst").read_text()
    assert ".. ignis-environment::" in page and "IGNIS_BACKEND``  " not in page  # the directive, no second table
