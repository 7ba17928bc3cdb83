"""Host <-> device copies through pinned memory.

Rules:
- Small host->device copies go through one pooled pinned buffer: the host
  bytes are copied into it, the DMA is queued, and the buffer goes back to the
  pool behind an event, so nothing waits on the host.
- Large host->device copies from pageable memory are cut into chunks; worker
  threads copy chunks into pinned buffers (NumPy releases the GIL) while the
  earlier chunks' DMAs run.
- Device->host copies land in a pinned buffer that becomes the result's own
  memory (returned to the pool when the NumPy array dies), so the transfer is
  one DMA at the pinned rate.
- A host buffer that a queued copy writes into is never released or reused
  before that copy completes: when the wait for it is interrupted (an
  exception, KeyboardInterrupt) the buffer is handed to the stream itself
  (``keep_until_done``) and let go only when the stream gets there; if its
  stream failed for good, never.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..backends import get_backend
from ..memory import PinnedBuffer, PinnedHostResource

if TYPE_CHECKING:
    from ..runtime import Stream

__all__ = ["pinned_pool", "htod", "dtoh_pinned", "keep_until_done", "PINNED_RESULT_MIN"]

SMALL = 1 << 20          # one staging buffer up to this size
CHUNK = 4 << 20          # chunk of a large staged copy
MAX_WORKERS = 8          # staging threads (measured on an H200 host: 8 threads with 4 MiB chunks did best
                         # while the DMA also reads host memory; see benchmarks/RESULTS.md)
PINNED_RESULT_MIN = 1 << 20  # device->host results at least this big land in pinned memory

_pools: dict[int, PinnedHostResource] = {}
_pool_lock = threading.Lock()
_workers: ThreadPoolExecutor | None = None
_stranded: list = []  # host buffers behind copies whose stream failed: never released or reused


def keep_until_done(stream: "Stream", hold: object, release: "Callable[[], None] | None" = None) -> None:
    """Keep ``hold`` (a host buffer that work queued on ``stream`` may still write or read)
    until the stream has done that work, then call ``release`` (if any) and let it go;
    ``release`` must not call the backend. When nothing more can be queued on the stream
    (it failed), the buffer is kept for the life of the process instead: its copy may or
    may not still run, so no one else may have that memory."""
    def done(hold: object = hold) -> None:
        if release is not None:
            release()

    try:
        stream.device.backend.launch_host_func(stream.handle, done)
    except BaseException:
        _stranded.append(hold)


def pinned_pool() -> PinnedHostResource:
    """The process's pinned staging pool (one per backend)."""
    backend = get_backend()
    pool = _pools.get(id(backend))
    if pool is None:
        with _pool_lock:
            pool = _pools.get(id(backend))
            if pool is None:
                pool = _pools[id(backend)] = PinnedHostResource(backend)
    return pool


def _worker_count() -> int:
    return max(2, min(MAX_WORKERS, (os.cpu_count() or 2)))


def _pool_workers() -> ThreadPoolExecutor:
    global _workers
    if _workers is None:
        with _pool_lock:
            if _workers is None:
                _workers = ThreadPoolExecutor(max_workers=_worker_count(), thread_name_prefix="ignis-staging")
    return _workers


def _fill(buf: PinnedBuffer, src: np.ndarray) -> PinnedBuffer:
    np.copyto(buf.array, src)
    return buf


def htod(src: np.ndarray, dst: int, stream: "Stream") -> None:
    """Queue a copy of the contiguous uint8 array ``src`` to device address ``dst``."""
    n = src.nbytes
    if n == 0:
        return
    backend = stream.device.backend
    pool = pinned_pool()
    h = stream.handle
    if n <= SMALL:
        buf = pool.allocate(n)
        try:
            np.copyto(buf.array, src)
            backend.memcpy_htod_async(dst, buf.ptr, n, h)
        except BaseException:
            buf.release()  # nothing was queued from it
            raise
        buf.release(stream)
        return
    workers = _pool_workers()
    offsets = list(range(0, n, CHUNK))
    futures = []
    nxt = 0

    def submit() -> None:
        nonlocal nxt
        off = offsets[nxt]
        piece = src[off:off + CHUNK]
        futures.append((off, workers.submit(_fill, pool.allocate(piece.nbytes), piece)))
        nxt += 1

    window = 2 * _worker_count()  # chunks in flight: each worker has its next one queued
    while nxt < len(offsets) and len(futures) < window:
        submit()
    done = 0
    try:
        while done < len(futures):
            off, fut = futures[done]
            buf = fut.result()
            backend.memcpy_htod_async(dst + off, buf.ptr, buf.nbytes, h)
            buf.release(stream)
            done += 1
            if nxt < len(offsets):
                submit()
    finally:
        for _, fut in futures[done:]:  # an error part-way: return the staging buffers
            try:
                fut.result().release()
            except Exception:
                pass


class _PinnedHolder:
    """Owns a pinned buffer for the lifetime of the NumPy array built on it."""

    __slots__ = ("buf", "__array_interface__")

    def __init__(self, buf: PinnedBuffer, shape: tuple, typestr: str, descr: list) -> None:
        self.buf = buf
        self.__array_interface__ = {"data": (buf.ptr, False), "shape": shape, "typestr": typestr,
                                    "descr": descr, "version": 3}

    def __del__(self) -> None:
        try:
            self.buf.release()
        except Exception:
            pass


def dtoh_pinned(src: int, nbytes: int, np_dtype: np.dtype, shape: tuple, stream: "Stream") -> np.ndarray:
    """Copy device memory into a new pinned-backed NumPy array and wait for it."""
    buf = pinned_pool().allocate(nbytes)
    try:
        stream.device.backend.memcpy_dtoh_async(buf.ptr, src, nbytes, stream.handle)
    except BaseException:
        buf.release()  # nothing was queued into it
        raise
    try:
        stream.synchronize()
    except BaseException:
        keep_until_done(stream, buf, buf.release)  # the copy may still be writing into it
        raise
    holder = _PinnedHolder(buf, shape, np_dtype.str, np_dtype.descr)
    return np.asarray(holder).view(np_dtype)
