"""What the safety layer needs of an array, as a ``typing.Protocol``.

The contract and ``GpuRef`` (layer 3) work on arrays, and ``NvArray`` (layer 4,
above them) is the one array type that satisfies this; naming it here instead
of importing ``NvArray`` keeps every import of layer 3 pointing down. Only
static checkers read it: nothing is checked at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["SafeArray"]


class SafeArray(Protocol):
    """An array as the ownership contract and ``GpuRef`` see it (``NvArray`` is one)."""

    # Read-only (NvArray's own code changes its owner and references: ``_set_owner``, incref).
    @property
    def id(self) -> int: ...

    @property
    def owner(self) -> str: ...

    @property
    def ref_count(self) -> int: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def numel(self) -> int: ...

    @property
    def device(self) -> Any: ...  # a Device: its ``ordinal`` and ``state`` (a DeviceState)

    @property
    def _lock(self) -> AbstractContextManager[Any]: ...

    @property
    def freed(self) -> bool: ...

    @property
    def tag(self) -> str | None: ...

    @property
    def device_ptr(self) -> int: ...

    def _root(self) -> "SafeArray":
        """The array that holds this one's memory (itself unless it is a view)."""
        ...

    def _set_owner(self, owner: str) -> "Sequence[SafeArray]":
        """Set the owner of this root and of its live views; return the arrays changed."""
        ...

    def _check_live(self, what: str = ...) -> None:
        """Raise unless the array may be touched (freed, or behind a failed write)."""
        ...
