"""Ordering policy of tracked uses.

- ``auto`` (the default): every tracked use queues the event waits it needs
  and a deallocation waits for every recorded use, so tracked code cannot race.
- ``manual``: tracked uses and deallocations queue nothing; the program's own
  events, stream waits and synchronizations must order them (as in plain CUDA
  or PyTorch). Run it under the sanitizer to have that verified.

The policy is chosen per stream (``stream.ordering``), per context (the
``ordering(...)`` context manager) or per process (``set_ordering``), most
specific first. While nothing ever asked for ``manual``, looking it up costs
one C field test (``HOOKS.any_manual``).

The policy is the memory layer's (DESIGN.md, layer 2: the memory layer applies it on every
tracked use); ``ignis.safety`` re-exports it. Its switch (``any_manual``) and the sanitizer's
hook (``checker``) are slots of ``ignis.memory.hooks``, read here for Python callers.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Iterator

from .hooks import HOOKS, note_manual, refuse_assignment

if TYPE_CHECKING:
    from ..runtime import Stream

__all__ = ["AUTO", "MANUAL", "policy", "set_ordering", "get_ordering", "ordering"]

AUTO, MANUAL = "auto", "manual"
_VALID = (AUTO, MANUAL)
_process = AUTO
_context: ContextVar[str | None] = ContextVar("ignis_ordering", default=None)


refuse_assignment(__name__, {
    "checker": "install the sanitizer with ignis.memory.hooks.set_checker (ignis.sanitizer.enable does)",
    "any_manual": "set_ordering('manual') or ordering('manual') turns it on"})


def __getattr__(name: str) -> Any:
    # ``checker``: the sanitizer, installed with ignis.memory.hooks.set_checker; ``any_manual``:
    # whether "manual" was asked for (hooks.note_manual). One slot each, read here for the
    # Python callers that ask this module.
    if name == "checker":
        return HOOKS.checker
    if name == "any_manual":
        return HOOKS.any_manual
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _valid(p: str) -> str:
    if p not in _VALID:
        raise ValueError(f"unknown ordering policy {p!r}; use 'auto' or 'manual'")
    return p


def policy(stream: "Stream") -> str:
    """The policy that applies to a use on ``stream`` now: the stream's own, else the
    ``ordering(...)`` block's, else the process-wide one.

    Args:
        stream: the ``Stream`` the use is on.
    """
    if not HOOKS.any_manual:
        return AUTO
    return stream.ordering or _context.get() or _process


def set_ordering(p: str, stream: "Stream | None" = None) -> None:
    """Set the process-wide policy, or one stream's (``None`` clears a stream's override).

    Args:
        p: ``"auto"`` (Ignis queues the event waits each tracked use needs) or ``"manual"``
            (the program's own events and synchronizations must order its uses); with
            ``stream``, also None.
        stream: the ``Stream`` whose own policy to set; None sets the process-wide policy.

    Raises:
        ValueError: ``p`` is not ``"auto"`` or ``"manual"`` (or None for a stream).
    """
    global _process
    if stream is not None:
        stream.ordering = None if p is None else _valid(p)
    else:
        _process = _valid(p)
    if p == MANUAL:
        note_manual()


def get_ordering(stream: "Stream | None" = None) -> str:
    """The ordering policy in force, ``"auto"`` or ``"manual"``.

    Args:
        stream: a ``Stream``: the policy that applies to a use on it now (its own, else
            the ``ordering(...)`` block's, else the process-wide one). None: the
            ``ordering(...)`` block's policy, else the process-wide one.
    """
    return policy(stream) if stream is not None else (_context.get() or _process)


@contextmanager
def ordering(p: str) -> Iterator[None]:
    """Use policy ``p`` for tracked uses made inside the ``with`` block (this thread / task).

    A stream's own policy (``set_ordering(p, stream)``) still wins inside the block.

    Args:
        p: ``"auto"`` or ``"manual"``.

    Raises:
        ValueError: ``p`` is neither.
    """
    token = _context.set(_valid(p))
    if p == MANUAL:
        note_manual()
    try:
        yield
    finally:
        _context.reset(token)
