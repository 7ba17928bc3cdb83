"""``ignis._speedups``, the C extension that still serves the array layer (``ig.empty``,
``NvArray.free`` / ``__del__``) and DLPack's deleters, loaded once for every layer that
binds it. None where it is not built, or with
``IGNIS_PURE_PYTHON=1`` (the array layer then runs its Python code)."""

from __future__ import annotations

import os
from typing import Any


def _load() -> Any:
    if os.environ.get("IGNIS_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _speedups as mod
    except ImportError:
        return None
    return mod


speedups = _load()
