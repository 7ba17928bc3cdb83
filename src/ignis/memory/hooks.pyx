"""The memory layer's hooks: where the sanitizer and telemetry plug in.

Three slots and one switch, each written only through its function, read everywhere as a field
of one object:

- ``checker``: the sanitizer (``ignis.safety``), called for every tracked use
  (``access(block, stream, access, span)``, span ``(offset, nbytes, op)`` or None) and every
  free (``free(block)``); the guard's front hands it the problems it finds while it collects
  (``mode == "collect"``: ``add_report(err, key)``). ``set_checker`` installs it;
  ``ordering.checker`` reads it.
- ``recorder``: the allocation-event recorder (telemetry), called as
  ``recorder(action, resource, ptr, size, stream, block)``. ``set_recorder`` (also
  ``history.set_recorder``) installs it; ``history.recorder`` reads it.
- ``capture`` / ``format_frames``: the stack walker (``ignis.safety.frames``, which installs
  itself at import through ``set_stack_capture``, a C function for compiled callers): the
  user's frames at an allocation, for the guard's reports, taken by a C call without a
  Python frame. ``capture_stack`` / ``format_stack`` serve Python callers. Unset (only
  while ``ignis`` itself is still importing), a capture is empty.
- ``any_manual``: the ordering policy's switch (``ignis.memory.ordering``): True from the first
  time anything asks for ``manual`` ordering (``note_manual``); until then every use is ``auto``
  and the hot paths ask no further.

When a slot is None, the cost to a hot path is one C field test. Compiled readers take the
``HOOKS`` object once (``from .hooks cimport Hooks``; ``cdef Hooks slots = HOOKS``); Python
readers use ``HOOKS.checker`` / ``HOOKS.recorder``. Nothing reaches a slot through a module's
``__dict__``, so a new listener cannot be missed by a reader that cached the old binding.
"""

from __future__ import annotations

from typing import Any, Callable

import sys
import types

__all__ = ["Hooks", "HOOKS", "set_checker", "set_recorder", "note_manual", "refuse_assignment", "capture_stack",
           "format_stack"]


cdef class Hooks:
    """The hook slots (see the module). Read-only from Python: use ``set_checker`` and
    ``set_recorder``.

    Attributes:
        checker: the sanitizer, or None.
        recorder: the allocation-event recorder, or None.
        any_manual: whether ``manual`` ordering was asked for in this process.
    """

    def __repr__(self) -> str:
        return f"<ignis.memory.hooks checker={self.checker!r} recorder={self.recorder!r}>"


HOOKS: Hooks = Hooks()
cdef Hooks _slots = HOOKS


def set_checker(checker: "object | None") -> "object | None":
    """Install the sanitizer (an object with ``access`` and ``free``), or with None remove it.

    Args:
        checker: the new checker, or None.

    Returns:
        The checker installed before.
    """
    if checker is not None and not (callable(getattr(checker, "access", None))
                                    and callable(getattr(checker, "free", None))):
        raise TypeError(f"a checker has methods access(block, stream, access, span) and free(block); "
                        f"{type(checker).__name__} has not both")
    prev = _slots.checker
    _slots.checker = checker
    return prev


def set_recorder(recorder: "Callable[[str, Any, int, int, Any, Any], None] | None") -> \
        "Callable[[str, Any, int, int, Any, Any], None] | None":
    """Install the allocation-event recorder, or with None remove it.

    Args:
        recorder: called as ``recorder(action, resource, ptr, size, stream, block)``, or None.

    Returns:
        The recorder installed before.
    """
    if recorder is not None and not callable(recorder):
        raise TypeError(f"a recorder is callable, not {type(recorder).__name__}")
    prev = _slots.recorder
    _slots.recorder = recorder
    return prev


cdef int set_stack_capture(capture_fn fn, object format_frames) except -1:
    """Install the stack walker ``fn`` and ``format_frames``, which turns what it returns into
    traceback text (see the module)."""
    _slots.format_frames = format_frames
    _slots.capture = fn
    return 0


def capture_stack(skip: int = 1, limit: int = 16) -> tuple:
    """The user's frames at the caller (the installed stack walker's capture: ``skip`` frames
    passed over first, counting the caller as frame 1; at most ``limit``), or () when no
    walker is installed.

    Args:
        skip: frames to pass over (1: from the caller on).
        limit: the most frames kept.
    """
    if _slots.capture == NULL:
        return ()
    return _slots.capture(skip, limit)


def format_stack(frames: object) -> "str | None":
    """``frames`` (from ``capture_stack``) as traceback text, or None for no frames.

    Args:
        frames: a capture, or None.
    """
    if not frames or _slots.format_frames is None:
        return None
    return _slots.format_frames(frames).rstrip()


def refuse_assignment(module: str, refusals: "dict[str, str]") -> None:
    """Make the names ``refusals`` of the (imported) module ``module`` refuse assignment, each
    with its message: names that read a hook slot (``ordering.checker``, ``history.recorder``),
    which an assignment would shadow without changing what the hot paths read.

    Args:
        module: the module's name (``__name__``).
        refusals: name -> what the ``AttributeError`` says to do instead.
    """
    class _Module(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if name in refusals:
                raise AttributeError(f"{module}.{name} is read-only: {refusals[name]}")
            super().__setattr__(name, value)

    sys.modules[module].__class__ = _Module


def note_manual() -> None:
    """Record that ``manual`` ordering was asked for (``ignis.memory.ordering`` calls it): from
    now on a tracked use asks the ordering policy which applies."""
    _slots.any_manual = True
