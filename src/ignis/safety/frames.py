"""Cheap Python stacks: captured as (code, line) pairs, formatted only when a report needs them.

Only the user's frames are kept: a frame whose code lives in Ignis, in a library
registered with ``add_library_dir`` (the PyTorch front end registers PyTorch),
in the standard library's wrappers (``runpy``, ``contextlib``, ``threading``) or
in frozen importlib is skipped.
Whether a code object is the user's is decided once and cached, so a capture
costs one dictionary lookup per frame walked.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import runpy
import sys
import threading
from types import CodeType
from typing import Any

__all__ = ["capture_frames", "format_frames", "add_library_dir", "is_user_file", "resolve", "sites", "MAX_FRAMES"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FRAMES = 6

# Ignis, and the standard library's wrappers that stand between the user's code and a call
_library: list[str] = [_PKG_DIR + os.sep] + [os.path.abspath(m.__file__) for m in (runpy, contextlib, threading)]
# id(code) -> (code, is the user's): hashing a code object costs more than the walk itself;
# the entry keeps the code alive, so its id cannot be reused while cached.
_user: dict[int, tuple[CodeType, bool]] = {}
_MAIN = threading.main_thread().ident


def add_library_dir(path: str) -> None:
    """Leave frames of code under ``path`` out of captured stacks (a library, not the user's code)."""
    p = os.path.abspath(path)
    p = p if os.path.isfile(p) else p + os.sep
    if p not in _library:
        _library.append(p)
        _user.clear()


def _is_user(co: CodeType) -> bool:
    u = is_user_file(co.co_filename)
    _user[id(co)] = (co, u)
    return u


def capture_frames(skip: int = 2, limit: int = MAX_FRAMES) -> tuple:
    """The caller's innermost user frames, as (code, line) pairs.

    On a thread with no user frame at all (PyTorch's autograd engine runs backward
    ops on its own threads), the main thread's user frames are taken instead:
    that is where ``backward()`` was called."""
    try:
        f = sys._getframe(skip)
    except ValueError:  # called from C on a thread with fewer Python frames than that
        f = None
    out = _walk(f, limit)
    if not out and threading.get_ident() != _MAIN:
        f = sys._current_frames().get(_MAIN)
        if f is not None:
            global _main_seen
            key = (id(f), f.f_lineno)  # the main thread sits in backward() for many ops: walk it once
            seen = _main_seen
            if seen is not None and seen[0] == key:
                return seen[1]
            out = _walk(f, limit)
            _main_seen = (key, out)
    return out


_main_seen: tuple | None = None


def _walk(f, limit: int) -> tuple:
    user = _user
    out = []
    while f is not None:
        co = f.f_code
        e = user.get(id(co))
        u = _is_user(co) if e is None else e[1]
        if u:
            out.append((co, f.f_lineno))
            if len(out) >= limit:
                break
        f = f.f_back
    return tuple(out)


def is_user_file(filename: str) -> bool:
    """Whether code in ``filename`` is the program's own (not Ignis, a registered library
    or the interpreter's machinery)."""
    return not (filename.startswith("<frozen ") or any(filename.startswith(p) for p in _library))


def resolve(frames: Any) -> list[tuple[str, int, str]]:
    """A captured stack as (file, line, function) triples, innermost first: either
    (code, line) pairs or a lazy stack (an object with ``resolve()``, which a front
    end may capture more cheaply and trim here)."""
    if not frames:
        return []
    if isinstance(frames, tuple):
        return [(co.co_filename, line, co.co_name) for co, line in frames]
    return frames.resolve()


def sites(frames: Any) -> tuple:
    """A stack as a hashable key of (file, line) pairs: two reports with equal keys
    come from the same places in the program."""
    return tuple((f, line) for f, line, _ in resolve(frames))


def format_frames(frames: Any) -> str:
    """Traceback-style text, outermost frame first."""
    lines = []
    for filename, lineno, name in reversed(resolve(frames)):
        lines.append(f'  File "{filename}", line {lineno}, in {name}')
        src = linecache.getline(filename, lineno).strip()
        if src:
            lines.append(f"    {src}")
    return "\n".join(lines) if lines else "  (no Python frames of the program's own)"
