"""The guard's hot path, compiled: PyTorch's allocator entry points, the front end's
allocate and free, the deferred guard's allocate and free and its check batches.

What is here (``ignis.torch._guard`` has the rest and the design):
- ``ignis_torch_alloc`` / ``ignis_torch_free``: the C functions that
  ``torch.cuda.memory.CUDAPluggableAllocator`` loads from this extension by name
  (``void *alloc(ssize_t size, int device, cudaStream_t stream)`` and
  ``void free(void *ptr, ssize_t size, int device, cudaStream_t stream)``). PyTorch
  calls them from any thread, holding the GIL or not: each takes the GIL
  (``PyGILState_Ensure``) and runs the allocate / free bound by
  ``torch_guard_bind`` (``_alloc`` / ``_free`` here are called directly, without a
  Python call; any other callable is called with plain ints). An exception pending
  in the caller's thread is kept aside and restored. A failed allocation returns
  NULL with its exception left pending, so the PyTorch call that asked for the
  memory raises it (as SystemError, with the cause chained); an exception in a
  free is printed (``PyErr_WriteUnraisable``): a free has nobody to raise to.
  Unbound, and while the interpreter finalizes, allocations fail and frees are
  dropped (the process is ending; the driver reclaims the memory). A free may
  first queue the block's poison itself (``torch_guard_poison``: the driver's
  ``cuMemsetD32Async`` over the aligned words, ``cuMemsetD8Async`` for an unaligned
  head or tail, through the C entry points of ``ignis.backends._cudriver``, which
  call the driver's functions; no Python call), for a block the guard handed out with
  no ``record_stream`` streams to wait for, on the device of the thread's
  current context; the free is told whether it did.
- ``_alloc`` / ``_free`` (also CuPy's allocator's): the front end's state
  (``_State``: guards, adopted streams, pointer -> block), the allocation site,
  the sanitizer's ``extent_allocated`` / ``extent_freed``, and the deferral of a
  free that arrives while this thread is inside the allocator (the garbage
  collector running a tensor's free there): ``_s.tls.busy``, a C thread-local
  flag, and ``_s.deferred``, drained when the outer call ends.
- ``GuardCore``: the typed state of ``DeferredGuardResource`` and its ``allocate``
  / ``free_fast`` / ``_release_exits``; every other method of the guard (its
  slow paths, checks and reports) is Python, in ``_guard.py``, and the compiled
  path calls back into them where a case is rare (a free that is not the
  common case is ``deallocate``).
- ``_Checker``: the batches of guard checks (pending jobs per stream, batches in
  flight, their buffers, the kernel), and ``_host_check``, the kernel's two
  phases on a backend without compiled kernels.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections import deque

import numpy as np

from cpython.ref cimport PyObject, Py_XDECREF
from libc.stdint cimport uintptr_t

from .._cpython cimport ignis_finalizing

from ..memory.guard import _uniform
from ..memory.block cimport (DeviceBlock, block_clean_on, block_lend_record, block_move, fresh_generation,
                             new_block)
from ..memory.hooks cimport Hooks
from ..memory.hooks import HOOKS as _HOOKS
from ..memory.guard_base cimport GuardBase, _Guarded, as_bound, fill_bytes_c, fill_plan
from ..memory.pool cimport PoolResource, pool_deallocate, pool_direct
from ..memory.resource cimport ReentrantLock, ResourceLock, lock_take, lock_give
from ..memory.resource import check_request
from ..memory.types import UNTAGGED, BlockState
from ..runtime.stream cimport Stream
from ..safety.frames import format_frames
from ..safety.frames cimport capture_c

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    void PyErr_Fetch(PyObject **, PyObject **, PyObject **)
    void PyErr_Restore(PyObject *, PyObject *, PyObject *)
    void PyErr_SetObject(object, object)
    void PyErr_WriteUnraisable(object)

cdef extern from *:
    """
    /* Set while this thread runs the guard's allocate or free (_s.tls.busy). */
    static __thread int ignis_guard_busy = 0;
    /* PyTorch's pluggable allocator finds these by name in this library: exported
       whatever the build's default visibility. */
    __attribute__((visibility("default"))) void *ignis_torch_alloc(Py_ssize_t, int, void *);
    __attribute__((visibility("default"))) void ignis_torch_free(void *, Py_ssize_t, int, void *);
    """
    int ignis_guard_busy

__all__ = ["GuardCore", "torch_guard_bind", "torch_guard_poison"]

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields
cdef object _LIVE_STATE = BlockState.LIVE
cdef object _QUARANTINED = BlockState.QUARANTINED
cdef object _FREED = BlockState.FREED

cdef enum:
    C_RES_WORDS = 16      # per job: first[3], ~last[3], -count[3], samples 2 x 3, spare
    C_JOB_WORDS = 3       # per job: upstream ptr, user bytes, flags
    C_CHECK_USER = 1
    C_REPAIR = 2
    C_CAP = 1024          # jobs per batch slot
    C_THREADS = 256

cdef unsigned long long C_NONE = 0xFFFFFFFFFFFFFFFFULL

_NONE = 0xFFFFFFFFFFFFFFFF
_RES_WORDS = C_RES_WORDS
_JOB_WORDS = C_JOB_WORDS
_CHECK_USER, _REPAIR = C_CHECK_USER, C_REPAIR
_CAP = C_CAP
_MAX_SLOTS = 8
_THREADS = C_THREADS

# Job kinds: (flags, what the report says)
FREE, EXIT, LIVE, HELD = "free", "exit", "live", "held"
_FLAGS = {FREE: _REPAIR, EXIT: _CHECK_USER | _REPAIR, LIVE: 0, HELD: _CHECK_USER}
_LEFT = "when its memory left the quarantine"
cdef object _ON_FREE = "on free"


_KERNEL = r"""
typedef unsigned long long u64;
#define NONE 0xFFFFFFFFFFFFFFFFull
// One launch per phase over a batch of jobs (blockIdx.y = job). A job is a guarded
// region at `base`: [canary G | user n | canary G]. Phase 0 compares every byte
// (16 at a time: one 16-byte load where 16-byte aligned, four 4-byte loads where
// 4-byte aligned, bytes only in a chunk that holds damage or is unaligned) and folds
// the first / last damaged offset and the count of damaged bytes of each zone into
// res (atomics; res starts all ones). Phase 1 (one block per job) copies the first
// damaged bytes of each zone into res and, for jobs that ask, rewrites the damaged
// zones (canary / poison; words where aligned).
extern "C" __global__ void ignis_guard_check(const u64* __restrict__ jobs, u64* __restrict__ res, u64 G,
                                             unsigned int canary, unsigned int poison, int phase) {
    const u64 base = jobs[3 * blockIdx.y], n = jobs[3 * blockIdx.y + 1], flags = jobs[3 * blockIdx.y + 2];
    u64* r = res + 16 * (u64)blockIdx.y;
    unsigned char* p = (unsigned char*)base;
    const u64 c0 = G / 16, c1 = (flags & 1) ? (n + 15) / 16 : 0, c2 = (G + 15) / 16;
    if (phase == 0) {
        const u64 total = c0 + c1 + c2, stride = (u64)gridDim.x * blockDim.x;
        for (u64 k = (u64)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
            int zone; u64 zstart, zlen, ck; unsigned int want;
            if (k < c0) { zone = 0; zstart = 0; zlen = G; ck = k; want = canary; }
            else if (k < c0 + c1) { zone = 1; zstart = G; zlen = n; ck = k - c0; want = poison; }
            else { zone = 2; zstart = G + n; zlen = G; ck = k - c0 - c1; want = canary; }
            const u64 off = ck * 16;
            const int len = (int)(zlen - off < 16 ? zlen - off : 16);
            const unsigned char* q = p + zstart + off;
            if (len == 16) {
                const unsigned int w = want * 0x01010101u;
                if ((((u64)q) & 15) == 0) {
                    const uint4 v = *(const uint4*)q;
                    if (v.x == w && v.y == w && v.z == w && v.w == w) continue;
                } else if ((((u64)q) & 3) == 0) {
                    const unsigned int* u = (const unsigned int*)q;
                    if (u[0] == w && u[1] == w && u[2] == w && u[3] == w) continue;
                }
            }
            int first = -1, last = -1, cnt = 0;
            for (int i = 0; i < len; i++)
                if (q[i] != (unsigned char)want) { if (first < 0) first = i; last = i; cnt++; }
            if (cnt) {
                atomicMin(&r[zone], off + (u64)first);
                atomicMin(&r[3 + zone], ~(off + (u64)last));
                atomicAdd(&r[6 + zone], (u64)(-(long long)cnt));
            }
        }
        return;
    }
    __shared__ int damaged;
    if (threadIdx.x == 0) damaged = (r[0] != NONE) || (r[1] != NONE) || (r[2] != NONE);
    __syncthreads();
    if (!damaged) return;
    if (threadIdx.x < 3) {
        const int zone = threadIdx.x;
        const u64 first = r[zone];
        if (first != NONE) {
            const u64 zstart = zone == 0 ? 0 : (zone == 1 ? G : G + n), zlen = zone == 1 ? n : G;
            const u64 m = zlen - first < 16 ? zlen - first : 16;
            u64 lo = 0, hi = 0;
            for (u64 i = 0; i < m; i++) {
                const u64 b = p[zstart + first + i];
                if (i < 8) lo |= b << (8 * i); else hi |= b << (8 * (i - 8));
            }
            r[9 + 2 * zone] = lo;
            r[10 + 2 * zone] = hi;
        }
    }
    __syncthreads();
    if (!(flags & 2)) return;
    for (int zone = 0; zone < 3; zone++) {
        if (r[zone] == NONE) continue;
        const u64 zstart = zone == 0 ? 0 : (zone == 1 ? G : G + n), zlen = zone == 1 ? n : G;
        const unsigned char want = (unsigned char)(zone == 1 ? poison : canary);
        unsigned char* z = p + zstart;
        const u64 lead = (4 - (((u64)z) & 3)) & 3, head = lead < zlen ? lead : zlen;
        const u64 words = (zlen - head) / 4;
        unsigned int* zw = (unsigned int*)(z + head);
        const unsigned int w = want * 0x01010101u;
        for (u64 i = threadIdx.x; i < head; i += blockDim.x) z[i] = want;
        for (u64 i = threadIdx.x; i < words; i += blockDim.x) zw[i] = w;
        for (u64 i = head + 4 * words + threadIdx.x; i < zlen; i += blockDim.x) z[i] = want;
    }
}
"""

cdef inline bint _untracked_on(DeviceBlock up, object st) noexcept:
    """``up`` carries no hazard record of a tracked use: it is clean on its own stream ``st``
    (every framework tensor: the framework orders its own work). Such a block needs no wait
    before its poison, nor before a reuse on ``st``."""
    return block_clean_on(up, st)


# -- the record of one allocation ---------------------------------------------------------------------
cdef class _Entry(_Guarded):
    """The guard's record of one allocation, plus the streams ``record_stream`` named
    and the sides already reported (a damaged guard is reported once).

    Args:
        block: the user's ``DeviceBlock``.
        up: the pool block holding the guards and the user bytes.
        frames: the allocation site as ``safety.frames`` captures it, or None.
    """

    # Fields: see _guard_fast.pxd.

    def __init__(self, block: DeviceBlock, up: DeviceBlock, frames: tuple | None) -> None:
        self.block = block
        self.up = up
        self.stack = frames
        self.rs = None
        self.reported = None

    def stack_text(self) -> str | None:
        """The allocation site as traceback text, or None when none was captured."""
        if not self.stack:
            return None
        return format_frames(self.stack).rstrip()


# -- check batches ------------------------------------------------------------------------------------
cdef class _Slot:
    """Buffers for one batch in flight: jobs and results, on the host and the device, and its event."""

    # Fields: see _guard_fast.pxd.


cdef class _Batch:
    """A batch in flight: its slot, its jobs ((entry, kind, when) each) and its stream."""

    # Fields: see _guard_fast.pxd.

    def __init__(self, slot: _Slot, items: list, stream: Stream) -> None:
        self.slot = slot
        self.items = items
        self.stream = stream


cdef class _Checker:
    """Batches of guard checks for one guard: pending jobs per stream, batches in flight.

    Lock order: this checker's lock (reentrant), then the guard's.

    Args:
        guard: the ``DeferredGuardResource`` whose blocks it checks.
    """

    # Fields: see _guard_fast.pxd.

    def __init__(self, guard: GuardCore) -> None:
        self.g = guard
        self.backend = guard._backend
        self.device = guard.device
        self.cuda = not self.backend.host_kernels  # compiled check kernels (else a host function over host views)
        self.lock = ReentrantLock()  # (take / give are C calls on the free's path; ``with`` elsewhere)
        self.pending = {}
        self.inflight = deque()
        self.free_slots = []
        self.all_slots = []
        self.fn = None
        self.frees = 0
        self.batches = 0
        self.jobs = 0

    # -- buffers -----------------------------------------------------------------
    def _new_slot(self) -> _Slot:
        cdef _Slot s = _Slot()
        b, dev = self.backend, self.device.ordinal
        if self.cuda:
            s.jobs_ptr = b.host_alloc(C_CAP * C_JOB_WORDS * 8)
            s.res_ptr = b.host_alloc(C_CAP * C_RES_WORDS * 8)
            s.jobs = np.ctypeslib.as_array((ctypes.c_uint64 * (C_CAP * C_JOB_WORDS)).from_address(s.jobs_ptr))
            s.res = np.ctypeslib.as_array((ctypes.c_uint64 * (C_CAP * C_RES_WORDS)).from_address(s.res_ptr))
            s.jobs_dev = b.mem_alloc(dev, C_CAP * C_JOB_WORDS * 8)
            s.res_dev = b.mem_alloc(dev, C_CAP * C_RES_WORDS * 8)
        else:
            s.jobs = np.zeros(C_CAP * C_JOB_WORDS, np.uint64)
            s.res = np.full(C_CAP * C_RES_WORDS, _NONE, np.uint64)
            s.jobs_ptr = s.res_ptr = s.jobs_dev = s.res_dev = 0
        # The arrays (kept by the slot) over those buffers: written and read in place.
        s.jobs_host = <unsigned long long *><uintptr_t>s.jobs.ctypes.data
        s.res_host = <unsigned long long *><uintptr_t>s.res.ctypes.data
        s.event = b.event_create(dev)
        self.all_slots.append(s)
        return s

    cdef _Slot _take_slot(self):
        """A free slot: an unused one, a finished batch's, a new one, or the oldest batch's once it finished."""
        cdef _Batch b
        if self.free_slots:
            return self.free_slots.pop()
        if self.inflight and self.backend.event_query((<_Batch>self.inflight[0]).slot.event):
            self._harvest(self.inflight.popleft())
            return self.free_slots.pop()
        if len(self.all_slots) < _MAX_SLOTS:
            return self._new_slot()
        b = self.inflight.popleft()
        self.backend.event_synchronize(b.slot.event)
        self._harvest(b)
        return self.free_slots.pop()

    def close(self) -> None:
        """Give the buffers back (after the batches in flight finished)."""
        cdef _Slot s
        with self.lock:
            self.wait()
            b, dev = self.backend, self.device.ordinal
            for s in self.all_slots:
                try:
                    b.event_destroy(s.event)
                    if self.cuda:
                        b.mem_free(dev, s.jobs_dev)
                        b.mem_free(dev, s.res_dev)
                        b.host_free(s.jobs_ptr)
                        b.host_free(s.res_ptr)
                except Exception:
                    pass
            self.all_slots.clear()
            self.free_slots.clear()

    # -- jobs ----------------------------------------------------------------------
    def add(self, stream: Stream, entry: _Entry, kind: str, when: str) -> None:
        """Queue a job (``kind``: FREE, EXIT, LIVE or HELD) for ``entry`` on ``stream``; a full batch is launched."""
        with self.lock:
            lst = self.pending.get(stream)
            if lst is None:
                lst = self.pending[stream] = []
            lst.append((entry, kind, when))
            if len(lst) >= self.g.batch:
                self.launch(stream)

    def after_free(self) -> None:
        """Count a free; every 16th reads the batches that finished."""
        self.frees += 1
        if not self.frees & 15 and self.inflight:
            self.poll()

    cdef int _queue_free(self, Stream s, _Entry e, list evicted) except -1:
        """``free_fast``'s jobs: check ``e`` (freed on ``s``) and the blocks it pushed out of
        the quarantine; launch what fills a batch; every 16th free, read finished batches."""
        cdef Py_ssize_t batch = self.g.batch
        cdef list lst, l2
        cdef _Guarded x
        cdef ReentrantLock lk = self.lock
        lk.take()
        try:
            pend = self.pending
            lst = pend.get(s)
            if lst is None:
                lst = pend[s] = []
            lst.append((e, FREE, _ON_FREE))
            if evicted:
                for x in evicted:
                    xs = x.up.alloc_stream
                    if xs._closed:
                        xs = self.g._stream_of(x)
                    l2 = pend.get(xs)
                    if l2 is None:
                        l2 = pend[xs] = []
                    l2.append((x, EXIT, _LEFT))
                    if xs is not s and len(l2) >= batch:
                        self.launch(xs)
            if len(lst) >= batch:
                self.launch(s)
            self.frees += 1
            if not self.frees & 15 and self.inflight:
                self.poll()
        finally:
            lk.give()
        return 0

    def launch_all(self) -> None:
        """Queue every stream's pending jobs."""
        with self.lock:
            for s in [s for s, lst in self.pending.items() if lst]:
                self.launch(s)

    def launch(self, stream: Stream) -> None:
        """Queue the pending jobs of ``stream`` as one or more batches on it, after the poison
        still due there (the checks read it); where it was closed since they were queued, on
        the device's default stream after a device synchronization (its work is done, and the
        jobs must still run: they are checks)."""
        cdef list items
        cdef GuardCore g = self.g
        with self.lock:
            items = self.pending.pop(stream, None)
            target = stream
            if (<Stream>stream)._closed and (items or (g._unpoisoned_n and stream in g._unpoisoned)):
                self.backend.device_synchronize(self.device.ordinal)
                target = self.device.default_stream
            if g._unpoisoned_n:
                g._poison_due(stream, target)
            while items:
                part, items = items[:C_CAP], items[C_CAP:]
                self._launch(target, part)

    cdef int _launch(self, object stream, list items) except -1:
        cdef GuardCore g = self.g
        cdef _Slot slot = self._take_slot()
        cdef Py_ssize_t k = len(items), i, G = g.canary_bytes
        cdef unsigned long long *jobs = slot.jobs_host
        cdef unsigned long long n, f, maxn = 0
        cdef _Guarded e
        cdef tuple it
        for i in range(k):
            it = <tuple>items[i]
            e = <_Guarded?>it[0]
            n = e.block.requested
            f = _FLAGS[it[1]]
            jobs[C_JOB_WORDS * i] = e.up.ptr
            jobs[C_JOB_WORDS * i + 1] = n
            jobs[C_JOB_WORDS * i + 2] = f
            if f & C_CHECK_USER and n > maxn:
                maxn = n
        maxchunks = (maxn + 15) // 16
        b = self.backend
        try:
            h = stream._check()
            if self.cuda:
                if self.fn is None:
                    self.fn = b.kernel_compile(self.device.ordinal, _KERNEL, "ignis_guard_check")
                b.memcpy_htod_async(slot.jobs_dev, slot.jobs_ptr, k * C_JOB_WORDS * 8, h)
                fill_bytes_c(b, slot.res_dev, 0xFF, k * C_RES_WORDS * 8, h)
                gx = max(1, min(1024, (maxchunks + 2 * G // 16 + C_THREADS - 1) // C_THREADS))
                args = (ctypes.c_uint64(slot.jobs_dev), ctypes.c_uint64(slot.res_dev), ctypes.c_uint64(G),
                        ctypes.c_uint32(g.canary), ctypes.c_uint32(g.poison))
                b.kernel_launch(self.fn, (gx, k, 1), (C_THREADS, 1, 1), 0, h, (*args, ctypes.c_int32(0)))
                b.kernel_launch(self.fn, (1, k, 1), (C_THREADS, 1, 1), 0, h, (*args, ctypes.c_int32(1)))
                b.memcpy_dtoh_async(slot.res_ptr, slot.res_dev, k * C_RES_WORDS * 8, h)
            else:
                views = [(b.host_view(x.up.ptr, 2 * G + x.block.requested), x.block.requested, _FLAGS[kind])
                         for x, kind, _ in items]
                b.kernel_launch(functools.partial(_host_check, views, slot.res, G, g.canary, g.poison),
                                (1, 1, 1), (1, 1, 1), 0, h, ())
            b.event_record(slot.event, h)
        except BaseException:
            self.free_slots.append(slot)
            # Blocks that were leaving the quarantine go back upstream unchecked, never lost.
            for x, kind, _ in items:
                if kind == EXIT:
                    try:
                        g._release_exit(x, formatted=False)
                    except Exception:
                        pass
            raise
        self.batches += 1
        self.jobs += k
        self.inflight.append(_Batch(slot, items, stream))
        # The check is queued before any reuse (stream order; a reuse elsewhere waits on an
        # event recorded after it): blocks leaving the quarantine can go back to the pool now.
        exits = [x for x, kind, _ in items if kind == EXIT]
        if exits:
            g._release_exits(exits)
        return 0

    # -- results -------------------------------------------------------------------
    def poll(self) -> None:
        """Read every finished batch (no waiting)."""
        with self.lock:
            q = self.inflight
            while q and self.backend.event_query((<_Batch>q[0]).slot.event):
                self._harvest(q.popleft())

    def wait(self) -> None:
        """Queue everything pending, wait for every batch and read it."""
        cdef _Batch b
        with self.lock:
            self.launch_all()
            q = self.inflight
            while q:
                b = q[0]
                self.backend.event_synchronize(b.slot.event)  # a failed wait leaves it in flight
                q.popleft()
                self._harvest(b)

    def _harvest(self, _Batch batch) -> None:
        """Report what a finished batch found, and free its slot."""
        cdef _Slot slot = batch.slot
        cdef Py_ssize_t k = len(batch.items), i, j
        cdef unsigned long long *r = slot.res_host
        cdef unsigned long long *row
        try:
            for i in range(k):
                row = r + C_RES_WORDS * i
                if row[0] != C_NONE or row[1] != C_NONE or row[2] != C_NONE:
                    e, kind, when = batch.items[i]
                    self.g._problems_from(e, kind, when, [row[j] for j in range(C_RES_WORDS)])
        finally:
            if not self.cuda:
                for i in range(k * C_RES_WORDS):
                    r[i] = C_NONE
            self.free_slots.append(slot)


def _host_check(views: list, res: np.ndarray, G: int, canary: int, poison: int) -> None:
    """The check kernel's two phases on the emulated backend (runs on the stream's worker)."""
    for i, (v, n, flags) in enumerate(views):
        r = res[i * _RES_WORDS:(i + 1) * _RES_WORDS]
        zones = ((0, G, canary), (G, n, poison) if flags & _CHECK_USER else None, (G + n, G, canary))
        for z, zone in enumerate(zones):
            if zone is None or not zone[1]:
                continue
            start, length, want = zone
            data = v[start:start + length]
            if _uniform(data, want):  # the common case, compared word-wide
                continue
            bad = np.flatnonzero(data != want)
            if not bad.size:
                continue
            first, last = int(bad[0]), int(bad[-1])
            r[z] = first
            r[3 + z] = ~np.uint64(last)
            r[6 + z] = np.uint64(_NONE - int(bad.size))
            sample = bytes(data[first:first + 16]) + bytes(16)
            r[9 + 2 * z] = int.from_bytes(sample[:8], "little")
            r[10 + 2 * z] = int.from_bytes(sample[8:16], "little")
            if flags & _REPAIR:
                data[:] = want


# -- the deferred guard's hot path ------------------------------------------------------------------------
cdef class GuardCore(GuardBase):
    """The compiled part of ``DeferredGuardResource`` (``ignis.torch._guard``): its typed
    state and its ``allocate``, ``free_fast`` and ``_release_exits``. Not a resource on
    its own; the guard's other methods are Python, and these call back into them for
    the rare cases (``_format`` of a fresh block, ``_reformat`` of a checked block of
    another size, ``_after_oom``, ``deallocate`` of a free that is not the common case,
    ``_double``, ``_stream_of``)."""

    # Fields: see _guard_fast.pxd.

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED,
                 frames: tuple | None = None) -> DeviceBlock:
        """A LIVE block of ``nbytes`` poisoned bytes between two canary guards.
        ``frames``: the allocation site, if the caller captured it already."""
        return self._allocate(nbytes, stream, tag, frames)

    cdef DeviceBlock _allocate(self, object nbytes, object stream, object tag, object frames):
        cdef DeviceBlock up, block
        cdef _Entry entry
        cdef Py_ssize_t g = self.canary_bytes, n
        cdef ResourceLock lk
        if stream is None:
            stream = self.device.default_stream
        if type(nbytes) is not int or nbytes <= 0 or type(stream) is not Stream:
            check_request(nbytes, stream)
        if self._closed:
            self._check_alive()
        if frames is None and self.capture_stacks:
            frames = capture_c(1, self.stack_depth)  # frame 1: the caller (this code has no frames)
        if self._unpoisoned_n:
            self._poison_due(stream)
        total = nbytes + 2 * g
        rec = _HK.recorder
        up = None
        if self._ready_bytes:
            if rec is not None:  # recording: every block through the pool, for exact events
                self._release_ready()
            elif self._ready_ok(stream):
                up = self._take_ready(stream, nbytes, tag)
        if up is None:
            mr = self.upstream
            try:
                if pool_direct(mr, "allocate"):
                    up = (<PoolResource>mr)._allocate_c(total, stream, tag)
                else:
                    up = mr.allocate(total, stream, tag)
            except MemoryError:
                up = self._after_oom(total, stream, tag)
            fmt = self._formatted.pop(up.ptr, None) if self._formatted else None
            impl = up._impl
            if fmt is not None and (<tuple>fmt)[0] is impl and (<tuple>fmt)[1] == impl.size:
                if (<tuple>fmt)[2] == nbytes:
                    self.reused += 1
                else:  # a checked block of another size: only the bytes that differ are written
                    self._reformat(up, (<tuple>fmt)[2], nbytes)
                    self.resized += 1
            else:
                self._format(up, nbytes)
                self.formatted_fresh += 1
        n = nbytes
        ptr = up.ptr + g
        block = new_block(ptr, up.alloc_stream, nbytes, nbytes, tag, fresh_generation(), None)
        block_lend_record(block)  # its hazard record is the upstream block's (memory.resource)
        entry = _Entry.__new__(_Entry)
        entry.block = block
        entry.up = up
        entry.stack = frames
        block._impl = entry
        lk = self._lock
        lock_take(lk)
        try:
            self._live[ptr] = entry
            self._live_bytes += n
        finally:
            lock_give(lk)
        if rec is not None:
            rec("alloc", self, ptr, nbytes, block.alloc_stream, block)
        return block

    def _note_stream_close(self, stream: Stream) -> None:
        """A stream is closing (``runtime.stream``'s close hook, maybe from the garbage
        collector, maybe with a lock held): its ready blocks go back to the pool at the next
        release of blocks leaving the quarantine. Only a flag here."""
        if self._ready_bytes:
            self._ready_stale = True

    cdef bint _ready_ok(self, object stream) except -1:
        """``stream`` may take a block from the ready cache: an open stream of this guard's
        context, the context alive (anything else goes to the pool, which raises the right
        error)."""
        cdef Stream s
        if type(stream) is not Stream:
            return False
        s = <Stream>stream
        gen = self._generation
        sg = s._generation
        cg = self._state.generation
        return (not s._closed and not self._closed and (sg is gen or sg == gen) and (cg is gen or cg == gen)
                and s.device is self.device)

    cdef inline Py_ssize_t _held_n(self, object nbytes) except -1:
        """The bytes a block of ``nbytes`` user bytes holds with its guards."""
        return <Py_ssize_t>nbytes + 2 * self.canary_bytes

    cdef DeviceBlock _take_ready(self, object stream, object nbytes, object tag):
        """A pool block of the ready cache for ``nbytes`` user bytes with ``tag`` on
        ``stream`` (it left the quarantine with its check and repair queued on that stream,
        so it holds the guards and poison of that size in stream order), or None."""
        cdef ResourceLock lk = self._lock
        cdef list lst
        cdef DeviceBlock up = None
        key = (stream, nbytes, tag)
        lock_take(lk)
        try:
            lst = self._ready.get(key)
            if lst:
                up = <DeviceBlock>lst.pop()
                self._ready_bytes -= self._held_n(nbytes)
                if not lst:
                    del self._ready[key]
        finally:
            lock_give(lk)
        if up is not None:
            self.reused += 1
        return up

    def _release_ready(self, closed_only: bool = False) -> None:
        """Hand the blocks of the ready cache back to the pool (marked as intact for a reuse
        of the same size): all of them, or (``closed_only``) those of streams closed since.
        A block the pool refuses stays in the cache (over its bound if need be); the first
        such error propagates once the rest went back."""
        cdef ResourceLock lk = self._lock
        cdef DeviceBlock up
        cdef dict ready
        lock_take(lk)
        try:
            if closed_only:
                ready = {k: v for k, v in self._ready.items() if (<Stream>k[0])._closed}
                for k, v in ready.items():
                    del self._ready[k]
                    self._ready_bytes -= len(<list>v) * self._held_n(k[1])
            else:
                ready, self._ready, self._ready_bytes = self._ready, {}, 0
        finally:
            lock_give(lk)
        mr = self.upstream
        fmt = self._formatted
        failure = None
        for key, lst in ready.items():
            nbytes = key[1]
            for up in lst:
                try:
                    if up.state is _LIVE_STATE:
                        pool_deallocate(mr, up)
                except BaseException as exc:
                    self._keep_ready(up, nbytes, key[2], True)
                    if failure is None:
                        failure = exc
                    continue
                impl = up._impl
                if impl is not None:
                    fmt[up.ptr] = (impl, impl.size, nbytes)
        if failure is not None:
            raise failure

    cdef bint _keep_ready(self, DeviceBlock up, object nbytes, object tag, bint force) except -1:
        """Put ``up`` (formatted for ``nbytes`` user bytes with ``tag``, on its stream) into
        the ready cache, if it fits its bound and the guard is open (``force``: whatever the
        bound, for a block the pool refused); False if not (the caller returns it upstream)."""
        cdef ResourceLock lk = self._lock
        cdef Py_ssize_t held = self._held_n(nbytes)
        cdef list lst
        lock_take(lk)
        try:
            if not force and (self._closed or self._ready_bytes + held > self.ready_limit):
                return False
            key = (up.alloc_stream, nbytes, tag)
            lst = self._ready.get(key)
            if lst is None:
                self._ready[key] = [up]
            else:
                lst.append(up)
            self._ready_bytes += held
        finally:
            lock_give(lk)
        return True

    def free_fast(self, block: DeviceBlock, poisoned: bool = False) -> None:
        """``deallocate`` of a framework's tensor, its common case in few steps: no
        record_stream streams, no tracked use, its stream open, the quarantine on
        (anything else is ``deallocate(block, foreign=True)``). ``poisoned``: the
        caller queued the poison already (the C entry point)."""
        if type(block) is not DeviceBlock:
            self.deallocate(block, foreign=True)
            return
        self._free_fast(<DeviceBlock>block, poisoned)

    cdef int _poison_due(self, object stream, object target=None) except -1:
        """Queue the poison of ``stream``'s blocks that were freed from another stream (now: in
        stream order before this stream's new work or the check of their bytes), on ``target``
        (default: ``stream`` itself)."""
        cdef list due = self._unpoisoned.pop(stream, None)
        if due:
            self._unpoisoned_n -= len(due)
            h = (<Stream>(stream if target is None else target)).handle
            for ptr, n in due:
                fill_bytes_c(self._backend, ptr, self.poison, n, h)
        return 0

    cdef int _free_fast(self, DeviceBlock block, bint poisoned, bint later=False) except -1:
        cdef _Entry e
        cdef DeviceBlock up
        cdef Stream s
        cdef Py_ssize_t n, held, max_count, max_bytes
        cdef list evicted = None
        cdef ResourceLock lk
        cdef _Guarded x
        impl = block._impl
        if type(impl) is not _Entry:
            self.deallocate(block, foreign=True)
            return 0
        e = <_Entry>impl
        up = e.up
        st = up.alloc_stream
        n = block.requested
        held = n + 2 * self.canary_bytes
        ptr = block.ptr
        gen = self._state.generation
        max_count = as_bound(self.quarantine_count)
        max_bytes = as_bound(self.quarantine_bytes)
        if (type(st) is not Stream or e.rs is not None or (<Stream>st)._closed or self._closed
                or held > max_bytes or max_count == 0
                or (gen is not self._generation and gen != self._generation)
                or not _untracked_on(up, st) or self._live.get(ptr) is not e):
            self.deallocate(block, foreign=True)
            return 0
        s = <Stream>st
        lk = self._lock
        lock_take(lk)
        try:
            other = self._live.pop(ptr, None)
            if other is not e:  # another thread freed it meanwhile
                if other is not None:
                    self._live[ptr] = other
                raise self._double(block)
            try:
                block_move(block, _QUARANTINED)  # LIVE: it was in the live map
            except BaseException:
                self._live[ptr] = e  # refused: nothing changed
                raise
            self._live_bytes -= n
            q = self._quarantine
            q[ptr] = e
            self._quarantined_bytes += held
            if len(q) > max_count or self._quarantined_bytes > max_bytes:
                evicted = self._take_quarantine_c(self._overflow_c())
                hx = self._held_exit
                for x in evicted:
                    hx[x.block.ptr] = x
        finally:
            lock_give(lk)
        if later:
            # Freed from another stream than its own: work of other streams may still read it
            # (PyTorch hands a freed block only to its own stream's later work, which the
            # program orders after those reads): the poison waits for that point.
            lst = self._unpoisoned.get(s)
            if lst is None:
                self._unpoisoned[s] = [(ptr, n)]
            else:
                lst.append((ptr, n))
            self._unpoisoned_n += 1
        elif not poisoned:
            fill_bytes_c(self._backend, ptr, self.poison, n, s.handle)
        rec = _HK.recorder
        if rec is not None:
            rec("free_requested", self, ptr, block.requested, s, block)
        self._checker._queue_free(s, e, evicted)
        return 0

    def _release_exits(self, entries: list) -> None:
        """Blocks leaving the quarantine whose check (and repair) is queued: back to the
        pool now, each marked as intact for a reuse of the same size."""
        cdef ResourceLock lk = self._lock
        cdef _Guarded e
        cdef DeviceBlock up, b
        cdef dict hx = self._held_exit
        lock_take(lk)
        try:
            for e in entries:
                hx.pop(e.block.ptr, None)
        finally:
            lock_give(lk)
        mr = self.upstream
        fmt = self._formatted if self._reuse else None
        if fmt is not None and len(fmt) > 1 << 16:
            fmt.clear()
        # A block the pool would hand back to the same stream as it is goes to the ready
        # cache instead (a plain pool only: a pool that overrides allocate or deallocate
        # sees every block). Not one with hazard records of a tracked use, nor one whose
        # stream closed.
        rec = _HK.recorder
        ready = (fmt is not None and self.ready_limit > 0 and not self._closed and rec is None
                 and pool_direct(mr, "allocate") and pool_direct(mr, "deallocate"))
        failure = None
        if self._ready_stale:  # a stream closed since: its ready blocks go back to the pool
            self._ready_stale = False
            try:
                self._release_ready(True)
            except BaseException as exc:  # kept in the cache; these entries still go on below
                failure = exc
        for e in entries:
            up = e.up
            b = e.block
            try:
                if up.state is _LIVE_STATE:
                    st = up.alloc_stream
                    if not (ready and type(st) is Stream and not (<Stream>st)._closed and _untracked_on(up, st)
                            and self._keep_ready(up, b.requested, b.tag, False)):
                        pool_deallocate(mr, up)
                        if fmt is not None:
                            impl = up._impl
                            if impl is not None:
                                fmt[up.ptr] = (impl, impl.size, b.requested)
            except BaseException as exc:  # the upstream refused it: keep it (counted) for a later flush
                lock_take(lk)
                try:
                    self._quarantine[b.ptr] = e
                    self._quarantined_bytes += self._held_c(e)
                finally:
                    lock_give(lk)
                if failure is None:
                    failure = exc
                continue
            block_move(b, _FREED)
            b._impl = None  # no block <-> record cycle left for the garbage collector
            if rec is not None:
                rec("free_completed", self, b.ptr, b.requested, b.alloc_stream, b)
        if failure is not None:
            raise failure


# -- the front end ----------------------------------------------------------------------------------------
cdef class _ThreadFlag:
    """``busy``: this thread is inside the guard's allocate or free (a C thread-local flag)."""

    @property
    def busy(self) -> bool:
        return ignis_guard_busy != 0

    @busy.setter
    def busy(self, value: bool) -> None:
        global ignis_guard_busy
        ignis_guard_busy = 1 if value else 0


cdef _ThreadFlag _TLS = _ThreadFlag()


cdef class _State:
    """The front end's state (one per process, ``_s``); ``_reset`` re-initializes it in place.

    ``guards``: device ordinal -> DeferredGuardResource; ``streams``: (device, handle) ->
    adopted Stream; ``blocks``: user pointer -> DeviceBlock of the live guarded blocks;
    ``rs_ptrs``: live blocks that ``record_stream`` named another stream for; ``tls.busy``:
    this thread is inside the allocator; ``deferred``: frees that arrived meanwhile.
    CUDA graphs (``_guard._GraphListener``): ``capturing``: the streams capturing now, with the
    pool each allocates into; ``graph_blocks``: the graphs' memory, unguarded (its bytes are
    written by every replay, so it cannot hold poison or go to the quarantine, and stream
    work queued while capturing would be captured); freed, it stays its pool's
    (``graph_free``) for the pool's later allocations, never handed to anyone else;
    ``after_capture``: frees of guarded blocks of a capturing stream, done when it ends."""

    # Fields: see _guard_fast.pxd.

    def __init__(self) -> None:
        self.opts = None
        self.lock = threading.RLock()
        self.guards = {}
        self.streams = {}
        self.blocks = {}
        self.torch = False
        self.cupy = False
        self.lib = None
        self.problems = []
        self.groups = {}
        self.tls = _TLS
        _TLS.busy = False
        self.deferred = []
        self.last_live = 0.0
        self.atexit = False
        self.hooks = []
        self.saved = {}
        self.rs_ptrs = set()
        self.tag = "torch"
        self.capturing = {}
        self.graph_blocks = {}
        self.graph_free = {}
        self.after_capture = []
        self.graph_alloc = None
        self.current_stream = None


_s = _State()
cdef _State _st = _s

# The front end's slow paths (``_guard.guard_resource`` and ``_guard._stream``), bound by ``_setup``.
cdef object _make_guard = None
cdef object _make_stream = None


def _setup(guard_resource: object, stream: object) -> None:
    """Bind the front end's slow paths: the guard of a device seen for the first time and
    the Ignis stream of a framework's stream handle seen for the first time."""
    global _make_guard, _make_stream
    _make_guard = guard_resource
    _make_stream = stream


def _alloc(size: int, device: int, handle: int, tag: str | None = None, owner: object = None) -> int:
    """Allocate ``size`` guarded bytes on ``device`` for a framework's stream ``handle`` and
    return the user pointer (``owner``: the framework's stream object, kept alive with the
    adopted stream). Called by ``ignis_torch_alloc`` and by CuPy's allocator."""
    return _alloc_c(size, device, handle, tag, owner)


cdef object _alloc_c(object size, object device, object handle, object tag, object owner):
    global ignis_guard_busy
    cdef _State st = _st
    cdef GuardCore g
    cdef DeviceBlock blk
    ignis_guard_busy = 1
    try:
        found = st.guards.get(device)
        if found is None:
            found = _make_guard(device)
        g = <GuardCore?>found
        if st.capturing:
            pool = st.capturing.get((device, handle))
            if pool is not None:  # a CUDA graph's capture: memory of its pool, unguarded
                ptr = _graph_alloc(st, device, pool, size)
                chk = _HK.checker
                if chk is not None and hasattr(chk, "extent_allocated"):
                    chk.extent_allocated(ptr, handle)
                return ptr
        s = st.streams.get((device, handle))
        if s is None:
            s = _make_stream(device, handle, owner)
        blk = g._allocate(size, s, tag or st.tag, capture_c(1, g.stack_depth) if g.capture_stacks else ())
        ptr = blk.ptr
        st.blocks[ptr] = blk
        chk = _HK.checker
        if chk is not None and hasattr(chk, "extent_allocated"):
            chk.extent_allocated(ptr, handle)  # the framework's own handle: its ops use the same
        return ptr
    except BaseException as e:
        # The framework sees only a failed allocation: say why here.
        print(f"ignis guard: allocating {size} bytes on device {device} failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        raise
    finally:
        ignis_guard_busy = 0
        if st.deferred:
            _drain_deferred()


def _free(ptr: int, size: int, device: int, handle: int, poisoned: bool = False) -> None:
    """Free the guarded block at ``ptr`` (``poisoned``: its poison is queued already).
    A pointer the guard did not hand out is ignored; a free that arrives while this thread
    is inside the allocator waits in ``_s.deferred`` for the outer call's end."""
    _free_c(ptr, size, device, handle, poisoned)


cdef object _graph_alloc(_State st, object device, object pool, object size):
    """Memory of a CUDA graph's pool: a block its pool freed before, of the same size, or new."""
    free = st.graph_free.get((device, pool))
    if free:
        ptrs = free.get(size)
        if ptrs:
            ptr = ptrs.pop()
            st.graph_blocks[ptr] = (device, pool, size)
            return ptr
    ptr = st.graph_alloc(device, size)
    st.graph_blocks[ptr] = (device, pool, size)
    return ptr


cdef int _free_c(object ptr, object size, object device, object handle, object poisoned,
                 bint later=False) except -1:
    global ignis_guard_busy
    cdef _State st = _st
    if ignis_guard_busy:  # a free from inside the allocator (the garbage collector): later
        st.deferred.append((ptr, size, device, handle, poisoned))
        return 0
    ignis_guard_busy = 1
    try:
        if st.graph_blocks:
            gb = st.graph_blocks.pop(ptr, None)
            if gb is not None:  # back to its graph's pool (a later capture there may take it)
                st.graph_free.setdefault((gb[0], gb[1]), {}).setdefault(gb[2], []).append(ptr)
                chk = _HK.checker
                if chk is not None and hasattr(chk, "extent_freed"):
                    chk.extent_freed(ptr)
                return 0
        if st.capturing and (device, handle) in st.capturing and ptr in st.blocks:
            # Its check and poison would be queued on a capturing stream (captured, not run): after.
            st.after_capture.append((ptr, size, device, handle, poisoned))
            return 0
        blk = st.blocks.pop(ptr, None)
        if blk is None:
            return 0  # not ours (allocated before the guard was installed)
        if st.rs_ptrs:
            st.rs_ptrs.discard(ptr)
        g = st.guards.get(device)
        if g is None:  # its context was rebuilt and its guard dropped: nothing to check
            return 0
        chk = _HK.checker
        if chk is not None and hasattr(chk, "extent_freed"):
            chk.extent_freed(ptr)
        (<GuardCore?>g)._free_fast(<DeviceBlock?>blk, poisoned, later)
    finally:
        ignis_guard_busy = 0
        if st.deferred:
            _drain_deferred()
    return 0


def graph_begin(device: int, stream: int, pool: object) -> None:
    """``stream`` of ``device`` starts capturing a CUDA graph that allocates into ``pool``."""
    _st.capturing[(device, stream)] = pool


def graph_end(device: int, stream: int) -> None:
    """``stream``'s capture ended: the frees of guarded blocks that waited for it are done now."""
    if _st.capturing.pop((device, stream), None) is None:
        return
    waiting = [f for f in _st.after_capture if (f[2], f[3]) == (device, stream)]
    _st.after_capture = [f for f in _st.after_capture if (f[2], f[3]) != (device, stream)]
    for ptr, size, dev, handle, poisoned in waiting:
        _free_c(ptr, size, dev, handle, poisoned)


def _drain_deferred() -> None:
    """Run the frees deferred while this thread was inside the allocator."""
    while _st.deferred:
        try:
            ptr, size, device, handle, poisoned = _st.deferred.pop(0)
        except IndexError:
            return
        _free_c(ptr, size, device, handle, poisoned)


# -- PyTorch's allocator entry points ---------------------------------------------------------------------
cdef object _bound_alloc = None
cdef object _bound_free = None
cdef object _ALLOC = _alloc
cdef object _FREE = _free
cdef unsigned long long _n_alloc = 0
cdef unsigned long long _n_free = 0

ctypedef int (*_memset8_fn)(unsigned long long dst, unsigned char value, size_t n, void *stream) noexcept nogil
ctypedef int (*_memset32_fn)(unsigned long long dst, unsigned int value, size_t n, void *stream) noexcept nogil
ctypedef int (*_ctx_device_fn)(int *device) noexcept nogil
cdef _memset8_fn _tg_memset = NULL
cdef _memset32_fn _tg_memset32 = NULL
cdef _ctx_device_fn _tg_ctx_device = NULL
cdef int _tg_poison = -1
cdef dict _tg_blocks = None
cdef object _tg_rs = None


def torch_guard_bind(alloc: object, free: object) -> tuple:
    """Bind the allocate / free that ``ignis_torch_alloc`` / ``ignis_torch_free`` (PyTorch's
    pluggable allocator entry points) run: ``_alloc`` / ``_free`` of this module (called
    directly) or any callables taking (size, device, stream handle) and (ptr, size,
    device, stream handle, poisoned). ``None, None`` unbinds. Returns the number of calls
    to each entry point so far."""
    global _bound_alloc, _bound_free
    if (alloc is not None and not callable(alloc)) or (free is not None and not callable(free)):
        raise TypeError("torch_guard_bind: expected two callables (or None, None)")
    _bound_alloc = alloc
    _bound_free = free
    return (_n_alloc, _n_free)


def torch_guard_poison(memset: int, ctx_device: int, poison: int, blocks: dict | None, rs: set | None,
                       memset32: int = 0) -> None:
    """Let ``ignis_torch_free`` queue a freed block's poison itself: ``memset``,
    ``ctx_device`` and ``memset32`` are the addresses of C functions with the signatures of
    the driver's ``cuMemsetD8Async``, ``cuCtxGetDevice`` and ``cuMemsetD32Async`` returning
    the CUresult as an int (``ignis.backends._cudriver.entry_points()``, or stand-ins;
    ``memset32`` 0: byte-wise memsets only), ``poison`` the byte value, ``blocks`` the
    guard's pointer -> block map (only its keys are poisoned) and ``rs`` the pointers whose
    free must wait for ``record_stream`` streams first (never poisoned here). With
    ``memset32`` the poison is the byte replicated into a word over the 4-byte aligned words
    and byte-wise over an unaligned head or tail, as ``guard_base.fill_bytes`` splits it.
    ``0, 0, -1, None, None`` turns it off."""
    global _tg_memset, _tg_memset32, _tg_ctx_device, _tg_poison, _tg_blocks, _tg_rs
    cdef unsigned long long ms = memset, cd = ctx_device, ms32 = memset32
    cdef int p = poison
    if (blocks is not None and not isinstance(blocks, dict)) or (rs is not None and not isinstance(rs, (set, frozenset))):
        raise TypeError("torch_guard_poison: expected a dict (or None) and a set (or None)")
    _tg_poison = -1  # off while the rest changes
    _tg_memset = <_memset8_fn><uintptr_t>ms
    _tg_memset32 = <_memset32_fn><uintptr_t>ms32
    _tg_ctx_device = <_ctx_device_fn><uintptr_t>cd
    _tg_blocks = blocks
    _tg_rs = rs
    _tg_poison = p if (ms and cd and blocks is not None and 0 <= p <= 255) else -1


cdef int _poison_words(_memset8_fn ms8, _memset32_fn ms32, unsigned long long p, unsigned char v, size_t n,
                       void *stream) noexcept nogil:
    """Queue the memsets of one poison on ``stream`` (0: every part queued), through the entry
    points given (``ms32`` NULL: byte-wise only). Word-wide where aligned (see
    guard_base.fill_bytes); a part that fails leaves the whole poison to the Python free (it
    fills the block again)."""
    cdef unsigned int word = v * 0x01010101u
    cdef size_t head, words, tail
    cdef int how
    if ms32 != NULL:
        how = fill_plan(p, n, &head, &words, &tail)
        if how == 0:
            return ms32(p, word, words, stream)
        if how == 2:
            if head and ms8(p, v, head, stream) != 0:
                return -1
            if ms32(p + head, word, words, stream) != 0:
                return -1
            if tail and ms8(p + head + 4 * words, v, tail, stream) != 0:
                return -1
            return 0
    return ms8(p, v, n, stream)


cdef bint _poison_here(void *ptr, Py_ssize_t size, int device, void *stream, object key) noexcept:
    """Queue the poison of a freed guarded block (see the module); True if it was queued.
    The driver is called with the GIL released, through the entry points read before (another
    thread may turn the poison off meanwhile)."""
    cdef int cur = -1, r = -1
    cdef _memset8_fn ms8 = _tg_memset
    cdef _memset32_fn ms32 = _tg_memset32
    cdef _ctx_device_fn ctx_device = _tg_ctx_device
    cdef int poison = _tg_poison
    if ms8 == NULL or ctx_device == NULL or poison < 0 or _tg_blocks is None or size <= 0:
        return False
    try:
        if key not in _tg_blocks or (_tg_rs is not None and key in _tg_rs):
            return False
        if _st.capturing and (device, <uintptr_t>stream) in _st.capturing:
            return False  # (a capturing stream: the memset would be captured; the free waits)
    except BaseException:
        return False
    with nogil:
        if ctx_device(&cur) == 0 and cur == device:
            r = _poison_words(ms8, ms32, <unsigned long long><uintptr_t>ptr, <unsigned char>poison, <size_t>size, stream)
    return r == 0


cdef public void *ignis_torch_alloc(Py_ssize_t size, int device, void *stream) noexcept nogil:
    if size <= 0 or not Py_IsInitialized():
        return NULL
    with gil:
        return _entry_alloc(size, device, stream)


cdef void *_entry_alloc(Py_ssize_t size, int device, void *stream) noexcept:
    global _n_alloc
    cdef PyObject *et
    cdef PyObject *ev
    cdef PyObject *tb
    cdef void *ptr = NULL
    fn = _bound_alloc
    if fn is None or ignis_finalizing():
        return NULL
    PyErr_Fetch(&et, &ev, &tb)  # the caller's pending exception, kept aside
    _n_alloc += 1
    err = None
    try:
        if fn is _ALLOC:
            r = _alloc_c(size, device, <uintptr_t>stream, None, None)
        else:
            r = fn(size, device, <uintptr_t>stream)
        if r is not None:
            ptr = <void *><uintptr_t>r
    except BaseException as exc:
        err = exc
    if err is not None:
        Py_XDECREF(et)  # the allocation's error is the one to raise
        Py_XDECREF(ev)
        Py_XDECREF(tb)
        PyErr_SetObject(type(err), err)  # left pending: the framework's call raises it
        return NULL
    PyErr_Restore(et, ev, tb)
    return ptr


cdef public void ignis_torch_free(void *ptr, Py_ssize_t size, int device, void *stream) noexcept nogil:
    if ptr == NULL or not Py_IsInitialized():
        return
    with gil:
        _entry_free(ptr, size, device, stream)


cdef void _entry_free(void *ptr, Py_ssize_t size, int device, void *stream) noexcept:
    global _n_free
    cdef PyObject *et
    cdef PyObject *ev
    cdef PyObject *tb
    fn = _bound_free
    if fn is None or ignis_finalizing():
        return
    PyErr_Fetch(&et, &ev, &tb)
    _n_free += 1
    err = None
    try:
        key = <uintptr_t>ptr
        # Freed while another stream than the block's is current: its poison waits (see
        # GuardCore._free_fast); else it is queued now, here, in C.
        cur = _st.current_stream
        later = cur is not None and cur(device) != <uintptr_t>stream
        poisoned = False if later else _poison_here(ptr, size, device, stream, key)
        if fn is _FREE:
            _free_c(key, size, device, <uintptr_t>stream, poisoned, later)
        else:
            fn(key, size, device, <uintptr_t>stream, poisoned)
    except BaseException as exc:
        err = exc
    if err is not None:
        PyErr_SetObject(type(err), err)
        PyErr_WriteUnraisable(fn)  # a free has nobody to raise to
    PyErr_Restore(et, ev, tb)
