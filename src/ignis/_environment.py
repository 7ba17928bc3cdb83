"""The environment variables Ignis reads: the one list that the README and the docs show.

``VARIABLES`` names each variable with what it means (reST text: ````code```` marks).
The configuration page of the docs is made from it (the ``ignis-environment``
directive of ``docs/_ext``) and the README's table is ``markdown_table()`` (``python
-m ignis._environment`` prints it); ``tests/test_docs.py`` checks that the README holds
that table and that the code reads exactly these variables, so they cannot drift
apart.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Variable", "VARIABLES", "markdown_table", "rst_list_table"]


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name and what it means (reST inline text)."""

    name: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable("IGNIS_BACKEND", "``auto`` (default), ``cuda`` or ``emulated``. With ``auto``, Ignis takes ``cuda`` when "
                              "a driver and a device answer; otherwise it takes ``emulated`` and says so once on "
                              "stderr."),
    Variable("IGNIS_EMULATED_DEVICES", "Number of emulated devices (default 2)."),
    Variable("IGNIS_EMULATED_MEMORY", "Memory per emulated device, e.g. ``512MiB`` or ``4GiB`` (default 4 GiB)."),
    Variable("IGNIS_EMULATED_PEER_ACCESS", "``0``: the emulated devices cannot be given access to each other's "
                                           "memory (no peer-to-peer path), so copies between them are staged "
                                           "through host memory; ``1`` (default): they can, as NVLink allows."),
    Variable("IGNIS_EMU_JITTER", "``SEED`` or ``SEED:MAX_US``: each queued item on an emulated stream first sleeps a "
                                 "seeded random time (up to 200 µs by default), which widens race windows, so "
                                 "missing synchronization shows up in tests."),
    Variable("IGNIS_SANITIZE", "``1`` turns the sanitizer on at import, for Ignis's tracked uses and, once the "
                               "program imports torch, PyTorch's ops."),
    Variable("IGNIS_SANITIZE_MODE", "With ``IGNIS_SANITIZE``: ``raise`` (default: an error at the second access of a "
                                    "problem) or ``collect`` (reports kept, and printed at exit)."),
    Variable("IGNIS_MEMORY_STATS", "``1`` turns statistics (peaks and totals) on at import."),
    Variable("IGNIS_NCCL_BINDINGS", "``nccl4py``, ``cupy`` or ``ctypes``: which NCCL bindings collectives use on a "
                                    "GPU (default: the first that imports)."),
    Variable("IGNIS_TORCH_ENGINE", "``observer`` or ``mode``: how ``ignis.torch`` sees PyTorch's ops (default: the "
                                   "C++ op observer in collect mode, else the dispatch mode; both need the "
                                   "observer's library, built once with a C++ compiler)."),
    Variable("IGNIS_OBSERVER_BATCH", "1 to 4096: how many calls the PyTorch front end's op observer holds "
                                     "before it hands them to the sanitizer together (default 256; 1 makes each "
                                     "at once: a diagnostic, for comparisons in one run)."),
    Variable("IGNIS_OBSERVER_CHECKER", "``0`` (default) or ``1``: whether the checks of the ops and frees that "
                                       "PyTorch's autograd engine runs on its own threads inside ``backward()`` "
                                       "are made on a thread of the op observer's own, beside the backward pass "
                                       "(``1``), or on the backward pass's thread (``0``); experimental: it takes "
                                       "work off that thread, but no step was shown faster for it yet."),
    Variable("IGNIS_CACHE_DIR", "Where the PyTorch front end's op observer is built once and kept (default "
                                "``$XDG_CACHE_HOME/ignis``, else ``~/.cache/ignis``)."),
    Variable("IGNIS_RUN_MERGE_TIMEOUT", "Seconds ``ignis run`` waits for the other ranks' reports in a distributed "
                                        "run before it names the ranks whose report never came (default 60)."),
    Variable("IGNIS_RUN_EXCHANGE", "Set by ``ignis launch`` for ``ignis run`` in its ranks: the folder where they "
                                   "leave their reports (not set by hand)."),
    Variable("IGNIS_RUN_MERGE", "Set by ``ignis launch`` (``launcher``): the launcher, not local rank 0, merges "
                                "the ranks' reports (not set by hand)."),
)


def markdown_table() -> str:
    """The variables as the README's Markdown table."""
    lines = ["| Variable | Meaning |", "| --- | --- |"]
    lines += [f"| `{v.name}` | {v.meaning.replace('``', '`')} |" for v in VARIABLES]
    return "\n".join(lines)


def rst_list_table() -> str:
    """The variables as a reST ``list-table`` (the docs' configuration page)."""
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 28 72", "", "   * - Variable", "     - Meaning"]
    for v in VARIABLES:
        lines += [f"   * - ``{v.name}``", f"     - {v.meaning}"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
