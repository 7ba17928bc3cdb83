"""The compiled part of ``DebugGuardResource`` (``ignis.memory.guard``): its typed state
and the quarantine's bookkeeping.

``GuardBase`` holds the fields every guard reads on each allocation and free (the
live map, the quarantine, the counters, the lock, the options), declared with C
types in ``guard_base.pxd``, and the quarantine's bound arithmetic. It is the first
base of ``DebugGuardResource`` (which adds everything else, in Python) and, through
``ignis.torch._guard_fast.GuardCore``, of the deferred guard whose allocate and free
are compiled: both guards run this one implementation, and the compiled hot path
calls it without a Python call. ``_Guarded`` is the guard's record of one allocation.

``fill_bytes`` (``fill_bytes_c`` for compiled callers) is how every guard queues its
canaries and poison: a byte replicated into a 32-bit word (``memset_d32_async``) over the
4-byte aligned words of the region, ``memset_d8_async`` for an unaligned head or tail. A GPU
fills a large region faster with word stores than byte stores, and both guards fill whole
tensors on every allocation or free. The bytes written are the same either way.
"""

from __future__ import annotations

from .resource cimport DeviceMemoryResource
from .block cimport DeviceBlock

__all__ = ["GuardBase", "fill_bytes"]

# FILL_SPLIT (guard_base.pxd): below it an unaligned region is one byte-wise memset, as an
# extra driver call costs more host time than word-wide stores save on the device.


cdef int fill_bytes_c(object backend, unsigned long long ptr, unsigned int value, Py_ssize_t nbytes,
                      object handle) except -1:
    """Queue on ``handle`` the fill of ``nbytes`` bytes at ``ptr`` with the byte ``value``
    (see the module): one ``memset_d32_async`` for an aligned region of whole words (the
    common case), one ``memset_d8_async`` for a small unaligned one, else byte-wise head,
    word-wide middle, byte-wise tail. A failing call raises its ``DriverError``."""
    cdef size_t head, words, tail
    cdef unsigned int word = (value & 0xFF) * 0x01010101u
    cdef int how
    if nbytes <= 0:
        return 0
    how = fill_plan(ptr, <size_t>nbytes, &head, &words, &tail)
    if how == 0:
        backend.memset_d32_async(ptr, word, words, handle)
        return 0
    if how == 1:
        backend.memset_d8_async(ptr, value, nbytes, handle)
        return 0
    if head:
        backend.memset_d8_async(ptr, value, head, handle)
    backend.memset_d32_async(ptr + <unsigned long long>head, word, words, handle)
    if tail:
        backend.memset_d8_async(ptr + <unsigned long long>(head + 4 * words), value, tail, handle)
    return 0


def fill_bytes(backend: object, ptr: int, value: int, nbytes: int, handle: int) -> None:
    """Queue on stream ``handle`` of ``backend`` the fill of ``nbytes`` bytes of device memory
    at ``ptr`` with the byte ``value`` (0..255): 32-bit memsets of the byte replicated into a
    word where the memory is 4-byte aligned, 8-bit memsets for an unaligned head or tail
    (a small unaligned region is one 8-bit memset). Raises the backend's ``DriverError``;
    memsets already queued stay queued (the caller owns the memory and handles the failure).

    Args:
        backend: the device's ``Backend``.
        ptr: the first device byte.
        value: the byte value, 0..255.
        nbytes: how many bytes (0 or less: nothing).
        handle: the stream's handle.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise ValueError(f"fill_bytes: value must be a byte value 0..255, got {value!r}")
    fill_bytes_c(backend, ptr, value, nbytes, handle)


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
        if held <= max_bytes:  # the count alone is over (the steady state): no walk
            return n - max_count if n > max_count else 0
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
