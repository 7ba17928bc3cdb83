"""Adaptors: resources that wrap one ``upstream``, keep it alive and forward
what they do not change (tracking above all, bound straight to the upstream's
methods so forwarding costs nothing).

- ``BudgetResource``: refuses allocations past a byte limit, deterministically.
- ``LoggingResource``: a CSV line per allocate / free, in the format RMM's
  replay tools read (``Thread,Time,Action,Pointer,Size,Stream``).
- ``StatisticsResource``: current / peak / total bytes and counts, nested
  counter frames, and the same per tag.
- ``TrackingResource``: outstanding allocations, optionally with the Python
  stack that made each, and a readable report.

A failing upstream allocation leaves every adaptor's counters as they were.

Closing: ``ResourceAdaptor.allocate`` refuses a closed adaptor (``ClosedError``) before
asking its upstream for anything, then calls the adaptor's own ``_allocate_open``; the
adaptors here add their work there, not by overriding ``allocate`` (the debug guards,
which replace the allocation itself, make the same check first in theirs). A block the
upstream gave is handed back if the adaptor's own step then fails (a log that cannot be
written), so nothing is lost. Deallocation works after ``close()``, as the contract says.
"""

from __future__ import annotations

import csv
import io
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..errors import OutOfBudgetError
from ..runtime import Stream
from .resource import DeviceMemoryResource
from .types import UNTAGGED
from .block import DeviceBlock

__all__ = ["ResourceAdaptor", "BudgetResource", "LoggingResource", "StatisticsResource",
           "TrackingResource", "Counter", "Statistics", "LOG_HEADER"]


class ResourceAdaptor(DeviceMemoryResource):
    """Base of the adaptors: forwards everything to ``upstream``.

    The tracking methods are the upstream's own (bound at construction), so an
    adaptor tracks exactly when its upstream does.

    Args:
        upstream: the ``DeviceMemoryResource`` to wrap (kept alive by the adaptor).

    Attributes:
        upstream: the wrapped resource.

    Raises:
        TypeError: ``upstream`` is not a DeviceMemoryResource.
    """

    def holds(self, block: "DeviceBlock") -> bool:
        """The upstream's answer: an adaptor's blocks are its upstream's."""
        return self.upstream.holds(block)

    def __init__(self, upstream: DeviceMemoryResource) -> None:
        if not isinstance(upstream, DeviceMemoryResource):
            raise TypeError(f"upstream must be a DeviceMemoryResource, got {type(upstream).__name__}")
        self._serve_as(upstream)
        # Forward tracking with no extra frame.
        self.prepare_block_use = upstream.prepare_block_use
        self.finish_block_use = upstream.finish_block_use
        self.record_block_use = upstream.record_block_use

    def _serve_as(self, upstream: DeviceMemoryResource) -> None:
        """Serve ``upstream``'s memory and keep it as ``upstream`` (a compiled subclass,
        the debug guard, keeps it in its own read-only field: its ``_serve_as`` comes first)."""
        super()._serve_as(upstream)
        self.upstream = upstream

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        """The upstream's ``allocate(nbytes, stream, tag)`` through this adaptor's own step
        (``_allocate_open``), with their errors (see ``DeviceMemoryResource.allocate``).

        Args:
            nbytes: the size in bytes, at least 1.
            stream: the ``Stream`` the allocation is ordered on; None for the default stream.
            tag: a label shown in logs, statistics and reports.

        Raises:
            ClosedError: the adaptor was closed (nothing is asked of the upstream).
            StaleHandleError: the adaptor predates a context rebuild.
        """
        if self._closed or self._generation != self.device.state.generation:
            self._check_alive()
        return self._allocate_open(nbytes, stream, tag)

    def _allocate_open(self, nbytes: int, stream: Stream | None, tag: str) -> DeviceBlock:
        """``allocate`` once the adaptor is known open: what an adaptor adds to the upstream's
        allocation (here: nothing)."""
        return self.upstream.allocate(nbytes, stream, tag)

    def deallocate(self, block: DeviceBlock) -> None:
        """The upstream's ``deallocate(block)``, with its errors (see
        ``DeviceMemoryResource.deallocate``).

        Args:
            block: a LIVE block allocated through this adaptor.
        """
        self.upstream.deallocate(block)

    @property
    def bytes_outstanding(self) -> int:
        return self.upstream.bytes_outstanding

    def reap_pending(self) -> None:
        self.upstream.reap_pending()

    @property
    def supports_block_use_tracking(self) -> bool:
        """The upstream's: True if it orders cross-stream uses of its blocks."""
        return self.upstream.supports_block_use_tracking

    def memory_numbers(self) -> dict[str, int]:
        return self.upstream.memory_numbers()

    def trim(self) -> int:
        """The upstream's ``trim()`` where it has one: hand cached memory back.

        Returns:
            The bytes released, as the upstream reports them (0 if it has no ``trim`` or
            reports nothing).
        """
        trim = getattr(self.upstream, "trim", None)
        return (trim() or 0) if trim is not None else 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.upstream!r}>"


class BudgetResource(ResourceAdaptor):
    """Refuses any allocation that would take the requested bytes outstanding
    through this adaptor past ``limit_bytes`` (``OutOfBudgetError``).

    Requested bytes are counted (not the upstream's rounding), from allocate to
    deallocate; a failing upstream allocation counts nothing.

    Args:
        upstream: the ``DeviceMemoryResource`` to wrap.
        limit_bytes: the budget, in bytes (a non-negative int).

    Raises:
        ValueError: ``limit_bytes`` is not a non-negative int.
        TypeError: ``upstream`` is not a DeviceMemoryResource.
    """

    def __init__(self, upstream: DeviceMemoryResource, limit_bytes: int) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ValueError(f"limit_bytes must be a non-negative int, got {limit_bytes!r}")
        super().__init__(upstream)
        self.limit_bytes = limit_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """Bytes (as requested) allocated through this adaptor and not yet deallocated."""
        return self._used

    @property
    def remaining_bytes(self) -> int:
        """Bytes left in the budget: ``limit_bytes - used_bytes``."""
        return self.limit_bytes - self._used

    def _allocate_open(self, nbytes: int, stream: Stream | None, tag: str) -> DeviceBlock:
        """The upstream's allocation (with its errors), unless ``nbytes`` exceeds the
        remaining budget: then ``OutOfBudgetError`` (nothing is asked of the upstream)."""
        with self._lock:
            remaining = self.limit_bytes - self._used
            if type(nbytes) is int and nbytes > remaining:
                raise OutOfBudgetError(nbytes, remaining, self.limit_bytes)
            if type(nbytes) is int and nbytes > 0:
                self._used += nbytes
        try:
            return self.upstream.allocate(nbytes, stream, tag)
        except BaseException:
            if type(nbytes) is int and nbytes > 0:
                with self._lock:
                    self._used -= nbytes
            raise

    def deallocate(self, block: DeviceBlock) -> None:
        """The upstream's deallocation; then the block's requested bytes are back in the budget.

        Args:
            block: a LIVE block allocated through this adaptor.
        """
        self.upstream.deallocate(block)
        with self._lock:
            self._used -= block.requested


LOG_HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]


class LoggingResource(ResourceAdaptor):
    """Writes one CSV line per allocate, failed allocate and free.

    Columns: ``Thread,Time,Action,Pointer,Size,Stream`` (RMM's layout: time as
    ``HH:MM:SS.ffffff``, pointer and stream in hex); with ``extra_columns=True``
    also ``Tag,Generation``. ``path`` may be a file name or a text stream.
    Lines are buffered; ``flush()`` / ``close()`` write them out.

    Args:
        upstream: the ``DeviceMemoryResource`` to wrap.
        path: a file name (created or truncated; the adaptor closes it) or a text stream
            (left open; flushed on ``close()``).
        extra_columns: also write each allocation's tag and generation.
        auto_flush: flush after every line.

    Raises:
        TypeError: ``upstream`` is not a DeviceMemoryResource.
        OSError: the file cannot be opened.
    """

    def __init__(self, upstream: DeviceMemoryResource, path: "str | os.PathLike | io.TextIOBase",
                 *, extra_columns: bool = False, auto_flush: bool = False) -> None:
        super().__init__(upstream)
        if isinstance(path, (str, os.PathLike)):
            self._file = open(path, "w", newline="")
            self._owns_file = True
        else:
            self._file = path
            self._owns_file = False
        self.path = path
        self.extra_columns = extra_columns
        self.auto_flush = auto_flush
        self._writer = csv.writer(self._file)
        self._lock = threading.Lock()
        header = LOG_HEADER + (["Tag", "Generation"] if extra_columns else [])
        self._writer.writerow(header)

    @staticmethod
    def _now() -> str:
        t = time.time()
        return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1e6):06d}"

    def _write(self, action: str, ptr: int, size: int, stream: Stream | None, tag: str, gen: Any) -> bool:
        """Log one line; False (nothing written) once ``close()`` closed the log."""
        row = [threading.get_ident(), self._now(), action, f"{ptr:#x}", size,
               f"{stream.handle:#x}" if stream is not None else "0x0"]
        if self.extra_columns:
            row += [tag, gen]
        with self._lock:
            if self._closed:
                return False
            self._writer.writerow(row)
            if self.auto_flush:
                self._file.flush()
        return True

    def _allocate_open(self, nbytes: int, stream: Stream | None, tag: str) -> DeviceBlock:
        """The upstream's allocation, logged as ``allocate`` (or ``allocate failure`` when the
        upstream raises a ``MemoryError``, such as ``OutOfMemoryError``, which is re-raised).
        If the line cannot be written (the log was closed meanwhile, or the write failed), the
        block goes back upstream and the error is raised: no block leaves unlogged."""
        try:
            block = self.upstream.allocate(nbytes, stream, tag)
        except MemoryError:
            s = stream if isinstance(stream, Stream) else None
            self._write("allocate failure", 0, nbytes if isinstance(nbytes, int) else 0, s, tag, "")
            raise
        try:
            if not self._write("allocate", block.ptr, block.requested, block.alloc_stream, tag, block.generation):
                self._check_alive()  # closed while the upstream allocated: ClosedError
        except BaseException:
            self.upstream.deallocate(block)
            raise
        return block

    def deallocate(self, block: DeviceBlock) -> None:
        """The upstream's deallocation, then a ``free`` line (none once the log is closed).

        Args:
            block: a LIVE block allocated through this adaptor.
        """
        self.upstream.deallocate(block)
        self._write("free", block.ptr, block.requested, block.alloc_stream, block.tag, block.generation)

    def flush(self) -> None:
        """Write the buffered lines out (nothing once closed)."""
        with self._lock:
            if not self._closed:
                self._file.flush()

    def close(self) -> None:
        """Refuse further allocations, then close the log file it opened (or flush a stream
        it was given). Frees after this are not logged. Idempotent."""
        with self._lock:
            if self._closed:
                return
            super().close()
            if self._owns_file and not self._file.closed:
                self._file.close()
            elif not self._owns_file:
                self._file.flush()


@dataclass
class Counter:
    """Current, peak and total of one quantity.

    Attributes:
        value: the current amount.
        peak: the highest ``value`` seen.
        total: the sum of everything added.
    """

    value: int = 0
    peak: int = 0
    total: int = 0

    def add(self, n: int) -> None:
        """Add ``n`` to ``value`` and ``total``, and raise ``peak`` if passed.

        Args:
            n: the amount.
        """
        self.value += n
        self.total += n
        if self.value > self.peak:
            self.peak = self.value

    def sub(self, n: int) -> None:
        """Take ``n`` from ``value``.

        Args:
            n: the amount.
        """
        self.value -= n

    def merge_child(self, child: "Counter") -> None:
        """Fold a popped frame into its parent (RMM's rule: peaks are compared
        relative to the parent's value when the frame was pushed).

        Args:
            child: the popped frame's counter.
        """
        self.peak = max(self.peak, self.value + child.peak)
        self.value += child.value
        self.total += child.total


@dataclass
class Statistics:
    """Bytes and allocation counts.

    Attributes:
        bytes: a ``Counter`` of bytes (as requested).
        count: a ``Counter`` of allocations.
    """

    bytes: Counter = field(default_factory=Counter)
    count: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        """``current_bytes``, ``peak_bytes``, ``total_bytes``, ``current_count``, ``peak_count``,
        ``total_count``."""
        return {"current_bytes": self.bytes.value, "peak_bytes": self.bytes.peak,
                "total_bytes": self.bytes.total, "current_count": self.count.value,
                "peak_count": self.count.peak, "total_count": self.count.total}


class StatisticsResource(ResourceAdaptor):
    """Counts bytes (as requested) and allocations: current, peak, total, and per tag.

    ``push_counters()`` starts a nested frame; ``pop_counters()`` ends it,
    returns it, and folds it into the frame below.

    Args:
        upstream: the ``DeviceMemoryResource`` to wrap.

    Raises:
        TypeError: ``upstream`` is not a DeviceMemoryResource.
    """

    def __init__(self, upstream: DeviceMemoryResource) -> None:
        super().__init__(upstream)
        self._lock = threading.Lock()
        self._stack: list[Statistics] = [Statistics()]
        self._by_tag: dict[str, Statistics] = {}

    def _allocate_open(self, nbytes: int, stream: Stream | None, tag: str) -> DeviceBlock:
        """The upstream's allocation, counted."""
        block = self.upstream.allocate(nbytes, stream, tag)
        n = block.requested
        with self._lock:
            top = self._stack[-1]
            top.bytes.add(n)
            top.count.add(1)
            st = self._by_tag.get(tag)
            if st is None:
                st = self._by_tag[tag] = Statistics()
            st.bytes.add(n)
            st.count.add(1)
        return block

    def deallocate(self, block: DeviceBlock) -> None:
        self.upstream.deallocate(block)
        n = block.requested
        with self._lock:
            top = self._stack[-1]
            top.bytes.sub(n)
            top.count.sub(1)
            st = self._by_tag.get(block.tag)
            if st is not None:
                st.bytes.sub(n)
                st.count.sub(1)

    @property
    def statistics(self) -> Statistics:
        """The current (innermost) frame."""
        with self._lock:
            return self._stack[-1]

    def by_tag(self) -> dict[str, dict[str, int]]:
        """Per tag, the figures of ``Statistics.as_dict()`` (all frames together)."""
        with self._lock:
            return {tag: st.as_dict() for tag, st in self._by_tag.items()}

    def push_counters(self) -> Statistics:
        """Start a nested frame of counters (allocations from now on count in it).

        Returns:
            The new frame's ``Statistics``.
        """
        with self._lock:
            frame = Statistics()
            self._stack.append(frame)
            return frame

    def pop_counters(self) -> Statistics:
        """End the innermost frame and fold it into the one below (its peak relative to
        that frame's value when it was pushed).

        Returns:
            The popped frame's ``Statistics``.

        Raises:
            RuntimeError: no frame was pushed.
        """
        with self._lock:
            if len(self._stack) == 1:
                raise RuntimeError("pop_counters() without a matching push_counters()")
            child = self._stack.pop()
            parent = self._stack[-1]
            parent.bytes.merge_child(child.bytes)
            parent.count.merge_child(child.count)
            return child

    def reset_peak(self) -> None:
        """Set every peak (every frame's and every tag's) to its current value."""
        with self._lock:
            for st in [*self._stack, *self._by_tag.values()]:
                st.bytes.peak = st.bytes.value
                st.count.peak = st.count.value


class TrackingResource(ResourceAdaptor):
    """Keeps every outstanding allocation (and, if asked, the Python stack that made it).

    Args:
        upstream: the ``DeviceMemoryResource`` to wrap.
        capture_stacks: record the Python stack of each allocation (``stack_of``, ``report``).

    Raises:
        TypeError: ``upstream`` is not a DeviceMemoryResource.
    """

    def __init__(self, upstream: DeviceMemoryResource, capture_stacks: bool = False) -> None:
        super().__init__(upstream)
        self.capture_stacks = capture_stacks
        self._lock = threading.Lock()
        self._outstanding: dict[int, tuple[DeviceBlock, Any]] = {}

    def _allocate_open(self, nbytes: int, stream: Stream | None, tag: str) -> DeviceBlock:
        """The upstream's allocation, kept as outstanding (with its stack, if asked)."""
        block = self.upstream.allocate(nbytes, stream, tag)
        stack = traceback.extract_stack(limit=17)[:-2] if self.capture_stacks else None
        with self._lock:
            self._outstanding[block.ptr] = (block, stack)
        return block

    def deallocate(self, block: DeviceBlock) -> None:
        self.upstream.deallocate(block)
        with self._lock:
            self._outstanding.pop(block.ptr, None)

    def outstanding(self) -> list[DeviceBlock]:
        """The blocks allocated through this adaptor and not yet deallocated."""
        with self._lock:
            return [b for b, _ in self._outstanding.values()]

    def stack_of(self, block: DeviceBlock) -> str | None:
        """The Python stack that allocated ``block``, formatted; None if it is not outstanding
        here or stacks were not captured.

        Args:
            block: a block allocated through this adaptor.
        """
        with self._lock:
            entry = self._outstanding.get(block.ptr)
        if entry is None or entry[1] is None:
            return None
        return "".join(traceback.format_list(entry[1]))

    def report(self) -> str:
        """A readable list of outstanding allocations, largest first."""
        with self._lock:
            entries = sorted(self._outstanding.values(), key=lambda e: -e[0].bytes)
        if not entries:
            return "no outstanding allocations"
        total = sum(b.bytes for b, _ in entries)
        lines = [f"{len(entries)} outstanding allocation(s), {total} bytes:"]
        for b, stack in entries:
            lines.append(f"  {b.ptr:#x} {b.requested} B tag={b.tag!r} generation={b.generation} "
                         f"stream=#{b.alloc_stream.id}")
            if stack:
                lines.extend("    " + ln for ln in "".join(traceback.format_list(stack[-4:])).rstrip().splitlines())
        return "\n".join(lines)
