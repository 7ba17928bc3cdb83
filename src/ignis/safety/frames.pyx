"""Cheap Python stacks: captured as (code, line) pairs, formatted only when a report needs them.

Only the user's frames are kept: a frame whose code lives in Ignis, in a library
registered with ``add_library_dir`` (the PyTorch front end registers PyTorch),
in the standard library's wrappers (``runpy``, ``contextlib``, ``threading``) or
in frozen importlib is skipped.
Whether a code object is the user's is decided once and cached, so a capture
costs one dictionary lookup per frame walked.

Compiled (every guarded allocation and every sanitized access captures its site):
the walk runs over the frames with the C API. This module's functions have no
Python frames of their own; ``skip`` still counts ``capture_frames`` as frame 0,
as ``sys._getframe`` would, so callers pass what they always did.
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

from cpython.ref cimport PyObject, Py_DECREF, Py_XDECREF, Py_XINCREF

cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    ctypedef struct PyCodeObject:
        pass
    PyFrameObject *PyEval_GetFrame()                       # borrowed; NULL: no Python frame
    PyFrameObject *PyFrame_GetBack(PyFrameObject *frame)   # new reference or NULL (no error)
    PyCodeObject *PyFrame_GetCode(PyFrameObject *frame)    # new reference
    int PyFrame_GetLineNumber(PyFrameObject *frame)

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030B0000
    #define ignis_frame_lasti(f) PyFrame_GetLasti(f)
    #else
    #include <frameobject.h>
    #define ignis_frame_lasti(f) ((f)->f_lasti)
    #endif
    """
    int ignis_frame_lasti(PyFrameObject *frame)  # the frame's last instruction; < 0: none yet

__all__ = ["capture_frames", "format_frames", "add_library_dir", "is_user_file", "resolve", "sites", "MAX_FRAMES"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FRAMES = 6

# Ignis, and the standard library's wrappers that stand between the user's code and a call
_library: list[str] = [_PKG_DIR + os.sep] + [os.path.abspath(m.__file__) for m in (runpy, contextlib, threading)]
# id(code) -> (code, is the user's, its lines by instruction offset (the user's code only)):
# hashing a code object costs more than the walk itself, and finding an instruction's line
# more than a lookup; the entry keeps the code alive, so its id cannot be reused while cached.
_user: dict[int, tuple[CodeType, bool, dict | None]] = {}
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
    _user[id(co)] = (co, u, {} if u else None)
    return u


def capture_frames(skip: int = 2, limit: int = MAX_FRAMES) -> tuple:
    """The caller's innermost user frames, as (code, line) pairs.

    ``skip``: the frames to pass over first, counting this function as frame 0 (2: from
    the caller's caller on). On a thread with no user frame at all (PyTorch's autograd
    engine runs backward ops on its own threads), the main thread's user frames are
    taken instead: that is where ``backward()`` was called."""
    global _main_seen
    # This function is compiled: the innermost Python frame is its caller's, frame 1.
    out = _walk_c(<PyObject *>PyEval_GetFrame(), skip - 1, limit)
    if not out and threading.get_ident() != _MAIN:
        f = sys._current_frames().get(_MAIN)
        if f is not None:
            key = (id(f), f.f_lineno)  # the main thread sits in backward() for many ops: walk it once
            seen = _main_seen
            if seen is not None and seen[0] == key:
                return seen[1]
            out = _walk(f, limit)
            _main_seen = (key, out)
    return out


_main_seen: tuple | None = None


def _walk(f, limit: int) -> tuple:
    """The user frames from frame ``f`` outward, at most ``limit``, as (code, line) pairs."""
    return _walk_c(<PyObject *>f if f is not None else NULL, 0, limit)


cdef tuple _walk_c(PyObject *start, Py_ssize_t skip, Py_ssize_t limit):
    """``_walk`` from ``start`` (borrowed; NULL for none) after passing over ``skip`` frames."""
    cdef PyObject *f = start
    cdef PyObject *back
    cdef int lasti
    cdef list out = []
    cdef dict user = _user
    cdef dict lines
    Py_XINCREF(f)
    try:
        while f != NULL and skip > 0:
            back = <PyObject *>PyFrame_GetBack(<PyFrameObject *>f)
            Py_DECREF(<object>f)
            f = back
            skip -= 1
        while f != NULL and len(out) < limit:
            code = <object><PyObject *>PyFrame_GetCode(<PyFrameObject *>f)
            Py_DECREF(code)  # ``code`` holds its own reference
            e = user.get(id(code))
            if e is None:
                _is_user(code)
                e = user[id(code)]
            if (<tuple>e)[1]:
                lines = <dict>(<tuple>e)[2]
                lasti = ignis_frame_lasti(<PyFrameObject *>f)
                line = lines.get(lasti) if lasti >= 0 else None
                if line is None:
                    line = PyFrame_GetLineNumber(<PyFrameObject *>f)
                    if lasti >= 0:
                        lines[lasti] = line
                out.append((code, line))
            back = <PyObject *>PyFrame_GetBack(<PyFrameObject *>f)
            Py_DECREF(<object>f)
            f = back
    finally:
        Py_XDECREF(f)
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
