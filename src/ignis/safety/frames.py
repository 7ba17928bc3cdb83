"""Cheap Python stacks: captured as (code, line) pairs, formatted only when a report needs them."""

from __future__ import annotations

import linecache
import os
import sys

__all__ = ["capture_frames", "format_frames"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FRAMES = 6


def capture_frames(skip: int = 2, limit: int = MAX_FRAMES) -> tuple:
    """The caller's innermost frames outside Ignis, as (code, line) pairs."""
    f = sys._getframe(skip)
    out = []
    while f is not None and len(out) < limit:
        co = f.f_code
        if not co.co_filename.startswith(_PKG_DIR):
            out.append((co, f.f_lineno))
        f = f.f_back
    return tuple(out)


def format_frames(frames: tuple) -> str:
    """Traceback-style text, outermost frame first."""
    lines = []
    for co, lineno in reversed(frames):
        lines.append(f'  File "{co.co_filename}", line {lineno}, in {co.co_name}')
        src = linecache.getline(co.co_filename, lineno).strip()
        if src:
            lines.append(f"    {src}")
    return "\n".join(lines) if lines else "  (no Python frames outside Ignis)"
