"""Pipelines that move bytes between a file and device memory through a ring of pinned buffers.

Design:
- A transfer is a list of chunks. A chunk is one contiguous file range, read
  or written with one system call into or out of one pinned ring buffer, plus
  its pieces: ``(buffer offset, device address, nbytes)`` copies.
- Load: worker threads fill the ring's pinned buffers, several in flight,
  with ``preadv`` (or, asked for, with copies out of a shared mapping of the
  file, torn down in the background afterwards). The calling thread, in file
  order, queues each chunk's host-to-device copies on the next copy stream
  and records the slot's event. The read that reuses a slot first waits for
  that event, on its worker thread, never on the caller's.
- Save, the mirror: the caller queues each chunk's device-to-host copies into a
  slot and records its event; a worker waits for the event and writes the
  slot to the file, with ``pwrite`` or, on tmpfs, by copying into a shared
  mapping of the file (tmpfs serializes writes to one file behind its inode
  lock; page faults on a mapping run in parallel).
- Copy streams: the caller's stream plus ``streams - 1`` helpers that wait for
  it first; the caller's stream waits for them at the end, so every copy is
  ordered on the caller's stream as far as the memory layer can tell. A load
  synchronizes the host once, at the end; nothing waits per chunk or tensor
  except a ring slot's reuse.

Rules:
- Nothing of a transfer outlives the call. On any error (a read, a driver
  call, the progress callback) reads and writes not started are cancelled,
  running ones awaited, the copy streams drained, and the ring buffers handed
  back before the error propagates; the caller then frees its device memory.
  A failed stream or event destroy at the end still hands every buffer, event
  and stream back before it is raised.
- Ring buffers come from the process's pinned staging pool (``hostcopy``),
  sized to the transfer, and stay cached there for the next one.
- A copy through a mapping faults its pages in first (MADV_POPULATE_*), so
  a full file system or a file cut short is an error, never a SIGBUS;
  the ``"auto"`` writer maps only where the kernel can do that (Linux 5.14+),
  on tmpfs, with room to spare.
- A file cut short under a load is an ``EOFError`` (the loader makes it a
  ``SafetensorsError``), never a crash or other memory read as tensor data.
  The ``"pread"`` reader (the default) promises that outright: a read past the
  end returns short. The ``"mmap"`` reader checks the file's size before it
  maps it (and maps only the bytes the transfer reads) and again before each
  chunk, and faults each chunk's pages in with an error rather than a signal,
  but a file truncated between that and the copy is still a SIGBUS, which
  kills the process: it is opt-in, for files nothing truncates while they load.
- A host buffer that a queued copy reads or writes is never released or reused
  until that copy has completed: after an error, the ring goes back to the
  pinned pool only once the copy streams are drained; if draining fails, the
  ring is held out of circulation (with a ``RuntimeWarning``) until those
  streams are idle or the context is rebuilt (``held_bytes``, ``reclaim_held``).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..array import hostcopy
from ..runtime import Stream

__all__ = ["PipelineOptions", "Chunk", "plan_chunks", "load", "save", "fs_type", "pwrite_all", "held_bytes",
           "reclaim_held"]

Progress = Callable[[int, int], Any]
# (file offset, length, [(buffer offset, device address, nbytes), ...])
Chunk = tuple[int, int, list[tuple[int, int, int]]]

_WRITERS = ("auto", "pwrite", "mmap")
_READERS = ("pread", "mmap")
DEFAULT_WORKERS = max(2, min(16, os.cpu_count() or 8))
MAP_MIN_BYTES = 64 << 20     # "auto" writes through a mapping only for transfers at least this big


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """How a load or save moves its bytes.

    Attributes:
        chunk_bytes: bytes per ring buffer and per file read or write.
        buffers: pinned ring buffers (at most this many chunks in flight).
        workers: threads that read or write the file (default: the CPUs, at most 16).
        streams: copy streams (the caller's and ``streams - 1`` helpers).
        reader: how a load reads: ``"pread"`` (positional reads into the ring;
            the default) or ``"mmap"`` (copies out of a shared mapping of the
            file). ``"mmap"`` is opt-in: a file truncated by someone else while
            a chunk is copied out of the mapping raises SIGBUS and kills the
            process (its checks narrow that window but cannot close it), where
            ``"pread"`` always raises a clean error.
        writer: how a save writes: ``"pwrite"``, ``"mmap"`` (copies into a
            shared mapping of the file), or ``"auto"`` (``mmap`` on tmpfs with
            room to spare, else ``pwrite``).
        gap_bytes: a partial load reads through holes up to this size rather
            than starting another read.
    """

    # Defaults from benchmarks/bench_safetensors.py --sweep on an H200 host (4.2 GB from
    # tmpfs): 8 MiB chunks and 16 readers beat 16 / 32 MiB and 8 / 12 readers; pread and
    # mmap readers were within a few percent of each other; one or two streams alike.
    chunk_bytes: int = 8 << 20
    buffers: int = DEFAULT_WORKERS + 4
    workers: int = DEFAULT_WORKERS
    streams: int = 2
    reader: str = "pread"
    writer: str = "auto"
    gap_bytes: int = 1 << 16

    def __post_init__(self) -> None:
        for name in ("chunk_bytes", "buffers", "workers", "streams"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PipelineOptions.{name} must be a positive int, got {v!r}")
        if isinstance(self.gap_bytes, bool) or not isinstance(self.gap_bytes, int) or self.gap_bytes < 0:
            raise ValueError(f"PipelineOptions.gap_bytes must be a non-negative int, got {self.gap_bytes!r}")
        if self.reader not in _READERS:
            raise ValueError(f"PipelineOptions.reader must be one of {', '.join(_READERS)}, got {self.reader!r}")
        if self.writer not in _WRITERS:
            raise ValueError(f"PipelineOptions.writer must be one of {', '.join(_WRITERS)}, got {self.writer!r}")


def plan_chunks(runs: Iterable[tuple[int, int, int]], chunk_bytes: int, gap_bytes: int = 0) -> list[Chunk]:
    """Cut ``(file offset, device address, nbytes)`` runs, sorted by file offset and
    not overlapping, into chunks of at most ``chunk_bytes``. Runs that touch in the
    file and on the device merge into one copy; holes up to ``gap_bytes`` are read
    through."""
    merged: list[list[int]] = []
    for f, d, n in runs:
        if n <= 0:
            continue
        if merged and merged[-1][0] + merged[-1][2] == f and merged[-1][1] + merged[-1][2] == d:
            merged[-1][2] += n
        else:
            merged.append([f, d, n])
    chunks: list[Chunk] = []
    start = end = 0
    pieces: list[tuple[int, int, int]] | None = None
    for f, d, n in merged:
        while n > 0:
            if pieces is None or f >= start + chunk_bytes or f - end > gap_bytes:
                pieces = []
                start = end = f
                chunks.append((start, 0, pieces))
            k = min(n, start + chunk_bytes - f)
            pieces.append((f - start, d, k))
            end = f + k
            chunks[-1] = (start, end - start, pieces)
            f += k
            d += k
            n -= k
    return chunks


# -- shared machinery ---------------------------------------------------------------
class _Inline:
    """An executor that runs the task at once (a transfer of one chunk needs no thread)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(e)
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


class _Ring:
    """Pinned buffers, their events, the copy streams and the file workers of one transfer."""

    def __init__(self, stream: Stream, chunks: Sequence[Chunk], opts: PipelineOptions) -> None:
        if _held:
            reclaim_held()
        n = len(chunks)
        self.stream = stream
        self.k = min(opts.buffers, n)
        self.bufs: list[Any] = []
        self.events: list[Any] = []
        self.streams: list[Stream] = [stream]
        self.futures: dict[int, Future] = {}
        self.executor: Any = None
        dev = stream.device
        try:
            cap = max(c[1] for c in chunks)
            pool = hostcopy.pinned_pool()
            for _ in range(self.k):
                self.bufs.append(pool.allocate(cap))
            self.arrays = [b.array for b in self.bufs]
            for _ in range(self.k):
                self.events.append(dev.create_event())
            for _ in range(min(opts.streams, n) - 1):
                s = dev.create_stream()
                self.streams.append(s)
                s.wait(stream)
            workers = min(opts.workers, n)
            self.executor = _Inline() if n == 1 else \
                ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ignis-io")
        except BaseException:
            self.close(ok=False)
            raise

    def join(self) -> None:
        """Make the caller's stream wait for the helper streams."""
        for s in self.streams[1:]:
            self.stream.wait(s)

    def close(self, ok: bool) -> None:
        """Stop the workers and hand everything back, raising (when ``ok``) the first
        failure of a destroy only after every buffer, event and stream has been handed
        back. After an error, the ring buffers go back only once the streams are drained:
        a copy still queued on them may read or write the buffers. When a stream cannot be
        drained (its synchronize fails), the buffers are held out of the pinned pool
        (``held_bytes``) until ``reclaim_held`` finds those streams idle."""
        if self.executor is not None:
            for fut in self.futures.values():
                fut.cancel()
            self.executor.shutdown(wait=True)
            self.executor = None
        self.futures.clear()
        if not ok:  # copies may still be queued: they must finish before buffers and memory go back
            failed = None
            for s in self.streams:
                try:
                    s.synchronize()
                except Exception as e:  # noqa: BLE001 - the buffers are held instead; see below
                    failed = failed or e
            if failed is not None and self.bufs:
                _hold(self, failed)
                return
        bufs, events, helpers = self.bufs, self.events, self.streams[1:]
        self.bufs, self.events, self.streams[1:] = [], [], []
        _hand_back(bufs, events, helpers, raise_first=ok)


def _hand_back(bufs: list, events: list, helpers: list, raise_first: bool) -> None:
    """Release the buffers, then destroy the events and helper streams. Every one is
    handed back whatever fails; the first failure is raised at the end if asked."""
    first: BaseException | None = None
    for fn in [b.release for b in bufs] + [ev.close for ev in events] + [s.close for s in helpers]:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the others still go back; the first is raised below
            first = first or e
    if first is not None and raise_first:
        raise first


# -- ring buffers held back after an error -------------------------------------------
class _Held:
    """A failed transfer's ring: buffers, events and helper streams kept out of circulation."""

    __slots__ = ("bufs", "events", "helpers", "marks", "device", "generation", "nbytes")

    def __init__(self, ring: _Ring) -> None:
        self.bufs, self.events, self.helpers = ring.bufs, ring.events, ring.streams[1:]
        self.device = ring.stream.device
        self.generation = self.device.state.generation
        self.nbytes = sum(b.capacity for b in self.bufs)
        # What proves the copies done: an event recorded after them on each stream (the
        # caller's stream may stay busy with later work), else the stream falling idle.
        self.marks: list[Any] = []
        for s in ring.streams:
            try:
                self.marks.append(s.record())
            except Exception:  # noqa: BLE001 - the driver refuses: wait for the stream to be idle
                self.marks.append(s)

    def settled(self) -> bool:
        """True once no copy queued by the transfer can touch the buffers: every mark is
        reached, or the context was rebuilt (its queued work is gone)."""
        if self.device.state.generation != self.generation:
            return True
        try:
            return all(m.query() for m in self.marks)
        except Exception:  # noqa: BLE001 - a failed or closed stream proves nothing: keep holding
            return False

    def hand_back(self) -> None:
        marks = [m for m in self.marks if not isinstance(m, Stream)]
        _hand_back(self.bufs, self.events + marks, self.helpers, raise_first=False)


_held: list[_Held] = []
_held_lock = threading.Lock()


def _hold(ring: _Ring, why: BaseException) -> None:
    entry = _Held(ring)
    ring.bufs, ring.events, ring.streams[1:] = [], [], []
    with _held_lock:
        _held.append(entry)
    warnings.warn(f"ignis.io: the copy streams of a failed transfer could not be drained ({why}); its "
                  f"{len(entry.bufs)} pinned ring buffers ({entry.nbytes} bytes) are held out of the "
                  "staging pool until those streams are idle or the context is rebuilt, since a queued "
                  "copy may still read or write them", RuntimeWarning, stacklevel=4)


def held_bytes() -> int:
    """Pinned bytes held back from failed transfers (see ``_Ring.close``)."""
    with _held_lock:
        return sum(h.nbytes for h in _held)


def reclaim_held() -> int:
    """Hand back the held rings whose streams are now idle (never waits). Returns the
    bytes handed back. Each new transfer calls it first."""
    with _held_lock:
        done = [h for h in _held if h.settled()]
        for h in done:
            _held.remove(h)
    for h in done:
        h.hand_back()
    return sum(h.nbytes for h in done)


# -- load -----------------------------------------------------------------------
def _read_into(fd: int, view: memoryview, offset: int, wait: Any) -> None:
    if wait is not None:
        wait.synchronize()  # the copy that last read this slot has finished
    got, n = 0, len(view)
    while got < n:
        k = os.preadv(fd, [view[got:]], offset + got)
        if k <= 0:
            raise EOFError(f"the file ended at byte {offset + got}, before the {n}-byte range at {offset} "
                           "was read (it shrank while it was read)")
        got += k


def _copy_from(fd: int, mapping: "_Mapping", offset: int, dst: int, n: int, path: str, wait: Any) -> None:
    if wait is not None:
        wait.synchronize()
    _check_size(fd, offset + n)  # a page past the end of the file is a SIGBUS: look first
    _populate(mapping.addr + offset, n, path, write=False)
    ctypes.memmove(dst, mapping.addr + offset, n)


def _check_size(fd: int, need: int) -> None:
    size = os.fstat(fd).st_size
    if size < need:
        raise EOFError(f"the file is {size} bytes, shorter than the {need} bytes its header promised (it "
                       "shrank after its header was read)")


def load(fd: int, chunks: Sequence[Chunk], stream: Stream, opts: PipelineOptions,
         progress: Progress | None = None, path: str = "") -> None:
    """Read ``chunks`` of the file ``fd`` to their device addresses, ordered on ``stream``;
    return once the bytes are on the device. ``progress(done, total)`` is called on this
    thread as chunks are queued. Raises what a read or a copy raised (``EOFError`` for
    a file that shrank)."""
    total = sum(k for c in chunks for _, _, k in c[2])
    if progress is not None:
        progress(0, total)
    if not chunks:
        return
    mapping = None
    if opts.reader == "mmap":
        need = max(off + length for off, length, _ in chunks)
        _check_size(fd, need)
        mapping = _Mapping(fd, need, write=False)  # only the bytes the header promised: never beyond them
    ring = None
    ok = False
    try:
        ring = _Ring(stream, chunks, opts)
        backend = stream.device.backend
        k, n, streams = ring.k, len(chunks), ring.streams
        futures, events, bufs = ring.futures, ring.events, ring.bufs
        views = [memoryview(a) for a in ring.arrays]

        def submit(i: int) -> None:
            slot = i % k
            off, length, _ = chunks[i]
            wait = events[slot] if i >= k else None
            if mapping is not None:
                futures[i] = ring.executor.submit(_copy_from, fd, mapping, off, bufs[slot].ptr, length, path,
                                                  wait)
            else:
                futures[i] = ring.executor.submit(_read_into, fd, views[slot][:length], off, wait)

        for i in range(k):
            submit(i)
        done = 0
        for i in range(n):
            futures.pop(i).result()
            slot = i % k
            s = streams[i % len(streams)]
            h = s.live_handle()
            base = bufs[slot].ptr
            for boff, dptr, nb in chunks[i][2]:
                backend.memcpy_htod_async(dptr, base + boff, nb, h)
                done += nb
            events[slot].record(s)
            if i + k < n:
                submit(i + k)
            if progress is not None:
                progress(done, total)
        ring.join()
        stream.synchronize()
        ok = True
    finally:
        if ring is not None:
            ring.close(ok)  # workers stopped before the mapping goes away
        if mapping is not None:
            mapping.close(background=ok and sum(c[1] for c in chunks) >= MAP_MIN_BYTES)


# -- save -----------------------------------------------------------------------
def fs_type(path: str) -> str | None:
    """The file system type ("tmpfs", "ext4", ...) holding ``path``, from /proc/self/mountinfo."""
    try:
        real = os.path.realpath(path)
        best, kind = "", None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mnt = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, right.split()[0]
        return kind
    except OSError:
        return None


def _writer(opts: PipelineOptions, path: str, nbytes: int) -> str:
    if opts.writer != "auto":
        return opts.writer
    if nbytes < MAP_MIN_BYTES or not _populate_ok[0] or fs_type(os.path.dirname(path) or ".") != "tmpfs":
        return "pwrite"
    # A write fault on a full tmpfs is SIGBUS, not an error: map only with room to spare.
    st = os.statvfs(os.path.dirname(path) or ".")
    return "mmap" if st.f_bavail * st.f_frsize > nbytes + (256 << 20) else "pwrite"


_MADV_POPULATE_READ = 22   # Linux 5.14+: fault pages in, with an error (not SIGBUS) when that fails
_MADV_POPULATE_WRITE = 23
_libc: Any = None
_populate_ok = [True]


def _c() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _libc = lib
    return _libc


def _populate(addr: int, length: int, path: str, write: bool) -> None:
    """Fault in the pages of ``[addr, addr + length)`` of a shared file mapping ahead of a
    copy, so that a full file system (or a file cut short) is an ``OSError`` here rather
    than a SIGBUS in the copy. Runs without the GIL (ctypes); skipped on kernels without
    MADV_POPULATE_*."""
    if not _populate_ok[0] or length <= 0:
        return
    start = addr - addr % mmap.PAGESIZE
    if _c().madvise(start, addr + length - start, _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ) != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:
            _populate_ok[0] = False
            return
        if err == errno.EFAULT and write:  # the file system could not back the pages: it is full
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (no pages for the mapping)", path)
        if err == errno.EFAULT:
            raise EOFError("the file ended inside a range the header promised (it shrank while it was read)")
        raise OSError(err, os.strerror(err), path)


class _Mapping:
    """A shared mapping of a whole file; ``close()`` unmaps it (in the background if asked:
    tearing down the page tables of a big mapping takes a while and nothing waits for it)."""

    def __init__(self, fd: int, size: int, write: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        view = np.frombuffer(self.mm, np.uint8)
        self.addr = view.ctypes.data
        del view

    def close(self, background: bool = False) -> None:
        mm, self.mm = self.mm, None
        if mm is None:
            return
        if background:
            threading.Thread(target=mm.close, name="ignis-io-unmap", daemon=True).start()
        else:
            mm.close()


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` to ``fd`` at file offset ``offset`` (``os.pwrite`` until done).

    Args:
        fd: an open file descriptor.
        view: the bytes to write.
        offset: the file offset of the first byte.

    Raises:
        OSError: a write failed.
    """
    done, n = 0, len(view)
    while done < n:
        done += os.pwrite(fd, view[done:], offset + done)


def save(fd: int, path: str, chunks: Sequence[Chunk], stream: Stream, opts: PipelineOptions,
         file_size: int, progress: Progress | None = None) -> None:
    """Write the device bytes of ``chunks`` (file offsets are absolute) to ``fd`` (open
    read-write, already ``file_size`` bytes long), reading the device in order on
    ``stream``. ``progress(done, total)`` runs on this thread as chunks reach the file."""
    total = sum(c[1] for c in chunks)
    if progress is not None:
        progress(0, total)
    if not chunks:
        return
    mode = _writer(opts, path, total)
    mapping = None
    ring = None
    ok = False
    try:
        if mode == "mmap":
            mapping = _Mapping(fd, file_size, write=True)
        ring = _Ring(stream, chunks, opts)
        backend = stream.device.backend
        k, n, streams = ring.k, len(chunks), ring.streams
        futures, events, bufs = ring.futures, ring.events, ring.bufs
        views = [memoryview(a) for a in ring.arrays]

        def write(slot: int, off: int, length: int) -> int:
            events[slot].synchronize()  # the device-to-host copies of this chunk have landed
            if mapping is not None:
                _populate(mapping.addr + off, length, path, write=True)
                ctypes.memmove(mapping.addr + off, bufs[slot].ptr, length)
            else:
                pwrite_all(fd, views[slot][:length], off)
            return length

        done = 0
        for i in range(n):
            slot = i % k
            if i >= k:
                done += futures.pop(i - k).result()
                if progress is not None:
                    progress(done, total)
            s = streams[i % len(streams)]
            h = s.live_handle()
            base = bufs[slot].ptr
            off, length, pieces = chunks[i]
            for boff, sptr, nb in pieces:
                backend.memcpy_dtoh_async(base + boff, sptr, nb, h)
            events[slot].record(s)
            futures[i] = ring.executor.submit(write, slot, off, length)
        for i in sorted(futures):
            done += futures.pop(i).result()
            if progress is not None:
                progress(done, total)
        ring.join()
        ok = True
    finally:
        if ring is not None:
            ring.close(ok)  # workers stopped before the mapping goes away
        if mapping is not None:
            mapping.close()
