"""The compiled part of ``DebugGuardResource`` (``ignis.memory.guard``): its typed state
and the quarantine's bookkeeping.

``GuardBase`` holds the fields every guard reads on each allocation and free (the
live map, the quarantine, the counters, the lock, the options), declared with C
types in ``guard_base.pxd``, and the quarantine's bound arithmetic. It is the first
base of ``DebugGuardResource`` (which adds everything else, in Python) and, through
``ignis.torch._guard_fast.GuardCore``, of the deferred guard whose allocate and free
are compiled: both guards run this one implementation, and the compiled hot path
calls it without a Python call. ``_Guarded`` is the guard's record of one allocation.
"""

from __future__ import annotations

from .resource cimport DeviceMemoryResource
from .block cimport DeviceBlock

__all__ = ["GuardBase"]


cdef class _Guarded:
    """The guard's record of one allocation: the user block, the upstream block
    that holds it and its guards, and the allocation stack (frames, unformatted).

    Args:
        block: the user's ``DeviceBlock`` (its requested bytes).
        up: the upstream block holding the guards and the user bytes.
        stack: the allocation stack (a ``traceback.StackSummary``), or None.
    """

    # Fields: see guard_base.pxd.

    def __init__(self, block: DeviceBlock, up: DeviceBlock, stack: object) -> None:
        self.block = block
        self.up = up
        self.stack = stack

    def stack_text(self) -> str | None:
        """The allocation stack as traceback text, or None when none was captured."""
        return "".join(self.stack.format()).rstrip() if self.stack else None


cdef class GuardBase(DeviceMemoryResource):
    """The typed fields of a debug guard and its quarantine's bookkeeping (see the module).

    Not a resource on its own: ``DebugGuardResource`` is. The quarantine is an
    ordered map (oldest first) of user pointer -> record; a record holds
    ``requested + 2 * canary_bytes`` bytes. The methods here run with the guard's
    lock held.
    """

    # Fields: see guard_base.pxd.

    cdef Py_ssize_t _held_c(self, _Guarded e) except -1:
        return <Py_ssize_t>e.block.requested + 2 * self.canary_bytes

    cdef Py_ssize_t _overflow_c(self) except -1:
        cdef Py_ssize_t n = len(self._quarantine), held = self._quarantined_bytes, out = 0
        cdef Py_ssize_t max_count = as_bound(self.quarantine_count), max_bytes = as_bound(self.quarantine_bytes)
        for e in self._quarantine.values():
            if n - out <= max_count and held <= max_bytes:
                break
            held -= self._held_c(<_Guarded?>e)
            out += 1
        return out

    cdef list _take_quarantine_c(self, Py_ssize_t k):
        cdef list out = []
        cdef Py_ssize_t i
        popitem = self._quarantine.popitem
        for i in range(k):
            e = popitem(False)[1]
            self._quarantined_bytes -= self._held_c(<_Guarded?>e)
            out.append(e)
        return out

    def _held(self, e: _Guarded) -> int:
        """The bytes a record holds (its user bytes and both guards)."""
        return self._held_c(e)

    def _overflow(self) -> int:
        """How many of the oldest quarantined blocks must leave to meet the bounds. Lock held."""
        return self._overflow_c()

    def _take_quarantine(self, k: int) -> list:
        """Remove the ``k`` oldest quarantined blocks (their records, oldest first). Lock held."""
        return self._take_quarantine_c(k)
