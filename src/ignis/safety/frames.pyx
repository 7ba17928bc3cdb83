"""Cheap Python stacks: captured as (code, line) pairs, formatted only when a report needs them.

Only the user's frames are kept: a frame whose code lives in Ignis, in a library
registered with ``add_library_dir`` (the PyTorch front end registers PyTorch),
in the standard library's wrappers (``runpy``, ``contextlib``, ``threading``) or
in frozen importlib is skipped.
Whether a code object is the user's is decided once and kept in a table keyed by
the code's address, and a capture is interned: the same user frames at the same
instructions (a loop's every iteration) give the same tuple, made once. So a
capture costs a walk over the frames and one lookup, and makes no object.

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
from typing import Any

from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF, Py_XDECREF, Py_XINCREF
from .._cpython cimport ignis_finalizing
from ..memory.hooks cimport set_stack_capture
from libc.stdint cimport uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    ctypedef struct PyCodeObject:
        pass
    ctypedef struct PyThreadState:
        pass
    ctypedef struct PyInterpreterState:
        pass
    PyFrameObject *PyEval_GetFrame()                       # borrowed; NULL: no Python frame
    PyFrameObject *PyFrame_GetBack(PyFrameObject *frame)   # new reference or NULL (no error)
    PyCodeObject *PyFrame_GetCode(PyFrameObject *frame)    # new reference
    int PyFrame_GetLineNumber(PyFrameObject *frame)
    PyThreadState *PyThreadState_Get()
    PyFrameObject *PyThreadState_GetFrame(PyThreadState *tstate)  # new reference or NULL
    PyInterpreterState *PyThreadState_GetInterpreter(PyThreadState *tstate)
    PyThreadState *PyInterpreterState_ThreadHead(PyInterpreterState *interp)
    PyThreadState *PyThreadState_Next(PyThreadState *tstate)

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

# The interpreter's own frame records (CPython 3.11 and 3.12), walked without making a frame
# object for each: PyFrame_GetBack makes (and keeps, while the frame runs) a frame object for
# every frame it passes, which made a walk through a library's frames (PyTorch's module
# machinery) cost about 50 ns a frame. Elsewhere (other versions, another implementation)
# IGNIS_IFRAME is 0 and the walk takes the frame objects' way.
cdef extern from *:
    """
    #if !defined(PYPY_VERSION) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
    #define IGNIS_IFRAME 1
    #ifndef Py_BUILD_CORE
    #define Py_BUILD_CORE 1
    #define IGNIS_UNDEF_BUILD_CORE
    #endif
    #include "internal/pycore_frame.h"
    #ifdef IGNIS_UNDEF_BUILD_CORE
    #undef Py_BUILD_CORE
    #endif
    /* The innermost frame record of a thread (running or, another thread's, waiting). */
    static inline void *ignis_iframe_top(PyThreadState *ts) {
        return ts->cframe ? (void *)ts->cframe->current_frame : NULL;
    }
    /* The first complete frame from f outward (a record not yet started, or the C stack's
       shim, has no code position of its own): as PyFrame_GetBack passes them over. */
    static inline void *ignis_iframe_complete(void *f) {
        _PyInterpreterFrame *p = (_PyInterpreterFrame *)f;
        while (p != NULL && _PyFrame_IsIncomplete(p)) p = p->previous;
        return (void *)p;
    }
    static inline void *ignis_iframe_back(void *f) {
        return ignis_iframe_complete((void *)((_PyInterpreterFrame *)f)->previous);
    }
    static inline PyObject *ignis_iframe_code(void *f) {
        return (PyObject *)((_PyInterpreterFrame *)f)->f_code;
    }
    /* In bytes, as PyFrame_GetLasti gives it and PyCode_Addr2Line takes it. */
    static inline int ignis_iframe_lasti(void *f) {
        return _PyInterpreterFrame_LASTI((_PyInterpreterFrame *)f) * (int)sizeof(_Py_CODEUNIT);
    }
    #else
    #define IGNIS_IFRAME 0
    static inline void *ignis_iframe_top(PyThreadState *ts) { (void)ts; return NULL; }
    static inline void *ignis_iframe_complete(void *f) { return f; }
    static inline void *ignis_iframe_back(void *f) { (void)f; return NULL; }
    static inline PyObject *ignis_iframe_code(void *f) { (void)f; return NULL; }
    static inline int ignis_iframe_lasti(void *f) { (void)f; return -1; }
    #endif
    """
    bint IGNIS_IFRAME
    void *ignis_iframe_top(PyThreadState *ts) noexcept
    void *ignis_iframe_complete(void *f) noexcept
    void *ignis_iframe_back(void *f) noexcept
    PyObject *ignis_iframe_code(void *f) noexcept
    int ignis_iframe_lasti(void *f) noexcept
    int PyCode_Addr2Line(PyCodeObject *code, int lasti)

__all__ = ["capture_frames", "format_frames", "add_library_dir", "is_user_file", "resolve", "sites", "MAX_FRAMES",
           "last_from_library"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FRAMES = 6

# Ignis, and the standard library's wrappers that stand between the user's code and a call
_library: list[str] = [_PKG_DIR + os.sep] + [os.path.abspath(m.__file__) for m in (runpy, contextlib, threading)]
_machinery: list[str] = list(_library)  # passed over without counting as a library's code


# -- two tables in C, read on every capture without making a Python object ----------------------
# Code objects: whether each is the user's (its file is not a library's), decided once. An entry
# holds a reference to its code, so the pointer cannot be reused while the entry lives.
cdef struct _CodeSlot:
    PyObject *code
    int user

# Captured stacks, interned: the same user frames at the same instructions (a loop's every
# iteration) give the same tuple, made once. An entry holds its tuple, which holds the codes the
# key names, so a key's pointers stay those codes'.
cdef enum:
    _KEY_FRAMES = 8            # captures of more frames than this are made anew each time
    _CODE_SLOTS_MAX = 1 << 17  # past half this many slots, every code is forgotten (and decided again)
    _STACK_SLOTS = 1 << 12     # past half this many slots, every interned stack is forgotten

cdef struct _StackSlot:
    uint64_t hash
    Py_ssize_t n
    PyObject *codes[_KEY_FRAMES]
    int lastis[_KEY_FRAMES]
    PyObject *stack

cdef _CodeSlot *_codes = NULL
cdef Py_ssize_t _code_cap = 0, _code_count = 0
cdef _StackSlot *_stacks = NULL
cdef Py_ssize_t _stack_count = 0


cdef inline uint64_t _mix(uint64_t h, uint64_t v) noexcept nogil:
    h ^= v + <uint64_t>0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2)
    return h


cdef void _forget_codes() noexcept:
    """Drop the code table (detached first: a code's release may run Python code that captures)."""
    global _codes, _code_cap, _code_count
    cdef _CodeSlot *old = _codes
    cdef Py_ssize_t cap = _code_cap, i
    _codes, _code_cap, _code_count = NULL, 0, 0
    if old != NULL:
        for i in range(cap):
            Py_XDECREF(old[i].code)
        free(old)


cdef void _forget_stacks() noexcept:
    """Drop the interned stacks (detached first, as above)."""
    global _stacks, _stack_count
    cdef _StackSlot *old = _stacks
    cdef Py_ssize_t i
    _stacks, _stack_count = NULL, 0
    if old != NULL:
        for i in range(_STACK_SLOTS):
            Py_XDECREF(old[i].stack)
        free(old)


cdef int _code_put(PyObject *code, int user) except -1:
    """Remember whether ``code`` is the user's (the table grows as it fills, up to a bound)."""
    global _codes, _code_cap
    cdef _CodeSlot *old
    cdef _CodeSlot *new
    cdef Py_ssize_t cap, i, j, ocap
    if (_code_count + 1) * 2 > _code_cap:
        if _code_cap >= _CODE_SLOTS_MAX:
            _forget_codes()  # may run Python code (a code's weakref callback): start over after
            return _code_put(code, user)
        ocap = _code_cap
        cap = ocap * 2 if ocap else 1024
        new = <_CodeSlot *>calloc(cap, sizeof(_CodeSlot))
        if new == NULL:
            raise MemoryError()
        old = _codes
        for i in range(ocap):  # no Python code runs from here to the swap
            if old[i].code != NULL:
                j = (<uintptr_t>old[i].code >> 4) & (cap - 1)
                while new[j].code != NULL:
                    j = (j + 1) & (cap - 1)
                new[j] = old[i]
        _codes, _code_cap = new, cap
        free(old)
    _code_insert(code, user)
    return 0


cdef void _code_insert(PyObject *code, int user) noexcept:
    global _code_count
    cdef Py_ssize_t i = (<uintptr_t>code >> 4) & (_code_cap - 1)
    while _codes[i].code != NULL:
        if _codes[i].code == code:
            _codes[i].user = user
            return
        i = (i + 1) & (_code_cap - 1)
    Py_INCREF(<object>code)
    _codes[i].code = code
    _codes[i].user = user
    _code_count += 1


cdef inline int _known_code(PyObject *code) noexcept:
    """``_user_code`` for a code decided already; -1 for one not decided yet (deciding it runs
    Python code, which the walk over the interpreter's frame records must not)."""
    cdef Py_ssize_t i
    if _code_cap:
        i = (<uintptr_t>code >> 4) & (_code_cap - 1)
        while _codes[i].code != NULL:
            if _codes[i].code == code:
                return _codes[i].user
            i = (i + 1) & (_code_cap - 1)
    return -1


cdef int _user_code(PyObject *code) except -1:
    """What ``code`` is (decided once per code object): 1 the user's, 0 a library's (one
    registered with ``add_library_dir``), 2 Ignis's own or the interpreter's machinery
    (``runpy``, ``contextlib``, ``threading``, frozen importlib), which is passed over."""
    cdef int u = _known_code(code)
    if u >= 0:
        return u
    u = _file_kind((<object>code).co_filename)  # Python: the tables may change meanwhile
    _code_put(code, u)
    return u


# Whether the innermost frame of the last capture that is not Ignis's own nor the interpreter's
# machinery is a library's (set by every walk, read right after it: ``last_from_library``).
cdef bint _from_lib = False


cpdef bint last_from_library():
    """Whether the last capture was made from a library's code (its innermost frame, Ignis's own
    and the interpreter's machinery passed over, is a registered library's): memory such code
    allocates and reads is its own business (the sanitizer skips its uninitialized-read check
    for it). Read it right after the capture, on the same thread."""
    return _from_lib


def add_library_dir(path: str, *, machinery: bool = False) -> None:
    """Leave frames of code under ``path`` out of captured stacks (a library, not the user's code).
    ``machinery``: code that only runs the user's (a launcher), passed over like Ignis's own."""
    p = os.path.abspath(path)
    p = p if os.path.isfile(p) else p + os.sep
    if p not in _library:
        _library.append(p)
        if machinery:
            _machinery.append(p)
        _forget_codes()
        _forget_stacks()


# The main thread's state (the module is imported there): a thread with no frame of the user's
# own (PyTorch's autograd engine's) takes the main thread's stack, where ``backward()`` was called.
cdef PyThreadState *_main_ts = NULL
if threading.current_thread() is threading.main_thread():
    _main_ts = PyThreadState_Get()


def _after_fork_in_child() -> None:
    global _main_ts
    _main_ts = PyThreadState_Get()  # the forking thread is the child's main thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


cdef PyThreadState *_main_state() noexcept:
    """The main thread's state, or NULL: this is the main thread, or its state is gone (a
    fork's child before this module's hook ran: the state is looked for among the
    interpreter's threads, never read once dropped). Its frames stay as they are while this
    thread holds the GIL."""
    cdef PyThreadState *me = PyThreadState_Get()
    cdef PyThreadState *ts
    if _main_ts == NULL or me == _main_ts or ignis_finalizing():
        return NULL
    ts = PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me))
    while ts != NULL and ts != _main_ts:
        ts = PyThreadState_Next(ts)
    return ts


def capture_frames(skip: int = 2, limit: int = MAX_FRAMES) -> tuple:
    """The caller's innermost user frames, as (code, line) pairs.

    ``skip``: the frames to pass over first, counting this function as frame 0 (2: from
    the caller's caller on). On a thread with no user frame at all (PyTorch's autograd
    engine runs backward ops on its own threads), the main thread's user frames are
    taken instead: that is where ``backward()`` was called. The same frames at the same
    instructions give the same tuple (interned), so a loop's captures cost a walk and a
    lookup."""
    return capture_c(skip, limit)


cdef tuple capture_c(Py_ssize_t skip, Py_ssize_t limit):
    """``capture_frames`` for compiled callers (frames.pxd), without a Python call: the
    same frames, counted the same way (compiled code has no frames of its own)."""
    # Compiled: the innermost Python frame is the caller's, frame 1.
    cdef PyThreadState *ts
    out = None
    if IGNIS_IFRAME and 0 < limit <= _KEY_FRAMES:
        out = _walk_records(ignis_iframe_top(PyThreadState_Get()), skip - 1, limit)
    if out is None:  # a code not decided yet, or no frame records to walk
        out = _walk_c(<PyObject *>PyEval_GetFrame(), skip - 1, limit)
    if not out:
        if _main_ts != NULL:
            ts = _main_state()
            if ts != NULL:
                main = _walk_main(ts, limit)
                if main is not None:
                    out = main
        elif threading.get_ident() != threading.main_thread().ident:  # imported off the main thread
            f0 = sys._current_frames().get(threading.main_thread().ident)
            if f0 is not None:
                out = _walk_c(<PyObject *>f0, 0, limit)
    return out


cdef object _walk_main(PyThreadState *ts, Py_ssize_t limit):
    """The user frames of the main thread (state ``ts``), or None when it has no Python frame
    (it runs C code only): then the capture and ``last_from_library`` stay the caller's own."""
    cdef void *top
    cdef PyObject *f
    if IGNIS_IFRAME and 0 < limit <= _KEY_FRAMES:
        top = ignis_iframe_complete(ignis_iframe_top(ts))
        if top == NULL:
            return None
        out = _walk_records(top, 0, limit)
        if out is not None:
            return out
    f = <PyObject *>PyThreadState_GetFrame(ts)
    if f == NULL:
        return None
    try:
        return _walk_c(f, 0, limit)
    finally:
        Py_XDECREF(f)


cdef tuple _walk_c(PyObject *start, Py_ssize_t skip, Py_ssize_t limit):
    """The user frames from ``start`` (borrowed; NULL for none) outward, after passing over
    ``skip`` frames, at most ``limit``, as (code, line) pairs (interned: see the module)."""
    cdef PyObject *f
    cdef PyObject *back
    cdef PyObject *code
    cdef PyObject *held[_KEY_FRAMES]   # the user frames walked (references), for their lines on a miss
    cdef PyObject *codes[_KEY_FRAMES]
    cdef int lastis[_KEY_FRAMES]
    cdef int lines[_KEY_FRAMES]
    cdef Py_ssize_t n = 0, i
    cdef uint64_t h
    cdef _StackSlot *slot
    cdef bint same
    cdef int kind
    cdef bint first = True
    global _from_lib
    if limit > _KEY_FRAMES or limit <= 0:
        return _walk_plain(start, skip, limit)
    f = _skip_frames(start, skip)
    _from_lib = False
    try:
        while f != NULL and n < limit:
            code = <PyObject *>PyFrame_GetCode(<PyFrameObject *>f)
            Py_DECREF(<object>code)  # the frame keeps its code alive
            kind = _user_code(code)  # (may raise: ``f`` is still released below)
            if first and kind != 2:
                _from_lib = kind == 0
                first = False
            if kind == 1:
                codes[n] = code
                lastis[n] = ignis_frame_lasti(<PyFrameObject *>f)
                back = <PyObject *>PyFrame_GetBack(<PyFrameObject *>f)
                held[n] = f  # its reference kept until the end, for its line on a miss
                n += 1
            else:
                back = <PyObject *>PyFrame_GetBack(<PyFrameObject *>f)
                Py_DECREF(<object>f)
            f = back
        Py_XDECREF(f)
        f = NULL
        if n == 0:
            return ()
        h = _stack_hash(codes, lastis, n)
        slot = _interned(h, codes, lastis, n)
        if slot != NULL:
            return <tuple>slot.stack
        # A stack not seen yet: its lines, read with no Python call between (the walk above
        # may have run Python code, a finalizer or another thread, and another thread's frames,
        # the main thread's, may have moved on meanwhile: then the key's offsets are not these
        # lines', and the capture is not interned).
        same = True
        for i in range(n):
            lines[i] = PyFrame_GetLineNumber(<PyFrameObject *>held[i])
            same = same and ignis_frame_lasti(<PyFrameObject *>held[i]) == lastis[i]
        out = tuple([(<object>codes[i], lines[i]) for i in range(n)])
        if same:
            _intern(h, codes, lastis, n, out)
        return out
    finally:
        Py_XDECREF(f)
        for i in range(n):
            Py_DECREF(<object>held[i])


cdef inline uint64_t _stack_hash(PyObject **codes, int *lastis, Py_ssize_t n) noexcept:
    cdef uint64_t h = <uint64_t>n
    cdef Py_ssize_t i
    for i in range(n):
        h = _mix(_mix(h, <uintptr_t>codes[i]), <uint64_t><unsigned int>lastis[i])
    return h


cdef _StackSlot *_interned(uint64_t h, PyObject **codes, int *lastis, Py_ssize_t n) noexcept:
    """The interned stack of these frames (its slot), or NULL: not seen yet."""
    cdef Py_ssize_t j, k
    cdef _StackSlot *slot
    if _stacks == NULL:
        return NULL
    j = <Py_ssize_t>(h & (_STACK_SLOTS - 1))
    while _stacks[j].stack != NULL:
        slot = &_stacks[j]
        if slot.hash == h and slot.n == n:
            k = 0
            while k < n and slot.codes[k] == codes[k] and slot.lastis[k] == lastis[k]:
                k += 1
            if k == n:
                return slot
        j = (j + 1) & (_STACK_SLOTS - 1)
    return NULL


cdef int _intern(uint64_t h, PyObject **codes, int *lastis, Py_ssize_t n, tuple out) except -1:
    """Keep ``out`` as the stack of these frames (its codes are ``out``'s: they stay alive)."""
    global _stacks, _stack_count
    cdef Py_ssize_t i, j
    cdef _StackSlot *slot
    if _stacks != NULL and _stack_count * 2 >= _STACK_SLOTS:
        _forget_stacks()  # (may run Python code: the table is looked at anew after)
    if _stacks == NULL:
        _stacks = <_StackSlot *>calloc(_STACK_SLOTS, sizeof(_StackSlot))
        if _stacks == NULL:
            return 0
    j = <Py_ssize_t>(h & (_STACK_SLOTS - 1))
    while _stacks[j].stack != NULL:
        j = (j + 1) & (_STACK_SLOTS - 1)
    slot = &_stacks[j]
    slot.hash, slot.n = h, n
    for i in range(n):
        slot.codes[i], slot.lastis[i] = codes[i], lastis[i]
    Py_INCREF(out)
    slot.stack = <PyObject *>out
    _stack_count += 1
    return 0


cdef object _walk_records(void *start, Py_ssize_t skip, Py_ssize_t limit):
    """``_walk_c`` over the interpreter's frame records from ``start`` outward (its thread's
    innermost; 0 < ``limit`` <= _KEY_FRAMES), making no frame object and running no Python
    code until the frames are read, so a thread's records (this one's, or the main thread's
    while this one holds the GIL) stay as they are meanwhile. None: a code not decided yet
    (the caller walks the frame objects, which decides it)."""
    global _from_lib
    cdef void *f = ignis_iframe_complete(start)
    cdef PyObject *code
    cdef PyObject *codes[_KEY_FRAMES]
    cdef int lastis[_KEY_FRAMES]
    cdef int lines[_KEY_FRAMES]
    cdef Py_ssize_t n = 0, i
    cdef int kind
    cdef bint first = True, from_lib = False
    cdef uint64_t h
    cdef _StackSlot *slot
    while f != NULL and skip > 0:
        f = ignis_iframe_back(f)
        skip -= 1
    while f != NULL and n < limit:
        code = ignis_iframe_code(f)
        kind = _known_code(code)
        if kind < 0:
            return None
        if first and kind != 2:
            from_lib = kind == 0
            first = False
        if kind == 1:
            codes[n] = code
            lastis[n] = ignis_iframe_lasti(f)
            n += 1
        f = ignis_iframe_back(f)
    _from_lib = from_lib
    if n == 0:
        return ()
    h = _stack_hash(codes, lastis, n)
    slot = _interned(h, codes, lastis, n)
    if slot != NULL:
        return <tuple>slot.stack
    # A stack not seen yet: its lines, and a reference to each code, before anything is made
    # (making objects may run Python code, and the frames may move on meanwhile).
    for i in range(n):
        Py_INCREF(<object>codes[i])
        lines[i] = PyCode_Addr2Line(<PyCodeObject *>codes[i], lastis[i])
    try:
        out = tuple([(<object>codes[i], lines[i]) for i in range(n)])
    finally:
        for i in range(n):
            Py_DECREF(<object>codes[i])
    _intern(h, codes, lastis, n, out)
    return out


cdef PyObject *_skip_frames(PyObject *start, Py_ssize_t skip) noexcept:
    """The frame ``skip`` frames out from ``start`` (borrowed; NULL for none), as a new
    reference, or NULL."""
    cdef PyObject *f = start
    cdef PyObject *back
    Py_XINCREF(f)
    while f != NULL and skip > 0:
        back = <PyObject *>PyFrame_GetBack(<PyFrameObject *>f)
        Py_DECREF(<object>f)
        f = back
        skip -= 1
    return f


cdef tuple _walk_plain(PyObject *start, Py_ssize_t skip, Py_ssize_t limit):
    """``_walk_c`` for a limit past the interned ones' (made anew each time)."""
    cdef PyObject *f = _skip_frames(start, skip)
    cdef PyObject *back
    cdef PyObject *code
    cdef list out = []
    cdef int kind
    cdef bint first = True
    global _from_lib
    _from_lib = False
    try:
        while f != NULL and len(out) < limit:
            code = <PyObject *>PyFrame_GetCode(<PyFrameObject *>f)
            Py_DECREF(<object>code)
            kind = _user_code(code)
            if first and kind != 2:
                _from_lib = kind == 0
                first = False
            if kind == 1:
                out.append((<object>code, PyFrame_GetLineNumber(<PyFrameObject *>f)))
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


def _file_kind(filename: str) -> int:
    """1 the user's file, 0 a library's, 2 Ignis's or the interpreter's machinery (see _user_code)."""
    if filename.startswith("<frozen ") or any(filename.startswith(p) for p in _machinery):
        return 2
    return 0 if any(filename.startswith(p) for p in _library) else 1


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


# The memory layer's guard captures allocation sites through its hook slot (memory/hooks.pyx):
# this walker, called from C.
set_stack_capture(capture_c, format_frames)
