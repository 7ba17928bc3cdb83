"""GpuRef: a process-local handle to an array's memory, checked on every access
(after seeds/003).

A GpuRef keeps the array (and so its memory) alive, holds the device state
only weakly, and remembers the context generation it was made in. ``access()``
raises ``StaleHandleError`` saying why when the device state is gone, the
device is shutting down or its context was rebuilt, and
``UseAfterFreeError`` when the array was freed explicitly.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Generic, TypeVar

from ..errors import StaleHandleError
from ._array import SafeArray

if TYPE_CHECKING:
    from ..runtime import Stream

__all__ = ["GpuRef"]

_A = TypeVar("_A", bound=SafeArray)  # the array type (NvArray): access() gives back what it was given


class GpuRef(Generic[_A]):
    """A process-local handle to an array's memory, checked on every access.

    A GpuRef holds its ``NvArray`` (so the memory cannot be collected while the
    handle lives), holds the device's ``DeviceState`` only weakly, and remembers
    the context generation it was made in. Every ``access()`` (and
    ``raw_device_ptr()``) checks, in this order, that:

    1. the device state still exists (else ``StaleHandleError``, "device state dropped");
    2. the device is not shutting down (else ``StaleHandleError``, "device shutting down");
    3. the context was not rebuilt since the handle was made (else
       ``StaleHandleError``, "context rebuilt", with both generations);
    4. the array (and the array it is a view of) was not freed (else
       ``UseAfterFreeError``), and no failed operation poisoned it (a collective
       that was to write it: ``CollectiveError``).

    Holding a GpuRef does not stop an explicit ``free()``: the handle then
    refuses access instead of handing out a dangling pointer. Taking the array
    or its address is not a tracked use; queue device work on it through
    ``ig.launch`` or ``NvArray.use()``. A GpuRef cannot be pickled (it is
    process-local: share memory between processes with ``ig.ipc.export``).
    ``len(ref)`` is the array's number of elements.

    ``NvArray.ref()`` is the usual way to make one. Thread-safe.

    Args:
        array: the ``NvArray`` the handle is for.

    Raises:
        TypeError: ``array`` is not an array.
        UseAfterFreeError: the array was freed.
        StaleHandleError: the array was made before its device's context was rebuilt.

    Example::

        a = ig.zeros(4)
        r = a.ref()            # the same as ig.GpuRef(a), after checking a is live
        r.access()             # -> a
        r.raw_device_ptr()     # -> a.device_ptr, after the same checks
        a.free()
        r.access()             # UseAfterFreeError: ... it was freed
    """

    __slots__ = ("_array", "_state", "_generation", "_device_id", "_last_write", "_lock")

    def __init__(self, array: _A) -> None:
        check = getattr(array, "_check_live", None)
        if check is None:
            raise TypeError(f"a GpuRef is made for an NvArray, got {type(array).__name__}")
        check("take a GpuRef to")  # freed, or made before a context rebuild: no handle to it
        state = array.device.state
        self._array = array
        self._state = weakref.ref(state)
        self._generation = state.generation
        self._device_id = array.device.ordinal
        self._last_write: "Stream | None" = None
        self._lock = threading.Lock()

    def access(self) -> _A:
        """The array, after checking the handle is still valid.

        Returns:
            The ``NvArray``.

        Raises:
            StaleHandleError: the device state is gone, the device is shutting down, or its
                context was rebuilt since the handle was made.
            UseAfterFreeError: the array (or its base) was freed.
            CollectiveError: a failed collective was to write the array.
        """
        state = self._state()
        if state is None:
            raise StaleHandleError("device state dropped", what="GpuRef", device_id=self._device_id)
        if not state.accepting_ops:
            raise StaleHandleError("device shutting down", what="GpuRef", device_id=self._device_id)
        if state.generation != self._generation:
            raise StaleHandleError("context rebuilt", what="GpuRef", generation=self._generation,
                                   current_generation=state.generation, device_id=self._device_id)
        self._array._check_live("access through a GpuRef")
        return self._array

    @property
    def generation(self) -> int:
        """The device's context generation when the handle was made (not the block's generation)."""
        return self._generation

    @property
    def device_id(self) -> int | None:
        """The device ordinal, or None once the device state is gone."""
        return self._device_id if self._state() is not None else None

    def record_write(self, stream: "Stream") -> None:
        """Note that ``stream`` wrote the buffer last (for consumers that inject waits).

        Only stored, for ``last_write_stream``; Ignis itself orders tracked uses through
        the memory resource, not through this note.

        Args:
            stream: the ``Stream`` that wrote last.
        """
        with self._lock:
            self._last_write = stream

    @property
    def last_write_stream(self) -> "Stream | None":
        """The stream given to the latest ``record_write()``, or None."""
        with self._lock:
            return self._last_write

    def raw_device_ptr(self) -> int:
        """The device address, after ``access()``'s checks.

        Raises:
            StaleHandleError: as ``access()``.
            UseAfterFreeError: as ``access()``.
        """
        return self.access().device_ptr

    def __len__(self) -> int:
        return self._array.numel

    def __reduce__(self):
        raise TypeError("a GpuRef is process-local and cannot be pickled; share device memory between "
                        "processes with ig.ipc.export(array)")

    def __repr__(self) -> str:
        return f"<GpuRef NvArray#{self._array.id} device={self._device_id} generation={self._generation}>"
