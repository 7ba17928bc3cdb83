"""Turn the PyTorch front end on when the program imports torch (``ignis run --sanitize``).

A script that never imports torch pays nothing, not even torch's import: a
finder at the head of ``sys.meta_path`` waits for the ``torch`` import, lets the
normal finders load it, and enables the front end right after the module ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

__all__ = ["enable_on_import", "remove", "when_imported", "forget"]


class _TorchFinder(importlib.abc.MetaPathFinder):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        remove()
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        mode = self.mode

        def exec_module(module: Any) -> None:
            run(module)
            _enable_or_say(mode)

        loader.exec_module = exec_module
        return spec


def _enable_or_say(mode: str) -> None:
    """Enable ``ignis.torch``; where its op observer cannot be built here (no C++ compiler),
    say so on stderr and leave the program's import of torch alone: PyTorch's ops then go
    unchecked, and the summary says no ops were seen."""
    from . import enable
    try:
        enable(mode)
    except RuntimeError as e:
        print(f"ignis: PyTorch's ops are not checked: {e}", file=sys.stderr)


def enable_on_import(mode: str = "collect") -> None:
    """Enable ``ignis.torch`` now if torch is imported, else as soon as it is (where it cannot
    start, the reason is printed and the program runs unchecked)."""
    if "torch" in sys.modules:
        _enable_or_say(mode)
        return
    remove()
    sys.meta_path.insert(0, _TorchFinder(mode))


def remove() -> None:
    """Withdraw a finder that is still waiting."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchFinder)]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``fn(module)`` right after ``name`` is imported (once), then steps aside."""

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        forget(self.name)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, fn = loader.exec_module, self.fn

        def exec_module(module: Any) -> None:
            run(module)
            fn(module)

        loader.exec_module = exec_module
        return spec


def when_imported(name: str, fn: Any) -> None:
    """``fn(module)`` now if ``name`` is imported already, else right after its import."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    forget(name)
    sys.meta_path.insert(0, _AfterImport(name, fn))


def forget(name: str) -> None:
    """Withdraw a ``when_imported`` for ``name`` that is still waiting."""
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == name)]
