"""MemoryContract: which layer owns a device array right now (after seeds/000).

Rules:
- Owners are names. ``"compute"`` is the default owner of every new array;
  ``"collective"``, ``"io"`` and ``"ipc"`` are the built-in layers; more can be
  added with ``register_owner``.
- A layer ``acquire``s an array before it works on it and ``release``s it when
  done (back to ``"compute"``). Acquiring an array that another layer holds,
  acquiring twice, acquiring while the array is shared (``ref_count > 1``),
  and releasing by anyone but the holder raise ``MemoryContractViolation``
  naming the array, the owner and the caller.
- Only the owner's rules allow a free: an array held by a layer cannot be freed
  until it is released.
- ``audit()`` lists tracked arrays older than a threshold: leak candidates.
  Acquired arrays are tracked; ``track_all = True`` tracks every new array.
  Tracking holds arrays weakly, so it never keeps memory alive.

Thread-safe: one re-entrant lock per contract.
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

from ..errors import MemoryContractViolation
from ._array import SafeArray
from .frames import capture_frames, format_frames

__all__ = ["MemoryContract", "contract", "register_owner", "owners", "DEFAULT_OWNER"]

DEFAULT_OWNER = "compute"
_owners: set[str] = {DEFAULT_OWNER, "collective", "io", "ipc"}
_owners_lock = threading.Lock()


def register_owner(name: str) -> str:
    """Add an owner name (a layer of your own). Idempotent.

    Args:
        name: the new owner's name, a non-empty string.

    Returns:
        ``name``.

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"owner names are non-empty strings, got {name!r}")
    with _owners_lock:
        _owners.add(name)
    return name


def owners() -> list[str]:
    """The registered owner names."""
    return sorted(_owners)


def validate_owner(owner: Any) -> str:
    if owner not in _owners:
        raise ValueError(f"unknown owner {owner!r}; valid owners are: {', '.join(sorted(_owners))} "
                         "(add one with ig.register_owner)")
    return owner


def _as_array(array: Any, op: str) -> SafeArray:
    """``array`` if it is an array the contract can hold (an ``NvArray``), else a ``TypeError``."""
    if not callable(getattr(type(array), "_root", None)) or not hasattr(array, "owner"):
        raise TypeError(f"contract.{op} takes an NvArray, got {type(array).__name__}; device memory "
                        "from elsewhere is adopted with ig.asarray / ig.from_dlpack first")
    return array


class MemoryContract:
    """Ownership of arrays passed between layers.

    ``ig.contract`` is the process's one contract; the layers of Ignis use it.

    Attributes:
        track_all: when True, every new array is tracked for ``audit()`` (acquired arrays
            always are).
        capture_sites: when True, tracking records where each array was made (for leak
            reports).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._tracked: dict[int, tuple[weakref.ref, float, tuple]] = {}
        self.track_all = False
        self.capture_sites = False  # record where tracked arrays were made (leak reports)

    # -- ownership ---------------------------------------------------------
    def acquire(self, array: SafeArray, by: str) -> bool:
        """Move ``array`` from the default owner to layer ``by``. A view's owner is its
        root's: acquiring a view acquires the root, with every view of it.

        Args:
            array: the ``NvArray`` (or a view of it) to hand over.
            by: the acquiring owner, a registered name (``"collective"``, ``"io"``, ...).

        Returns:
            True.

        Raises:
            TypeError: ``array`` is not an NvArray.
            ValueError: ``by`` is not a registered owner.
            UseAfterFreeError: ``array`` was freed.
            StaleHandleError: ``array`` was made before its device's context was rebuilt.
            MemoryContractViolation: ``by`` already holds it (double acquire), another layer
                holds it, or it is shared (``ref_count > 1``).
        """
        validate_owner(by)
        view, array = array, _as_array(array, "acquire")._root()
        with self._lock, array._lock:
            view._check_live("acquire")
            cur = array.owner
            if cur == by:
                raise MemoryContractViolation(f"NvArray#{array.id} is already owned by {by!r}: double acquire",
                                              array_id=array.id, owner=cur, caller=by)
            if cur != DEFAULT_OWNER:
                raise MemoryContractViolation(
                    f"NvArray#{array.id} is held by {cur!r}; {by!r} cannot acquire it until {cur!r} "
                    f"releases it", array_id=array.id, owner=cur, caller=by)
            if array.ref_count > 1:
                raise MemoryContractViolation(
                    f"NvArray#{array.id} is shared (ref_count={array.ref_count}); {by!r} cannot acquire it "
                    "until the other references are dropped (decref)", array_id=array.id, owner=cur, caller=by)
            for a in array._set_owner(by):  # the root and its views: all held now
                self.track(a)
            return True

    def release(self, array: SafeArray, by: str) -> bool:
        """Give ``array`` back to the default owner; only its holder may.

        Args:
            array: the ``NvArray`` (or a view: its root is released).
            by: the owner releasing it; it must be the holder.

        Returns:
            True.

        Raises:
            TypeError: ``array`` is not an NvArray.
            ValueError: ``by`` is not a registered owner.
            MemoryContractViolation: ``array`` is not held by ``by``.
        """
        validate_owner(by)
        array = _as_array(array, "release")._root()
        with self._lock, array._lock:
            if array.owner != by:
                raise MemoryContractViolation(
                    f"NvArray#{array.id} is owned by {array.owner!r}, not {by!r}: cannot release",
                    array_id=array.id, owner=array.owner, caller=by)
            array._set_owner(DEFAULT_OWNER)
            return True

    def assert_owner(self, array: SafeArray, owner: str) -> None:
        """Check that ``array`` (its root, for a view) is owned by ``owner``.

        Args:
            array: the ``NvArray`` to check.
            owner: the expected owner name.

        Raises:
            TypeError: ``array`` is not an NvArray.
            ValueError: ``owner`` is not a registered owner.
            MemoryContractViolation: the array has another owner.
        """
        validate_owner(owner)
        actual = _as_array(array, "assert_owner")._root().owner
        if actual != owner:
            raise MemoryContractViolation(f"NvArray#{array.id} expected owner {owner!r}, actual {actual!r}",
                                          array_id=array.id, owner=actual, caller=owner)

    @contextmanager
    def holding(self, array: SafeArray, by: str) -> Iterator[SafeArray]:
        """Acquire ``array`` for ``by`` and always release it (a context manager).

        Args:
            array: the ``NvArray`` to hold for the ``with`` block (it is what ``as`` gives).
            by: the owner that holds it.

        Raises:
            ValueError: ``by`` is not a registered owner.
            MemoryContractViolation: as ``acquire``.
        """
        self.acquire(array, by)
        try:
            yield array
        finally:
            if array.owner == by:
                self.release(array, by)

    # -- tracking and audit --------------------------------------------------
    def track(self, array: SafeArray) -> None:
        """Track ``array`` (weakly) for ``audit()``, from now; an array already tracked keeps its start.

        Args:
            array: the ``NvArray`` to track.
        """
        # Tracked already (the tracked-access block's hold asks on every acquire): it keeps its
        # start (ids are never reused; a read needs no lock).
        entry = self._tracked.get(getattr(array, "id", None))
        if entry is not None and entry[0]() is array:
            return
        _as_array(array, "track")
        if array.id in self._tracked:
            return
        frames = capture_frames(1) if self.capture_sites else ()  # from the caller out (Ignis's own frames passed over)
        with self._lock:
            if array.id not in self._tracked:
                self._tracked[array.id] = (weakref.ref(array), time.monotonic(), frames)

    def untrack(self, array: SafeArray) -> None:
        """Stop tracking ``array`` (nothing happens if it was not tracked).

        Args:
            array: the ``NvArray`` to forget.
        """
        _as_array(array, "untrack")
        with self._lock:
            self._tracked.pop(array.id, None)

    @property
    def tracked_count(self) -> int:
        """How many tracked arrays are still alive."""
        with self._lock:
            self._prune()
            return len(self._tracked)

    def _prune(self) -> None:
        dead = [k for k, (ref, _, _) in self._tracked.items() if ref() is None]
        for k in dead:
            del self._tracked[k]

    def audit(self, older_than: float = 5.0) -> list[dict[str, Any]]:
        """Tracked arrays alive for more than ``older_than`` seconds: id (also as array_id), owner,
        age_ms, shape, dtype, freed, nbytes, the allocation tag and, when
        ``capture_sites`` is on, the allocation site.

        Args:
            older_than: the age threshold, in seconds since tracking began.

        Returns:
            One dict per such array, in the order they were tracked.
        """
        now = time.monotonic()
        out = []
        with self._lock:
            self._prune()
            for ref, t0, frames in self._tracked.values():
                a = ref()
                if a is None or now - t0 <= older_than:
                    continue
                out.append({"id": a.id, "array_id": a.id, "owner": a.owner, "age_ms": round((now - t0) * 1000),
                            "shape": a.shape, "dtype": a.dtype.name, "freed": a.freed, "nbytes": a.nbytes,
                            "tag": a.tag, "site": format_frames(frames) if frames else None})
        return out

    def reset(self) -> None:
        """Forget every tracked array (tests)."""
        with self._lock:
            self._tracked.clear()


contract = MemoryContract()
