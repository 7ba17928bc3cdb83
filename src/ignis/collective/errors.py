"""Errors of the collective layer.

``CollectiveError`` is raised when an operation cannot complete: a peer died
or closed its communicator, a peer did not answer within the time-out, ranks
called different operations, or NCCL reported an error. It names the rank
that failed (``rank``, when known), the operation (``op``, with its call
number) and the rank that raised it (``this_rank``). Once a communicator has
failed it stays failed: every later operation raises at once.

(Both classes subclass ``IgnisError`` and pickle like every Ignis error; they
live here rather than in ``ignis.errors`` only so the layer stays in its own
package.)
"""

from __future__ import annotations

from typing import Any

from ..errors import IgnisError

__all__ = ["CollectiveError", "CollectiveTimeoutError"]


class CollectiveError(IgnisError, RuntimeError):
    """A collective or point-to-point operation failed.

    ``kind`` is one of "peer_died", "peer_closed", "timeout", "mismatch",
    "nccl", "init", "closed", "failed_earlier"."""

    def __init__(self, detail: str, *, op: str | None = None, rank: int | None = None,
                 this_rank: int | None = None, kind: str = "error", **more: Any) -> None:
        where = f"rank {this_rank}" if this_rank is not None else "this rank"
        head = f"collective {op} failed on {where}" if op else f"collective failure on {where}"
        super().__init__(f"{head}: {detail}", detail=detail, op=op, rank=rank, this_rank=this_rank,
                         kind=kind, **more)


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A peer did not take part in an operation within the communicator's time-out."""

    def __reduce__(self) -> tuple:
        # TimeoutError is an OSError, whose instances must be made by OSError.__new__.
        return (_rebuild_timeout, (self.message, dict(self.__dict__)))


def _rebuild_timeout(message: str, state: dict[str, Any]) -> CollectiveTimeoutError:
    err = OSError.__new__(CollectiveTimeoutError, message)
    err.__dict__.update(state)
    return err
