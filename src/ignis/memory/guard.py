"""The debug guard: canaries, poison and a quarantine around every block, in two modes.

``DebugGuardResource`` checks at the free (the host waits: exact, for programs and
tests); ``DeferredGuardResource`` is the same guard with its checks run on the device
in batches, never waiting (for frameworks' allocators). One record, one quarantine, one
allocation and one report path serve both.

Design:
- An allocation of ``n`` bytes takes ``n + 2*G`` bytes from the upstream, where
  ``G`` is ``canary_bytes`` rounded up to 256 (so the user pointer keeps a
  256-byte alignment)::

      upstream block: [ guard G | user n | guard G ]

  Device memsets on the allocation stream fill the guards with ``canary`` and
  the user bytes with ``poison`` (no host synchronization): 32-bit memsets of the
  byte replicated into a word where aligned (``guard_base.fill_bytes``), which a
  GPU runs faster than byte-wise ones on large blocks. The caller gets a
  new ``DeviceBlock`` for the user bytes (``bytes == requested == n``, so the
  after-guard starts at the first byte past the request) with a fresh
  generation; the upstream block never leaves the guard.
- ``deallocate`` orders itself after every recorded use (the upstream's
  tracking queues the waits), reads both guards back and **synchronizes the
  allocation stream**: this debug resource trades a host sync per free for
  exact reports. A damaged guard is ``OutOfBoundsError`` (side ``"before"`` or
  ``"after"``, first bad offset relative to the user pointer: negative before,
  ``>= n`` after). Then the user bytes are poisoned again and the block waits in
  a FIFO quarantine (bounded by ``quarantine_count`` blocks and
  ``quarantine_bytes``, counted as ``n + 2*G`` per block) before the upstream
  may reuse it. When it leaves (pushed out by newer blocks, ``flush()``,
  ``trim()``, ``close()``, or an upstream out-of-memory), every user byte must
  still hold the poison; any other byte is a write after free:
  ``UseAfterFreeError`` with ``side="after-free"`` and the offset. A block
  larger than ``quarantine_bytes`` (or any block while the quarantine is off or
  the resource closed) skips the quarantine instead of emptying it.
- Tracking is supported iff the upstream supports it; the hooks translate an
  inner block (or ``BlockId``) to its upstream block, and a sanitizer span to
  upstream offsets (a span outside the user bytes is judged against the user
  block, so the guards do not hide it). An unknown or stale inner id is
  ``UseAfterFreeError``, even while its memory sits in the quarantine. Under
  ``manual`` ordering the free queues no waits, as in every resource.
- History: ``alloc`` and ``free_requested`` with the user pointer and size,
  ``free_completed`` when the block leaves the quarantine (the upstream reports
  its own larger block as usual).

Rules:
- Nothing leaks, whatever is raised: a free with a damaged guard still
  completes (the block is poisoned and quarantined, then the error is raised);
  a block with a write after free is still returned upstream (FREED) before
  its error is raised; a failing driver call returns the upstream block at
  once. If the upstream refuses to take a block back (its driver free
  fails), a block being deallocated stays LIVE here and a block leaving the
  quarantine goes back into it, counted, and the error is raised: a later
  ``deallocate`` / ``flush`` returns it. Counters stay exact on every path.
- Errors carry ``ptr``, ``tag``, ``side``, ``offset``, ``last_offset``, ``damaged``
  (how many bytes), ``generation``, ``found`` (the first damaged bytes), ``when``,
  ``stack`` (the allocation site: the user's frames, taken through the memory layer's
  stack-capture hook and formatted only for a report) and ``frames``. One report path
  (``_oob``, ``_after_free``) writes them for both modes. When one call finds several
  problems it raises the first; the others are in its ``others`` field.
- One lock guards the live map, the quarantine and the counters; host I/O of
  ``deallocate`` runs outside it. Lock order is always guard, then upstream.
- A context rebuild makes every block's memory gone: nothing is checked, the
  upstream blocks are handed back and the inner blocks become FREED.

The deferred mode (``DeferredGuardResource``, the guard ``ignis.torch`` and ``ignis.cupy``
install as their framework's allocator) is this guard with its checks run on the device:
- Its free never waits: the user bytes are poisoned at once (a memset on the allocation
  stream, after the waits that cross-stream tracking and ``record_stream`` need) and a job
  "check the guards" joins the stream's pending batch; a block pushed out of the quarantine
  gets a job "check guards and poison, then repair them" and goes back upstream as soon as
  that batch is queued (stream order puts the check before any reuse). A batch (up to
  ``batch`` jobs) is one kernel pair (check, then sample-and-repair) and a copy of the
  results into pinned memory behind an event; results are read when the event has
  completed (polled on frees, at ``on_sync``, by ``check()``) and go to ``on_problem``.
- Because a block leaves its check repaired, a reuse of the same pool block for the same
  size needs no memset, and for another size only the bytes that differ (``_reformat``).
- The ready cache: a block leaving the quarantine waits in the guard, keyed by (stream,
  user bytes, tag), up to ``ready_limit`` bytes, instead of going back to the pool; an
  allocation of the same size and tag on the same stream takes it as it is. Another
  stream, size or tag, a block with tracked uses, a full cache, a closed stream, a dead
  context, or memory events being recorded: the pool. ``flush()``, ``close()``,
  ``trim()`` and running out of memory give the cache back.
- Closed, it has no batches: a block freed after ``close()`` is checked at once (the
  host waits) and handed back; what the check finds is reported as usual.

Both modes run one compiled core (``guard_base.pyx``, typed in ``guard_base.pxd``): the
fields read on every allocation and free, the record of one allocation (``_Guarded``),
the quarantine's bookkeeping, the one ``allocate``, the deferred free (``free_fast``) and
the check batches. The framework allocators (``ignis.memory.guard_alloc``) call it without
a Python call. The lock is a ``ResourceLock`` (the compiled path takes it without a call).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import IgnisError, OutOfBoundsError, UseAfterFreeError
from ..runtime import Device, Stream
from ..runtime.stream import add_close_hook
from .hooks import HOOKS as _HOOKS
from . import ordering as _ord
from .adaptors import ResourceAdaptor
from .guard_base import _NONE, EXIT, FREE, HELD, LIVE, MAX_BATCH, GuardBase, _Guarded, _uniform, fill_bytes
from .pool import PoolResource
from .resource import DeviceMemoryResource
from .._types import Access
from .types import BlockId, BlockState
from .block import DeviceBlock

__all__ = ["DebugGuardResource", "DeferredGuardResource", "holds_poison", "first_poisoned_offset", "MAX_BATCH"]

_GUARD_ALIGN = 256
_CHUNK = 4 << 20      # bytes read back per host copy when scanning a region
_STACK_DEPTH = 16     # user frames kept per allocation (the eager mode's default)
_SAMPLE = 16          # damaged bytes quoted in a report


def _byte(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise ValueError(f"{name} must be a byte value 0..255, got {value!r}")
    return value


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _chunks(backend: Any, ptr: int, nbytes: int, stream: Stream) -> Any:
    """The bytes of ``[ptr, ptr + nbytes)`` read back on ``stream`` (the host waits for each
    chunk), as ``(offset, view)`` pairs; the view's buffer is reused for the next chunk."""
    if nbytes <= 0:
        return
    handle = stream._check()
    buf = np.empty(min(nbytes, _CHUNK), np.uint8)
    for off in range(0, nbytes, _CHUNK):
        view = buf[:min(_CHUNK, nbytes - off)]
        backend.memcpy_dtoh_async(view.ctypes.data, ptr + off, view.nbytes, handle)
        backend.stream_synchronize(handle)
        yield off, view


def _scan(backend: Any, ptr: int, nbytes: int, stream: Stream, value: int, match: bool
          ) -> tuple[int, bytes] | None:
    """The first offset in ``[ptr, ptr + nbytes)`` whose byte equals ``value``
    (``match``) or differs from it (not ``match``), with the bytes from there;
    ``None`` if there is none. Reads on ``stream`` and waits for each chunk."""
    for off, view in _chunks(backend, ptr, nbytes, stream):
        if not match and _uniform(view, value):  # the common case: nothing differs
            continue
        mask = (view == value) if match else (view != value)
        i = int(mask.argmax())
        if mask[i]:
            return off + i, view[i:i + _SAMPLE].tobytes()
    return None


def _damage(backend: Any, ptr: int, nbytes: int, stream: Stream, value: int
            ) -> tuple[int, int, int, bytes] | None:
    """The bytes of ``[ptr, ptr + nbytes)`` that differ from ``value``: ``(first, last, count,
    the bytes from first on)`` as offsets, or None if every byte holds it. Reads on ``stream``
    and waits for each chunk."""
    first = last = -1
    count = 0
    found = b""
    for off, view in _chunks(backend, ptr, nbytes, stream):
        if _uniform(view, value):  # the common case: nothing differs
            continue
        bad = np.flatnonzero(view != value)
        if first < 0:
            first = off + int(bad[0])
            found = view[int(bad[0]):int(bad[0]) + _SAMPLE].tobytes()
        last = off + int(bad[-1])
        count += int(bad.size)
    if first < 0:
        return None
    if len(found) < _SAMPLE and first + len(found) < nbytes:  # the sample crosses a chunk: read it whole
        found = b"".join(v.tobytes() for _, v in _chunks(backend, ptr + first, min(_SAMPLE, nbytes - first), stream))
    return first, last, count, found


def _noun(tag: str) -> str:
    return "array" if tag == "cupy" else "tensor" if tag == "torch" else "block"


def _target(target: Any, stream: Stream | None) -> tuple[int, int, Stream]:
    """``(ptr, nbytes, stream)`` of a DeviceBlock, a ``(ptr, nbytes)`` pair or an
    array with ``device_ptr`` and ``nbytes`` (an ``NvArray``)."""
    if isinstance(target, DeviceBlock):
        ptr, nbytes, own = target.ptr, target.requested, target.alloc_stream
    elif isinstance(target, tuple) and len(target) == 2:
        ptr, nbytes = target
        own = None
    elif hasattr(target, "device_ptr") and hasattr(target, "nbytes"):
        ptr, nbytes = target.device_ptr, target.nbytes
        own = getattr(target, "stream", None)
    else:
        raise TypeError(f"expected a DeviceBlock, a (ptr, nbytes) pair or an array, got {type(target).__name__}")
    if isinstance(ptr, bool) or not isinstance(ptr, int) or isinstance(nbytes, bool) \
            or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"bad device range ({ptr!r}, {nbytes!r}): need an int pointer and a non-negative size")
    if stream is None:
        stream = own if isinstance(own, Stream) and not own._closed else Device(0).default_stream
    elif not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
    return ptr, nbytes, stream


def first_poisoned_offset(target: Any, stream: Stream | None = None, *, poison: int = 0xA5) -> int | None:
    """The offset of the first byte of ``target`` that still holds ``poison``, or ``None``.

    The bytes are read on ``stream`` after the work queued there, and the host waits.
    Order writes made on other streams before calling. A single data byte may equal the
    poison by chance; look at the offsets you expect written.

    Args:
        target: a ``DeviceBlock`` (its requested bytes), a ``(ptr, nbytes)`` pair or an
            ``NvArray`` (refused if freed or stale, as its ``device_ptr`` is).
        stream: the stream to read on; None for the block's or array's stream, else
            device 0's default stream.
        poison: the poison byte value (default 0xA5).
    """
    ptr, nbytes, s = _target(target, stream)
    hit = _scan(s.device.backend, ptr, nbytes, s, _byte("poison", poison), True)
    return None if hit is None else hit[0]


def holds_poison(target: Any, stream: Stream | None = None, *, poison: int = 0xA5) -> bool:
    """True when every byte of ``target`` still holds ``poison``: nothing has
    written it since a ``DebugGuardResource`` allocated (or freed) it, so reading
    it would read uninitialized memory. Arguments as ``first_poisoned_offset``.

    Args:
        target: a ``DeviceBlock`` (its requested bytes), a ``(ptr, nbytes)`` pair or an
            ``NvArray``.
        stream: the stream to read on; None for the block's or array's stream, else
            device 0's default stream.
        poison: the poison byte value (default 0xA5).
    """
    ptr, nbytes, s = _target(target, stream)
    return _scan(s.device.backend, ptr, nbytes, s, _byte("poison", poison), False) is None


def _first(problems: list[IgnisError]) -> IgnisError:
    err = problems[0]
    err.others = problems[1:]
    return err


class DebugGuardResource(GuardBase, ResourceAdaptor):
    """Canaries before and after every block, poison in fresh and freed blocks,
    and a quarantine before freed memory goes back to ``upstream``.

    Arguments: ``canary_bytes`` per side (rounded up to 256); ``poison`` and
    ``canary`` byte values; the quarantine bound (``quarantine_count`` blocks,
    ``quarantine_bytes`` bytes; 0 turns it off); ``capture_stacks`` keeps the
    allocation site (the user's frames, at most ``stack_depth``) for reports.
    ``deallocate``, ``check``, ``flush`` and the poison helpers synchronize with the
    host; ``allocate`` does not. ``DeferredGuardResource`` is the same guard with its
    checks run on the device in batches, never waiting.
    """

    def __init__(self, upstream: DeviceMemoryResource, canary_bytes: int = 256, poison: int = 0xA5,
                 canary: int = 0xFD, quarantine_count: int = 64, quarantine_bytes: int = 64 << 20,
                 capture_stacks: bool = True, stack_depth: int = _STACK_DEPTH) -> None:
        super().__init__(upstream)
        # The adaptor base binds the tracking hooks straight to the upstream's;
        # the guard must translate inner blocks, so drop those bindings.
        del self.prepare_block_use, self.finish_block_use, self.record_block_use
        g = _count("canary_bytes", canary_bytes)
        g = (g + _GUARD_ALIGN - 1) // _GUARD_ALIGN * _GUARD_ALIGN
        p, c = _byte("poison", poison), _byte("canary", canary)
        if p == c and g:
            raise ValueError(f"poison and canary must differ (both {poison:#04x}), or a write of one "
                             "would pass for the other")
        qc = _count("quarantine_count", quarantine_count)
        qb = _count("quarantine_bytes", quarantine_bytes)
        if isinstance(stack_depth, bool) or not isinstance(stack_depth, int) or not 1 <= stack_depth <= 64:
            raise ValueError(f"stack_depth must be an int from 1 to 64, got {stack_depth!r}")
        # (the live map, user pointer -> _Guarded; the quarantine, oldest first; their bytes)
        self._configure(g, p, c, qc, qb, bool(capture_stacks), stack_depth, upstream.supports_block_use_tracking)

    # -- the contract ------------------------------------------------------
    # ``allocate`` is ``GuardBase.allocate`` (compiled, both modes): the allocation site, an
    # upstream block of ``n + 2 * canary_bytes`` (``_after_oom`` where it runs out), its
    # canaries and poison (``_format``), a user block with a fresh generation.

    def _take_for_free(self, block: DeviceBlock, foreign: bool = False) -> "_Guarded | None":
        """The first step of a free: the checks, then the block leaves the live table and the
        sanitizer (unless ``foreign``: a framework's tensor it follows as a foreign extent) and
        the history recorder hear of it. Returns its entry, or None when the context is gone
        and the block went straight back upstream."""
        with self._lock:
            entry = self._live.get(block.ptr) if isinstance(block, DeviceBlock) else None
            if entry is None or entry.block is not block:
                self._check_dealloc(block, self._live)
            chk = _HOOKS.checker
            if chk is not None and not foreign:
                chk.free(block)
            del self._live[block.ptr]
            self._count_bytes(-block.requested, 0)
        rec = _HOOKS.recorder
        if rec is not None:
            rec("free_requested", self, block.ptr, block.requested, block.alloc_stream, block)
        if not self._context_alive():
            self._return_or_relive(entry)
            return None
        return entry

    def _enter_quarantine(self, entry: _Guarded) -> tuple[bool, list]:
        """With the lock held, after a free poisoned ``entry``: quarantine it, pushing out what
        no longer fits. Returns (bypass, evicted): a block that could never fit the quarantine
        (or a closed resource, or no quarantine) skips it rather than flushing it."""
        bypass = self._closed or not self.quarantine_count or self._held(entry) > self.quarantine_bytes
        if bypass:
            return True, []
        entry.block.transition(BlockState.QUARANTINED)
        self._quarantine[entry.block.ptr] = entry
        self._count_bytes(0, self._held(entry))
        return False, self._take_quarantine(self._overflow())

    def _format(self, up: DeviceBlock, nbytes: int) -> None:
        """Queue the canaries around, and the poison inside, a fresh upstream block of
        ``nbytes`` user bytes (on its allocation stream). If that fails, the block goes
        back upstream and the error propagates."""
        g = self.canary_bytes
        try:
            handle = up.alloc_stream._check()
            b = self._backend
            if g:
                fill_bytes(b, up.ptr, self.canary, g, handle)
                fill_bytes(b, up.ptr + g + nbytes, self.canary, g, handle)
            fill_bytes(b, up.ptr + g, self.poison, nbytes, handle)
        except BaseException:
            self.upstream.deallocate(up)
            raise

    def _undo_free(self, entry: _Guarded, exc: BaseException) -> None:
        """After a free step failed with ``exc``: make the block live here again; if even that
        fails, say so on ``exc`` (the first error is the one to report)."""
        try:
            self._return_or_relive(entry)
        except BaseException as undo:  # noqa: BLE001
            if hasattr(exc, "add_note"):
                exc.add_note(f"the block stays live: returning it upstream also failed: {undo}")

    def _after_oom(self, nbytes: int, stream: Stream, tag: str) -> DeviceBlock:
        """The upstream ran out (called while its ``MemoryError`` is handled): empty the
        quarantine (checking it) and retry once; re-raise if nothing was held."""
        with self._lock:
            if not self._quarantine:
                raise
            entries = self._take_quarantine(len(self._quarantine))
        problems = self._release(entries, full_sync=True)
        if problems:
            raise _first(problems)
        self.upstream.reap_pending()
        return self.upstream.allocate(nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock, *, foreign: bool = False) -> None:
        """Check the guards (synchronizing the allocation stream), poison the
        bytes and quarantine the block. Raises ``OutOfBoundsError`` for a damaged
        guard and ``UseAfterFreeError`` for a write after free found in a block
        pushed out of the quarantine, in both cases after the free completed."""
        entry = self._take_for_free(block, foreign)
        if entry is None:
            return
        try:
            closed = entry.up.alloc_stream._closed
            stream = self._stream_of(entry)
            if self._tracks and not closed and _ord.policy(stream) == _ord.AUTO:
                # The reads and the poison wait for every recorded use. (Under manual
                # ordering the program orders its frees; the sanitizer checked this one above.)
                self.upstream.prepare_block_use(entry.up, stream, Access.READ_WRITE)
            problems: list[IgnisError] = self._check_guards(entry, stream, "on free")
            fill_bytes(self._backend, block.ptr, self.poison, block.requested, stream.handle)
            if closed:  # no stream orders the poison before the memory's next use: wait for it
                self._backend.stream_synchronize(stream.handle)
            if self._tracks:
                # Every use is ordered before the poison (or complete, where the alloc stream
                # was closed): the upstream's hazard record restarts on the alloc stream.
                self.upstream.finish_block_use(entry.up, entry.up.alloc_stream, Access.READ_WRITE)
        except BaseException as exc:
            self._undo_free(entry, exc)
            raise
        with self._lock:
            bypass, evicted = self._enter_quarantine(entry)
        if bypass:
            self._return_or_relive(entry)
        else:
            problems += self._release(evicted, full_sync=False)
        if problems:
            raise _first(problems)

    # -- tracking (translated to the upstream block) -----------------------
    def _resolve(self, block: "DeviceBlock | BlockId") -> _Guarded:
        """The live record of an inner block or id. Lock held."""
        e = self._live.get(block.ptr)
        if e is None or e.block.generation != block.generation:
            q = self._quarantine.get(block.ptr)
            where = ("it was freed and its memory waits in the guard's quarantine"
                     if q is not None and q.block.generation == block.generation
                     else "freed, reused or never allocated here")
            raise UseAfterFreeError(
                f"block {block.ptr:#x} is not live in this {type(self).__name__} ({where}); the memory may "
                "now belong to another allocation", generation=block.generation, ptr=block.ptr,
                live_generation=None if e is None else e.block.generation)
        return e

    def prepare_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access,
                          span: tuple | None = None) -> None:
        """Queue on ``stream`` the waits that ``access`` needs (upstream's tracking).
        ``span`` = (offset, nbytes, op), relative to this block, is passed on."""
        if not self._tracks:
            raise self._no_tracking("prepare_block_use")
        with self._lock:
            e = self._resolve(block)
            if span is not None:
                off, n = span[0], span[1]
                if n and (off < 0 or off + n > e.block.bytes):
                    # Outside the user's bytes (maybe inside a guard): the sanitizer must
                    # judge it against this block, not the larger upstream one.
                    chk = _HOOKS.checker
                    if chk is not None:
                        chk.access(e.block, stream, access, span)
                    span = None
            if span is None:
                self.upstream.prepare_block_use(e.up, stream, access)
            else:
                self.upstream.prepare_block_use(e.up, stream, access, (span[0] + self.canary_bytes, *span[1:]))

    def finish_block_use(self, block: "DeviceBlock | BlockId", stream: Stream, access: Access) -> None:
        """Record the use just enqueued on ``stream`` (upstream's tracking)."""
        if not self._tracks:
            raise self._no_tracking("finish_block_use")
        with self._lock:
            self.upstream.finish_block_use(self._resolve(block).up, stream, access)

    def record_block_use(self, block: "DeviceBlock | BlockId", stream: Stream) -> None:
        """Note that work on ``stream`` touches the block, so its free waits for it."""
        if not self._tracks:
            raise self._no_tracking("record_block_use")
        with self._lock:
            self.upstream.record_block_use(self._resolve(block).up, stream)

    # -- checks ------------------------------------------------------------
    def check(self, *, raise_: bool = True) -> list[IgnisError]:
        """Verify now the guards of every live block and the poison of every
        quarantined block, after everything queued on the device (a device
        synchronization; the lock is held meanwhile). Returns the problems
        (``OutOfBoundsError`` / ``UseAfterFreeError``); with ``raise_`` (the
        default) raises the first instead. Changes nothing: damaged live blocks
        stay live, and quarantined ones are reported again when they leave."""
        problems: list[IgnisError] = []
        with self._lock:
            if not self._context_alive():
                return problems
            self._backend.device_synchronize(self.device.ordinal)
            for e in self._live.values():
                problems += self._check_guards(e, self._stream_of(e), "by check()")
            for e in self._quarantine.values():
                p = self._check_poison(e, "by check()")
                if p is not None:
                    problems.append(p)
        if problems and raise_:
            raise _first(problems)
        return problems

    def flush(self, *, raise_: bool = True) -> list[IgnisError]:
        """Empty the quarantine: check each block's poison (after everything queued
        on the device) and return it upstream. Every block is returned even when
        some fail; then the problems are returned, or with ``raise_`` the first raised."""
        with self._lock:
            entries = self._take_quarantine(len(self._quarantine))
        problems = self._release(entries, full_sync=True)
        if problems and raise_:
            raise _first(problems)
        return problems

    def holds_poison(self, target: Any, stream: Stream | None = None) -> bool:
        """``holds_poison`` with this resource's poison value."""
        return holds_poison(target, stream, poison=self.poison)

    def first_poisoned_offset(self, target: Any, stream: Stream | None = None) -> int | None:
        """``first_poisoned_offset`` with this resource's poison value."""
        return first_poisoned_offset(target, stream, poison=self.poison)

    def stack_of(self, block: "DeviceBlock | BlockId") -> str | None:
        """The allocation stack of a live or quarantined block, formatted."""
        with self._lock:
            e = self._live.get(block.ptr) or self._quarantine.get(block.ptr)
        if e is None or e.block.generation != block.generation:
            return None
        return e.stack_text()

    # -- queries and maintenance -------------------------------------------
    @property
    def bytes_outstanding(self) -> int:
        """User bytes live (requested sizes; guards and quarantine not counted)."""
        return self._live_bytes

    def holds(self, block: DeviceBlock) -> bool:
        """Whether ``block`` is a live block this guard handed out (not its upstream's)."""
        e = self._live.get(getattr(block, "ptr", None))
        return e is not None and e.block is block

    def held_blocks(self) -> "list[tuple[int, DeviceBlock | None, str]]":
        """Every upstream block the guard holds now, as ``(upstream address, the block handed to
        the program or None, kind)``: kind ``"live"`` (handed out), ``"quarantined"`` (freed,
        held back before reuse) or ``"ready"`` (checked and kept for reuse on its stream: no
        block of the program's). For telemetry and tools."""
        with self._lock:
            out = [(e.up.ptr, e.block, "live") for e in self._live.values()]
            out += [(e.up.ptr, e.block, "quarantined") for e in self._quarantine.values()]
            out += [(up.ptr, None, "ready") for lst in (getattr(self, "_ready", None) or {}).values() for up in lst]
        return out

    @property
    def quarantined_bytes(self) -> int:
        """Bytes held in the quarantine, counted as ``n + 2 * canary_bytes`` per block."""
        return self._quarantined_bytes

    @property
    def quarantined_count(self) -> int:
        """The number of freed blocks held in the quarantine."""
        return len(self._quarantine)

    def memory_numbers(self) -> dict[str, int]:
        up = self.upstream.memory_numbers()
        return {"live_bytes": self._live_bytes,
                "cached_bytes": self._quarantined_bytes + up.get("cached_bytes", 0),
                "largest_free_block": up.get("largest_free_block", 0)}

    def trim(self) -> int:
        """Flush the quarantine (raising what it finds), then trim the upstream."""
        self.flush()
        return super().trim()

    def close(self) -> None:
        """Flush the quarantine (raising what it finds). Live blocks stay valid
        until deallocated; from now on freed blocks skip the quarantine. Idempotent."""
        if self._closed:
            return
        self._mark_closed()
        self.flush()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} live={self._live_bytes} quarantined={len(self._quarantine)} "
                f"({self._quarantined_bytes} B) over {self.upstream!r}>")

    # -- internals ---------------------------------------------------------
    def _context_alive(self) -> bool:
        return self.device.state.generation == self._generation

    def _stream_of(self, e: _Guarded) -> Stream:
        """The stream to read and poison a block on: its alloc stream, or where that
        was closed, the default stream after a device synchronization."""
        s = e.up.alloc_stream
        if s._closed:
            self._backend.device_synchronize(self.device.ordinal)
            return self.device.default_stream
        return s

    def _check_guards(self, e: _Guarded, s: Stream, when: str) -> list[IgnisError]:
        """Read both guards back on ``s`` (the host waits) and report the damaged ones."""
        g = self.canary_bytes
        if not g:
            return []
        n = e.block.requested
        buf = np.empty(2 * g, np.uint8)
        copy = self._backend.memcpy_dtoh_async
        copy(buf.ctypes.data, e.up.ptr, g, s.handle)
        copy(buf.ctypes.data + g, e.up.ptr + g + n, g, s.handle)
        self._backend.stream_synchronize(s.handle)
        problems: list[IgnisError] = []
        for side, data, base in (("before", buf[:g], -g), ("after", buf[g:], n)):
            bad = np.flatnonzero(data != self.canary)
            if bad.size:
                problems.append(self._oob(e, side, base + int(bad[0]), base + int(bad[-1]), int(bad.size),
                                          data[bad[0]:bad[0] + _SAMPLE].tobytes(), when, freed=False))
        return problems

    def _check_poison(self, e: _Guarded, when: str) -> UseAfterFreeError | None:
        """The write-after-free report of a quarantined block, or None if it still holds the poison."""
        b = e.block
        hit = _damage(self._backend, b.ptr, b.requested, self._stream_of(e), self.poison)
        if hit is None:
            return None
        first, last, count, found = hit
        return self._after_free(e, first, last, count, found, when)

    # -- reports (both modes) ----------------------------------------------------------
    def _oob(self, e: _Guarded, side: str, first: int, last: int, count: int, found: bytes, when: str,
             freed: bool) -> OutOfBoundsError:
        """The report of a damaged guard: ``side`` "before" / "after", the damaged bytes at offsets
        ``first..last`` from the block's start (``count`` of them, ``found`` from the first on),
        ``when`` it was seen, ``freed`` if the block was freed by then."""
        b = e.block
        where = "past the end" if side == "after" else "before the start"
        after = " (it was already freed: the write may have come through a stale pointer)" if freed else ""
        return OutOfBoundsError(
            f"a write {where} of a {b.requested}-byte {_noun(b.tag)} (tag {b.tag!r}, ptr {b.ptr:#x}, generation "
            f"{b.generation}){after}: {count} of the {self.canary_bytes} guard bytes {side} it were overwritten, at "
            f"offsets {first}..{last} from its start (found {found.hex(' ')}, expected {self.canary:#04x}); "
            f"detected {when}. Check the sizes and index arithmetic of the kernels and copies that write it",
            generation=b.generation, ptr=b.ptr, tag=b.tag, side=side, offset=first, last_offset=last,
            damaged=count, found=found, nbytes=b.requested, stack=e.stack_text(), when=when,
            frames=e.stack)

    def _after_free(self, e: _Guarded, first: int, last: int, count: int, found: bytes, when: str
                    ) -> UseAfterFreeError:
        """The report of a write into a freed block: ``count`` bytes at offsets ``first..last``
        no longer hold the poison (``found`` from the first on), seen ``when``."""
        b = e.block
        stack = e.stack_text()
        err = UseAfterFreeError(
            f"a {b.requested}-byte {_noun(b.tag)} (tag {b.tag!r}, ptr {b.ptr:#x}) was written after it was freed: "
            f"{count} byte(s) at offsets {first}..{last} no longer hold the poison {self.poison:#04x} (found "
            f"{found.hex(' ')}); detected {when}. Some kernel or copy still writes through a stale pointer or "
            "array to it (order that work before the free, or stop keeping the stale reference)",
            generation=b.generation, ptr=b.ptr, tag=b.tag, side="after-free", offset=first, last_offset=last,
            damaged=count, found=found, nbytes=b.requested, stack=stack, when=when, frames=e.stack)
        if stack:
            err.message += f"\nallocated at:\n{stack}"
            err.args = (err.message,)
        return err

    def _release(self, entries: list[_Guarded], *, full_sync: bool) -> list[IgnisError]:
        """Check the poison of blocks leaving the quarantine and return each upstream,
        whatever happens to the others. Returns the problems; re-raises the first
        failure of a driver call only after every block was returned."""
        problems: list[IgnisError] = []
        failure: BaseException | None = None
        alive = self._context_alive()
        if full_sync and entries and alive:
            try:
                self._backend.device_synchronize(self.device.ordinal)
            except BaseException as exc:
                failure = exc
        for e in entries:
            if alive and failure is None:
                try:
                    p = self._check_poison(e, "when it left the quarantine")
                    if p is not None:
                        problems.append(p)
                except BaseException as exc:
                    failure = exc
            try:
                self._return(e)
            except BaseException as exc:
                self._requarantine(e)  # the upstream refused it: kept for a later flush
                if failure is None:
                    failure = exc
        if failure is not None:
            raise failure
        return problems

    def _return(self, e: _Guarded) -> None:
        """Hand the upstream block back and mark the inner block FREED (and drop its link to
        the record: the pair would otherwise live on as a cycle, for the garbage collector).
        If the upstream refuses, nothing changes here and its error propagates."""
        b = e.block
        if e.up.state is BlockState.LIVE:
            self.upstream.deallocate(e.up)
        b.transition(BlockState.FREED)
        b._drop_impl()
        rec = _HOOKS.recorder
        if rec is not None:
            rec("free_completed", self, b.ptr, b.requested, b.alloc_stream, b)

    def _requarantine(self, e: _Guarded) -> None:
        """A block the upstream refused to take back goes into the quarantine again (counted),
        for a later ``flush``."""
        with self._lock:
            self._quarantine[e.block.ptr] = e
            self._count_bytes(0, self._held(e))

    def _return_or_relive(self, e: _Guarded) -> None:
        """``_return`` for a block being deallocated (still LIVE); if the upstream refuses,
        the block is live here again (counted, usable, freeable) and the error propagates."""
        try:
            self._return(e)
        except BaseException:
            with self._lock:
                self._live[e.block.ptr] = e
                self._count_bytes(e.block.requested, 0)
            raise


class DeferredGuardResource(DebugGuardResource):
    """The debug guard whose checks run on the device in batches, for frameworks'
    allocators (``ignis.torch`` and ``ignis.cupy`` install it): ``allocate`` and
    ``deallocate`` never wait for the device. Problems go to ``on_problem(err)`` (default: kept in ``found``);
    ``check()`` and ``flush()`` wait for everything and return (or raise) the
    problems found since the previous ``check()`` / ``flush()``.

    Args:
        upstream: the resource the guarded blocks (with their canaries) come from; a
            ``PoolResource`` lets checked blocks be reused without a memset.
        batch: jobs per check batch on a stream (1 to ``MAX_BATCH``).
        stack_depth: user frames kept per allocation (1 to 64).
        ready_limit: bytes the ready cache may hold, guards included (0: none).
        **guard_options: ``DebugGuardResource``'s (``canary_bytes``, ``poison``, ``canary``,
            ``quarantine_count``, ``quarantine_bytes``, ``capture_stacks``).

    ``allocate`` (both modes'), ``free_fast`` (a framework's free, its common case) and the
    return of blocks whose checks are queued are compiled (``GuardBase``, ``guard_base.pyx``);
    the methods here are the rest, and the slow cases those call back into. The records,
    the quarantine, the canaries and poison, and the reports are the eager guard's."""

    def __init__(self, upstream: Any, *, batch: int = 64, stack_depth: int = 6, ready_limit: int = 64 << 20,
                 **guard_options: Any) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"batch must be an int from 1 to {MAX_BATCH}, got {batch!r}")
        if isinstance(ready_limit, bool) or not isinstance(ready_limit, int) or ready_limit < 0:
            raise ValueError(f"ready_limit must be a non-negative int, got {ready_limit!r}")
        super().__init__(upstream, stack_depth=stack_depth, **guard_options)
        self.on_problem: Callable[[IgnisError], None] | None = None
        self.found: list[IgnisError] = []
        self._unreturned: list[IgnisError] = []
        # The compiled half's state (guard_base.pxd): the check batches; pool block address ->
        # (pool block, its size, user bytes) of blocks whose guards and poison a check left
        # intact (allocating the same again needs no memset, another size only the bytes that
        # differ: _reformat); the blocks that left the quarantine with their check queued; the
        # ready cache, (stream, user bytes, tag) -> pool blocks that left the quarantine with
        # their check and repair queued on that stream, kept from the pool (at most
        # ``ready_limit`` bytes with their guards), which an allocation of the same size and
        # tag on the same stream takes as it is; and the blocks freed from another stream than
        # theirs (see the torch entry points' free, ignis.torch._guard_fast), whose poison
        # waits for their stream's next allocation or check, as a reuse would.
        self._configure_deferred(batch, ready_limit, isinstance(upstream, PoolResource))
        add_close_hook(self._note_stream_close)
        self._rs_event = 0

    def _after_oom(self, nbytes: int, stream: Stream, tag: str) -> DeviceBlock:
        """The upstream ran out: empty the quarantine (its checks queued, then waited
        for, so the blocks are back in the pool) and retry once; re-raise if nothing was held."""
        with self._lock:
            held = bool(self._quarantine or self._held_exit or self._ready or any(self._checker.pending.values()))
        if not held:
            raise
        self._drain(wait=True)
        self.upstream.reap_pending()
        return self.upstream.allocate(nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock, *, foreign: bool = False) -> None:
        """Poison the bytes (in stream order, after every recorded use), queue the
        check of the guards and quarantine the block. Never waits for the device (but once
        ``close()``d, when the guards are read at once); what the checks find goes to
        ``on_problem`` later. ``foreign``: a framework's tensor, which the sanitizer follows
        as a foreign extent (not as an Ignis block)."""
        entry = self._take_for_free(block, foreign)
        if entry is None:
            return
        up = entry.up
        try:
            closed = up.alloc_stream._closed
            stream = self._stream_of(entry)
            h = stream.handle
            rs = entry.rs
            if rs:
                # record_stream: the free waits for the work queued so far on those streams
                # (PyTorch's rule), whatever the ordering policy (the program declared it).
                b = self._backend
                if not self._rs_event:
                    self._rs_event = b.event_create(self.device.ordinal)
                for o in rs:
                    if o is not stream and not o._closed:
                        b.event_record(self._rs_event, o.handle)
                        b.stream_wait_event(h, self._rs_event)
                entry.rs = None
            # A block nobody tracked a use of (every framework tensor: the framework orders
            # its own work) is clean on its stream: no wait to queue, nothing to reset.
            tracked = self._tracks and not up.clean_on(up.alloc_stream)
            if tracked and not closed and _ord.policy(stream) == _ord.AUTO:
                self.upstream.prepare_block_use(up, stream, Access.READ_WRITE)
            fill_bytes(self._backend, block.ptr, self.poison, block.requested, h)
            if closed:
                self._backend.stream_synchronize(h)
            if tracked:
                self.upstream.finish_block_use(up, up.alloc_stream, Access.READ_WRITE)
        except BaseException as exc:
            self._undo_free(entry, exc)
            raise
        with self._lock:
            bypass, evicted = self._enter_quarantine(entry)
            for e in evicted:
                self._held_exit[e.block.ptr] = e
            if bypass:
                self._held_exit[block.ptr] = entry
        if bypass and self._closed:
            # Closed: its batches are gone. The guards are read here (the host waits), the block
            # goes back upstream at once, and what the read found is reported as usual.
            try:
                problems = self._check_guards(entry, stream, "on free")
            finally:
                self._release_exit(entry, formatted=False)
            for p in problems:
                self._report_once(entry, p)
            return
        ck = self._checker
        if bypass:
            ck.add(stream, entry, EXIT, "on free")
        else:
            ck.add(stream, entry, FREE, "on free")
        for e in evicted:
            ck.add(self._stream_of(e), e, EXIT, "when its memory left the quarantine")
        ck.after_free()

    def _double(self, block: DeviceBlock) -> Exception:
        try:
            self._check_dealloc(block, self._live)
        except Exception as exc:  # noqa: BLE001 - the error to raise
            return exc
        return RuntimeError(f"block {block.ptr:#x} could not be freed")

    def _release_exit(self, e: _Guarded, *, formatted: bool) -> None:
        """A block leaving the quarantine whose check is queued: back to the pool now."""
        with self._lock:
            self._held_exit.pop(e.block.ptr, None)
        up = e.up
        try:
            self._return(e)
        except BaseException:
            self._requarantine(e)  # the upstream refused it: kept for a later flush
            raise
        if formatted and self._reuse and up._impl is not None:
            if len(self._formatted) > 1 << 16:
                self._formatted.clear()
            self._formatted[up.ptr] = (up._impl, up._impl.size, e.block.requested)

    def _reformat(self, up: DeviceBlock, old: int, nbytes: int) -> None:
        """Format for ``nbytes`` user bytes a pool block that a check left intact for ``old``
        user bytes (canary ``[0, G)``, poison ``[G, G + old)``, canary ``[G + old, 2G + old)``,
        checked and repaired in stream order before the block went back to the pool): only
        the bytes that differ are written. Smaller: the poison ``[G + nbytes, G + old)`` that
        the new after-guard covers becomes canary. Larger: poison from ``G + old`` (over the
        old after-guard) to ``G + nbytes``, then the new after-guard. The block then holds
        exactly what ``_format`` writes. If a memset fails, the block goes back upstream and
        the error propagates."""
        g = self.canary_bytes
        try:
            handle = up.alloc_stream._check()
            b = self._backend
            if nbytes < old:
                fill_bytes(b, up.ptr + g + nbytes, self.canary, min(g, old - nbytes), handle)
            else:
                fill_bytes(b, up.ptr + g + old, self.poison, nbytes - old, handle)
                fill_bytes(b, up.ptr + g + nbytes, self.canary, g, handle)
        except BaseException:
            self.upstream.deallocate(up)
            raise

    def note_record_stream(self, block: DeviceBlock, stream: Stream) -> None:
        """Work on ``stream`` uses the live ``block`` (``Tensor.record_stream``): its free
        will wait for the work queued there up to the free."""
        with self._lock:
            e = self._resolve(block)
            if stream is e.up.alloc_stream:
                return
            if e.rs is None:
                e.rs = {stream}
            else:
                e.rs.add(stream)

    # -- checks ------------------------------------------------------------------------
    def live_check(self, when: str = "at a synchronize point") -> None:
        """Queue a check of the guards of every live block (on each block's stream); nothing
        once closed (``check()`` reads them then)."""
        if self._closed or not self._context_alive():
            return
        ck = self._checker
        with ck.lock:  # held first: a block freed meanwhile gets its jobs after these
            with self._lock:
                live = list(self._live.values())
            ck.add_many(live, LIVE, when)
            ck.launch_all()

    def on_sync(self, live: bool) -> None:
        """A synchronize point: queue what is pending, read what finished, and (``live``)
        check the guards of the live blocks. Nothing once closed."""
        if self._closed or not self._context_alive():
            return
        ck = self._checker
        ck.launch_all()
        ck.poll()
        if live:
            self.live_check()

    def check(self, *, raise_: bool = True) -> list[IgnisError]:
        """Check now the guards of every live block and the poison and guards of every
        quarantined one, wait for every check queued so far, and return the problems
        found since the previous ``check()`` / ``flush()`` (raise the first with ``raise_``).
        Changes nothing: damaged blocks stay as they are. Closed (no batches any more), the
        live blocks' guards are read here, the host waiting."""
        if self._closed and self._context_alive():
            with self._lock:
                live = list(self._live.values())
            for e in live:
                for p in self._check_guards(e, self._stream_of(e), "by check()"):
                    self._report_once(e, p)
        elif self._context_alive():
            ck = self._checker
            with ck.lock:  # held first: a block leaving the quarantine meanwhile is checked after these
                self.live_check("by check()")
                with self._lock:
                    held = list(self._quarantine.values())
                for e in held:
                    ck.add(self._stream_of(e), e, HELD, "by check() (the block waits in the quarantine)")
                ck.wait()
        return self._take_found(raise_)

    def flush(self, *, raise_: bool = True) -> list[IgnisError]:
        """Empty the quarantine: check each block's poison and guards, return it to the
        pool, and wait for every check; return (or raise) the problems found since the
        previous ``check()`` / ``flush()``."""
        self._drain(wait=True)
        return self._take_found(raise_)

    def _drain(self, *, wait: bool) -> None:
        """Empty the quarantine (its blocks' checks queued, or with ``wait`` waited for) and
        hand the ready cache back to the pool, the blocks that just left the quarantine too."""
        try:
            with self._lock:
                entries = self._take_quarantine(len(self._quarantine))
                for e in entries:
                    self._held_exit[e.block.ptr] = e
            if not self._context_alive():
                for e in entries:
                    self._release_exit(e, formatted=False)
                return
            ck = self._checker
            with ck.lock:
                for e in entries:
                    ck.add(self._stream_of(e), e, EXIT, "when its memory left the quarantine")
                ck.launch_all()
                if wait:
                    ck.wait()
        finally:  # whatever failed above, nothing stays behind in the ready cache
            self._release_ready()

    def _take_found(self, raise_: bool) -> list[IgnisError]:
        with self._lock:
            out, self._unreturned = self._unreturned, []
        if out and raise_:
            err = out[0]
            err.others = out[1:]
            raise err
        return out

    def close(self) -> None:
        """Flush the quarantine and the ready cache (waiting for their checks), then give back
        the check batches' buffers and events (a guard dropped without ``close()`` keeps them
        until the process ends). Live blocks stay valid; a block freed from now on is checked
        at once and handed back. Idempotent."""
        if self._closed:
            return
        self._mark_closed()
        try:
            self.flush()
        finally:
            self._checker.close()
            if self._rs_event:
                try:
                    self._backend.event_destroy(self._rs_event)
                except Exception:  # noqa: BLE001 - a dead context took it already
                    pass
                self._rs_event = 0

    def memory_numbers(self) -> dict[str, int]:
        nums = super().memory_numbers()
        with self._lock:
            nums["cached_bytes"] += sum(self._held(e) for e in self._held_exit.values()) + self._ready_bytes
        return nums

    # -- reports -----------------------------------------------------------------------
    def _problems_from(self, e: _Guarded, kind: str, when: str, r: list[int]) -> None:
        b = e.block
        n = b.requested
        G = self.canary_bytes
        for zone in (0, 2, 1):
            first = r[zone]
            if first == _NONE:
                continue
            last = (~r[3 + zone]) & _NONE
            count = _NONE - r[6 + zone]
            zlen = n if zone == 1 else G
            found = (r[9 + 2 * zone].to_bytes(8, "little") + r[10 + 2 * zone].to_bytes(8, "little"))
            found = found[:min(16, zlen - first)]
            if zone == 1:
                err = self._after_free(e, first, last, count, found, when)
            else:
                base = -G if zone == 0 else n
                # freed: the damage may be newer than the free (a block that skipped the quarantine
                # is checked at its free: what it finds was there before)
                err = self._oob(e, "before" if zone == 0 else "after", base + first, base + last, count, found,
                                when, freed=kind == HELD or (kind == EXIT and when != "on free"))
            self._report_once(e, err)

    def _report_once(self, e: _Guarded, err: IgnisError) -> None:
        """``_report`` unless a problem on the same side of ``e`` was reported already (a damage
        stays until the block is repaired: one report of it)."""
        side = err.side
        if e.reported is not None and side in e.reported:
            return
        if e.reported is None:
            e.reported = {side}
        else:
            e.reported.add(side)
        self._report(err)

    def _report(self, err: IgnisError) -> None:
        with self._lock:
            self.found.append(err)
            self._unreturned.append(err)
        sink = self.on_problem
        if sink is not None:
            try:
                sink(err)
            except Exception:  # a report must never break the allocator
                pass
