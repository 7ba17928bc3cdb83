"""The guard's compiled core: the typed state of ``DebugGuardResource`` and
``DeferredGuardResource`` (``ignis.memory.guard``), the record of one allocation, the
quarantine's bookkeeping, the one ``allocate`` both modes run, the deferred mode's free
and its check batches.

- ``GuardBase`` holds the fields every guard reads on each allocation and free (the live
  map, the quarantine, the counters, the lock, the options, and the deferred mode's batches,
  ready cache and formatted-block map), declared with C types in ``guard_base.pxd``. It is
  the first base of ``DebugGuardResource``, which adds the slow paths in Python; the
  deferred guard is a ``DebugGuardResource`` too. Its ``allocate`` is the guard's
  allocation in both modes (a block the deferred mode checked and repaired is reused without
  a memset, or with only the bytes that differ; the eager mode formats every block);
  ``free_fast`` is the deferred mode's common free (``deallocate`` has the rest), and
  ``_release_exits`` hands back blocks whose checks are queued. The framework allocators
  (``ignis.memory.guard_alloc``) call ``allocate_c`` / ``free_fast_c`` without a Python call.
- The allocation site is the user's frames, taken through the memory layer's stack-capture
  hook (``memory.hooks``: ``ignis.safety.frames`` installs its walker there), formatted
  only for a report.
- ``_Guarded`` is the guard's record of one allocation (both modes).
- ``_Checker``: the deferred mode's batches of checks (pending jobs per stream, batches in
  flight, their buffers, the kernel), and ``_host_check``, the kernel's two phases on a
  backend without compiled kernels.

``fill_bytes`` (``fill_bytes_c`` for compiled callers) is how every guard queues its
canaries and poison: a byte replicated into a 32-bit word (``memset_d32_async``) over the
4-byte aligned words of the region, ``memset_d8_async`` for an unaligned head or tail. A GPU
fills a large region faster with word stores than byte stores, and both guards fill whole
tensors on every allocation or free. The bytes written are the same either way.
"""

from __future__ import annotations

import ctypes
import functools
from collections import deque

import numpy as np

cimport cython
from cpython.long cimport PyLong_AsVoidPtr
from libc.stdint cimport uintptr_t

from ..backends.direct cimport DirectCalls, copy_dtoh_fn, copy_htod_fn, gates_open, memset32_fn

from .block cimport (BLOCK_FREED, BLOCK_QUARANTINED, DeviceBlock, block_clean_on, block_lend_record, block_live,
                     block_move, fresh_generation, new_block)
from .hooks cimport Hooks
from .hooks import HOOKS as _HOOKS, format_stack
from .pool cimport PoolResource, pool_deallocate, pool_direct
from .resource cimport DeviceMemoryResource, ReentrantLock, ResourceLock, lock_take, lock_give
from .resource import check_request
from .types import UNTAGGED
from ..runtime.stream cimport Stream

__all__ = ["GuardBase", "fill_bytes", "MAX_BATCH", "guard_timing", "check_batches_direct"]

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields

# A diagnostic (``guard_timing``): the time of the deferred mode's parts, off by default (one
# branch where measured). _t: launches, ns queuing them, blocks released, ns releasing them,
# event queries, ns in free_fast_c, ns in its jobs' queuing (launches included), ns in allocate_c.
cdef bint _timing = False
cdef unsigned long long _t[14]   # (8-13: ns in each of a direct batch's six driver calls)
# Whether check batches may go straight to the driver (``check_batches_direct``; on by default).
cdef bint _direct_on = True


def guard_timing(on: bool) -> dict:
    """A diagnostic: measure (``on``) or stop measuring where the deferred guard's time goes.
    Returns what was measured since the last call, and restarts the count: the check batches
    queued and the ns queuing them (``launches``, ``launch_ns``), the blocks leaving the
    quarantine handed back and the ns doing it (``released``, ``release_ns``), the queries of
    batches' events (``queries``), the ns in the compiled free (``free_ns``, its jobs'
    queuing and launches included), in its jobs' queuing (``queue_ns``, launches included),
    in the compiled allocate (``alloc_ns``), and in each of the six driver calls of the
    batches queued straight to the driver (``direct_*_ns``)."""
    global _timing
    names = ("launches", "launch_ns", "released", "release_ns", "queries", "free_ns", "queue_ns", "alloc_ns",
             "direct_htod_ns", "direct_fill_ns", "direct_phase0_ns", "direct_phase1_ns", "direct_dtoh_ns",
             "direct_record_ns")
    out = {names[i]: _t[i] for i in range(14)}
    for i in range(14):
        _t[i] = 0
    _timing = bool(on)
    return out


def check_batches_direct(on: bool) -> bool:
    """Whether the deferred guard queues its check batches straight to the driver where the
    backend's direct calls allow it (the default), or always through the backend's methods
    (a diagnostic: the two ways compared in one process). Returns the previous setting."""
    global _direct_on
    was = _direct_on
    _direct_on = bool(on)
    return was


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


@cython.final
cdef class _Quarantine:
    """The quarantined blocks' records by user pointer, the oldest first out: a dictionary
    for the lookups and a queue of the pointers for the order (an ``OrderedDict``'s
    ``popitem(last=False)`` cost several times more on the free's path). From Python a
    mapping: ``q[ptr] = record`` (a pointer quarantined already keeps its place), ``get``,
    ``in``, ``len``, ``values()`` (oldest first)."""

    def __cinit__(self) -> None:
        self._by_ptr = {}
        self._order = deque()

    cdef int put(self, object ptr, object record) except -1:
        cdef dict d = self._by_ptr
        cdef Py_ssize_t n = len(d)
        d[ptr] = record
        if len(d) != n:  # (a new pointer: last in the order)
            self._order.append(ptr)
        return 0

    cdef object take_oldest(self):
        """The oldest record, removed (IndexError when empty)."""
        return self._by_ptr.pop(self._order.popleft())

    def __setitem__(self, ptr: int, record: object) -> None:
        self.put(ptr, record)

    def __getitem__(self, ptr: int) -> object:
        return self._by_ptr[ptr]

    def get(self, ptr: int, default: object = None) -> object:
        return self._by_ptr.get(ptr, default)

    def __contains__(self, ptr: object) -> bool:
        return ptr in self._by_ptr

    def __len__(self) -> int:
        return len(self._by_ptr)

    def __iter__(self):
        return iter(self._by_ptr)

    def values(self):
        """The records, the oldest first."""
        return self._by_ptr.values()


cdef class _Guarded:
    """The guard's record of one allocation: the user block, the upstream block that holds
    it and its guards, the allocation site (frames, unformatted), the streams
    ``record_stream`` named (deferred mode) and the sides already reported.

    Args:
        block: the user's ``DeviceBlock`` (its requested bytes).
        up: the upstream block holding the guards and the user bytes.
        stack: the allocation site as the hooks' stack capture took it, or None.
    """

    # Fields: see guard_base.pxd.

    def __init__(self, block: DeviceBlock, up: DeviceBlock, stack: object) -> None:
        self.block = block
        self.up = up
        self.stack = stack

    def stack_text(self) -> str | None:
        """The allocation site as traceback text, or None when none was captured."""
        if not self.stack:
            return None
        return format_stack(self.stack)


def _uniform(data: np.ndarray, value: int) -> bool:
    """True when every byte of the contiguous uint8 array ``data`` equals ``value``. A large
    region is compared eight bytes at a time (a uint64 view, aligned or not: a few times
    faster than byte by byte), its last ``size % 8`` bytes alone; a small one (under 16 KiB,
    where the view's own cost would dominate) byte by byte."""
    n = data.size
    if n < 1 << 14:
        return not (data != value).any()
    m = n & ~7
    if m != n and (data[m:] != value).any():
        return False
    return not (data[:m].view(np.uint64) != np.uint64(value * 0x0101010101010101)).any()


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
MAX_BATCH: int = C_CAP  # the most jobs one check batch takes (DeferredGuardResource's ``batch``)
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

# -- check batches ------------------------------------------------------------------------------------
cdef class _Slot:
    """Buffers for one batch in flight: jobs and results, on the host and the device, and its event."""

    # Fields: see guard_base.pxd.


cdef class _Batch:
    """A batch in flight: its slot, its jobs ((entry, kind, when) each) and its stream."""

    # Fields: see guard_base.pxd.

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

    # Fields: see guard_base.pxd.

    def __init__(self, guard: GuardBase) -> None:
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
        self.dc = None
        if self.cuda:
            try:
                found = self.backend.direct_calls()
            except Exception:  # noqa: BLE001 - a backend without them: its methods only
                found = None
            if isinstance(found, DirectCalls):
                ep = (<DirectCalls>found).entry_points
                a, b, c = ep.get("cuMemcpyHtoDAsync", 0), ep.get("cuMemcpyDtoHAsync", 0), ep.get("cuMemsetD32Async", 0)
                if all(type(x) is int and x > 0 for x in (a, b, c)):
                    self.htod = <copy_htod_fn><uintptr_t>a
                    self.dtoh = <copy_dtoh_fn><uintptr_t>b
                    self.ms32 = <memset32_fn><uintptr_t>c
                    self.dc = found

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
        if self.closed:
            raise RuntimeError("this guard's checks are closed (DeferredGuardResource.close()): nothing more is "
                               "queued on the device")
        if self.free_slots:
            return self.free_slots.pop()
        if self.inflight and self._done((<_Batch>self.inflight[0]).slot):
            self._harvest(self.inflight.popleft())
            return self.free_slots.pop()
        if len(self.all_slots) < _MAX_SLOTS:
            return self._new_slot()
        b = self.inflight.popleft()
        self.backend.event_synchronize(b.slot.event)
        self._harvest(b)
        return self.free_slots.pop()

    cdef bint _done(self, _Slot slot) except -1:
        """Whether the batch of ``slot`` finished (its event's query: straight to the driver
        where the backend's direct calls may, else the backend's method)."""
        cdef int r
        if _timing:
            _t[4] += 1
        if self.dc is not None:
            r = self.dc.query(slot.event)
            if r >= 0:
                return r == 1
        return self.backend.event_query(slot.event)

    cdef int _direct_steps(self, object h, _Slot slot, Py_ssize_t k, unsigned int gx) except -1:
        """Queue a batch of ``k`` jobs on stream handle ``h`` straight to the driver, in the
        order the backend's methods would: the jobs' copy to the device, the results' fill,
        the kernel's two phases, the results' copy back, the event's record. Returns how many
        of those six were queued (0: none; the caller makes the rest through the backend's
        methods, which raise the driver's error): only where the backend's direct calls may
        (no gate closed; a handle of its table with its context current on this thread, or a
        framework's stream it adopted with a context of this device current). ``h``: the
        handle its Stream's ``_check`` returned (open, of the live context)."""
        cdef DirectCalls dc = self.dc
        cdef GuardBase g = self.g
        cdef void *st
        cdef void *f
        cdef void *params[6]
        cdef unsigned long long a_jobs, a_res, a_g
        cdef unsigned int a_canary, a_poison
        cdef int a_phase = 0
        cdef int r = 0, done = 0
        cdef unsigned int gy = <unsigned int>k
        cdef size_t njob = <size_t>k * C_JOB_WORDS * 8, nres = <size_t>k * C_RES_WORDS * 8
        if dc is None or self.fn_addr == 0 or dc.launch_fn == NULL:
            return 0
        # (kept: the driver's stream object stays alive while the GIL is released; a framework's
        # stream, adopted, is kept by its Stream)
        sr = dc.launch_target_on(h, self.device.ordinal)
        if sr is None:
            return 0
        if not gates_open(dc):  # (trace listeners, armed faults: the backend's methods make every call)
            return 0
        st = PyLong_AsVoidPtr(h)
        f = <void *><uintptr_t>self.fn_addr
        a_jobs = slot.jobs_dev
        a_res = slot.res_dev
        a_g = <unsigned long long>g.canary_bytes
        a_canary = <unsigned int>g.canary
        a_poison = <unsigned int>g.poison
        params[0] = &a_jobs
        params[1] = &a_res
        params[2] = &a_g
        params[3] = &a_canary
        params[4] = &a_poison
        params[5] = &a_phase
        cdef unsigned long long jobs_dev = slot.jobs_dev, res_dev = slot.res_dev
        cdef const void *jobs_host = slot.jobs_host
        cdef void *res_host = slot.res_host
        cdef bint timed = _timing
        cdef unsigned long long t[6]
        with nogil:
            t[0] = now_ns() if timed else 0
            r = self.htod(jobs_dev, jobs_host, njob, st)
            if r == 0:
                done = 1
                t[1] = now_ns() if timed else 0
                r = self.ms32(res_dev, 0xFFFFFFFFu, nres // 4, st)
            if r == 0:
                done = 2
                t[2] = now_ns() if timed else 0
                r = dc.launch_fn(f, gx, gy, 1, C_THREADS, 1, 1, 0, st, params, NULL)
            if r == 0:
                done = 3
                t[3] = now_ns() if timed else 0
                a_phase = 1  # (the driver copied the parameters at the first launch)
                r = dc.launch_fn(f, 1, gy, 1, C_THREADS, 1, 1, 0, st, params, NULL)
            if r == 0:
                done = 4
                t[4] = now_ns() if timed else 0
                r = self.dtoh(res_host, res_dev, nres, st)
            if r == 0:
                done = 5
                t[5] = now_ns() if timed else 0
        if done == 5 and timed:
            for i in range(5):
                _t[8 + i] += t[i + 1] - t[i]
        if done == 5 and dc.record_on(h, slot.event, self.device.ordinal) == 0:
            done = 6
            if timed:
                _t[13] += now_ns() - t[5]
        return done

    def close(self) -> None:
        """Give the buffers back (after the batches in flight finished)."""
        cdef _Slot s
        with self.lock:
            self.wait()
            self.closed = True
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
    cdef inline list _pending_on(self, object stream):
        """The jobs waiting on ``stream`` (a list made on first use). Lock held."""
        cdef list lst = self.pending.get(stream)
        if lst is None:
            lst = self.pending[stream] = []
        return lst

    cdef inline object _job_stream(self, _Guarded e):
        """Where ``e``'s job is checked: its allocation stream, or where that closed, ``_stream_of``'s."""
        s = e.up.alloc_stream
        return self.g._stream_of(e) if s._closed else s

    def add(self, stream: Stream, entry: _Guarded, kind: str, when: str) -> None:
        """Queue a job (``kind``: FREE, EXIT, LIVE or HELD) for ``entry`` on ``stream``; a full batch is launched."""
        cdef list lst
        with self.lock:
            lst = self._pending_on(stream)
            lst.append((entry, kind, when))
            if len(lst) >= self.g.batch:
                self.launch(stream)

    def add_many(self, entries: list, kind: str, when: str) -> None:
        """``add`` for each of ``entries`` (its block's stream: its allocation stream, or where
        that closed, ``_stream_of``'s), in one call: the live check of every live block."""
        cdef Py_ssize_t batch = self.g.batch
        cdef list lst
        cdef _Guarded e
        cdef ReentrantLock lk = self.lock
        lk.take()
        try:
            for e in entries:
                s = self._job_stream(e)
                lst = self._pending_on(s)
                lst.append((e, kind, when))
                if len(lst) >= batch:
                    self.launch(s)
        finally:
            lk.give()

    def after_free(self) -> None:
        """Count a free; every 16th reads the batches that finished."""
        self.frees += 1
        if not self.frees & 15 and self.inflight:
            self.poll()

    cdef int _queue_free(self, Stream s, _Guarded e, list evicted) except -1:
        """``free_fast``'s jobs: check ``e`` (freed on ``s``) and the blocks it pushed out of
        the quarantine; launch what fills a batch; every 16th free, read finished batches."""
        cdef Py_ssize_t batch = self.g.batch
        cdef list lst, l2
        cdef _Guarded x
        cdef ReentrantLock lk = self.lock
        lk.take()
        try:
            lst = self._pending_on(s)
            lst.append((e, FREE, _ON_FREE))
            if evicted:
                for x in evicted:
                    xs = self._job_stream(x)
                    l2 = self._pending_on(xs)
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
        cdef GuardBase g = self.g
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
        cdef GuardBase g = self.g
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
        cdef int done = 0
        cdef unsigned long long t0 = now_ns() if _timing else 0
        try:
            h = stream._check()
            if self.cuda:
                if self.fn is None:
                    self.fn = b.kernel_compile(self.device.ordinal, _KERNEL, "ignis_guard_check")
                    try:  # the driver's CUfunction handle, for the direct calls (0: the backend's methods)
                        addr = int(self.fn)
                    except Exception:  # noqa: BLE001 - a backend whose functions are not driver handles
                        addr = 0
                    self.fn_addr = addr if type(addr) is int and addr > 0 else 0
                gx = max(1, min(1024, (maxchunks + 2 * G // 16 + C_THREADS - 1) // C_THREADS))
                if _direct_on:
                    done = self._direct_steps(h, slot, k, gx)
                if done >= 5:
                    self.direct_batches += 1
                if done < 5:
                    args = (ctypes.c_uint64(slot.jobs_dev), ctypes.c_uint64(slot.res_dev), ctypes.c_uint64(G),
                            ctypes.c_uint32(g.canary), ctypes.c_uint32(g.poison))
                    if done < 1:
                        b.memcpy_htod_async(slot.jobs_dev, slot.jobs_ptr, k * C_JOB_WORDS * 8, h)
                    if done < 2:
                        fill_bytes_c(b, slot.res_dev, 0xFF, k * C_RES_WORDS * 8, h)
                    if done < 3:
                        b.kernel_launch(self.fn, (gx, k, 1), (C_THREADS, 1, 1), 0, h, (*args, ctypes.c_int32(0)))
                    if done < 4:
                        b.kernel_launch(self.fn, (1, k, 1), (C_THREADS, 1, 1), 0, h, (*args, ctypes.c_int32(1)))
                    if done < 5:
                        b.memcpy_dtoh_async(slot.res_ptr, slot.res_dev, k * C_RES_WORDS * 8, h)
            else:
                views = [(b.host_view(x.up.ptr, 2 * G + x.block.requested), x.block.requested, _FLAGS[kind])
                         for x, kind, _ in items]
                b.kernel_launch(functools.partial(_host_check, views, slot.res, G, g.canary, g.poison),
                                (1, 1, 1), (1, 1, 1), 0, h, ())
            if done < 6:
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
        cdef unsigned long long t1 = now_ns() if t0 else 0
        # The check is queued before any reuse (stream order; a reuse elsewhere waits on an
        # event recorded after it): blocks leaving the quarantine can go back to the pool now.
        exits = [x for x, kind, _ in items if kind == EXIT]
        if exits:
            g._release_exits(exits)
        if t0:
            _t[0] += 1
            _t[1] += t1 - t0
            _t[2] += len(exits)
            _t[3] += now_ns() - t1
        return 0

    # -- results -------------------------------------------------------------------
    def poll(self) -> None:
        """Read every finished batch (no waiting)."""
        with self.lock:
            q = self.inflight
            while q and self._done((<_Batch>q[0]).slot):
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


cdef class GuardBase(DeviceMemoryResource):
    """The typed state of a debug guard, its quarantine's bookkeeping, its one ``allocate``
    and the deferred mode's compiled free (see the module).

    Not a resource on its own: ``DebugGuardResource`` is (and ``DeferredGuardResource``).
    The quarantine is an ordered map (oldest first) of user pointer -> record; a record holds
    ``requested + 2 * canary_bytes`` bytes. The compiled paths call back into the guard's
    Python methods for the rare cases (``_format`` of a fresh block, ``_reformat`` of a
    checked block of another size, ``_after_oom``, ``deallocate`` of a free that is not the
    common case, ``_double``, ``_stream_of``).
    """

    # Fields: see guard_base.pxd.

    def _serve_as(self, DeviceMemoryResource upstream not None) -> None:
        """Serve ``upstream``'s memory (its device, backend and context generation), and
        keep it as this guard's ``upstream`` (the adaptor base's constructor calls this)."""
        DeviceMemoryResource._serve_as(self, upstream)
        self.upstream = upstream

    def _configure(self, canary_bytes: int, poison: int, canary: int, quarantine_count: int,
                   quarantine_bytes: int, capture_stacks: bool, stack_depth: int, tracks: bool) -> None:
        """The settings and the empty state of a guard (``DebugGuardResource``'s constructor,
        once its checks passed): its fields are read-only from Python, written here."""
        self.canary_bytes = canary_bytes
        self.poison = poison
        self.canary = canary
        self.quarantine_count = quarantine_count
        self.quarantine_bytes = quarantine_bytes
        self.capture_stacks = capture_stacks
        self.stack_depth = stack_depth
        self._tracks = tracks
        self._lock = ResourceLock()
        self._live = {}
        self._quarantine = _Quarantine()
        self._live_bytes = 0
        self._quarantined_bytes = 0

    def _configure_deferred(self, batch: int, ready_limit: int, reuse: bool) -> None:
        """The deferred mode's settings and empty state (``DeferredGuardResource``'s
        constructor): its check batches, its ready cache, its bookkeeping of reuse."""
        self.batch = batch
        self._reuse = reuse
        self._formatted = {}
        self._held_exit = {}
        self._ready = {}
        self._ready_bytes = 0
        self.ready_limit = ready_limit
        self._ready_stale = False
        self._unpoisoned = {}
        self._unpoisoned_n = 0
        self._checker = _Checker(self)
        self._state = self.device.state  # its generation moves when the context is rebuilt
        self.reused = 0           # allocations of a checked block of the same size: no memset
        self.resized = 0          # of a checked block of another size: the bytes that differ
        self.formatted_fresh = 0  # of a block formatted whole

    def _count_bytes(self, live: int, quarantined: int) -> None:
        """Move the live and the quarantined byte counts (the guard's Python paths). Lock held."""
        self._live_bytes += live
        self._quarantined_bytes += quarantined

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
        cdef _Quarantine q = self._quarantine
        for i in range(k):
            e = q.take_oldest()
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

    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED,
                 frames: tuple | None = None) -> DeviceBlock:
        """A LIVE block of ``nbytes`` poisoned bytes between two canary guards, ordered on
        ``stream`` (no host synchronization). ``frames``: the allocation site, if the caller
        captured it already, as ``hooks.capture_stack`` takes it (else it is captured here
        when ``capture_stacks``)."""
        if frames is not None and type(frames) is not tuple:
            raise TypeError(f"frames must be a tuple of the allocation site's frames (hooks.capture_stack()), "
                            f"or None, got {type(frames).__name__}")
        return self.allocate_c(nbytes, stream, tag, frames)

    cdef DeviceBlock allocate_c(self, object nbytes, object stream, object tag, object frames):
        cdef DeviceBlock up, block
        cdef _Guarded entry
        cdef Py_ssize_t g = self.canary_bytes, n
        cdef ResourceLock lk
        cdef unsigned long long t0 = now_ns() if _timing else 0
        if stream is None:
            stream = self.device.default_stream
        if type(nbytes) is not int or nbytes <= 0 or type(stream) is not Stream:
            check_request(nbytes, stream)
        if self._closed:
            self._check_alive()
        if frames is None and self.capture_stacks and _HK.capture != NULL:
            frames = _HK.capture(1, self.stack_depth)  # frame 1: the caller (this code has no frames)
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
        entry = _Guarded.__new__(_Guarded)
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
        if t0:
            _t[7] += now_ns() - t0
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
                    if block_live(up):
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
        """The deferred mode's ``deallocate`` of a framework's tensor, its common case in few
        steps: no record_stream streams, no tracked use, its stream open, the quarantine on
        (anything else is ``deallocate(block, foreign=True)``). ``poisoned``: the caller
        queued the poison already (the C entry point). In the eager mode, ``deallocate``."""
        if self._checker is None:
            self.deallocate(block)
            return
        if type(block) is not DeviceBlock:
            self.deallocate(block, foreign=True)
            return
        self.free_fast_c(<DeviceBlock>block, poisoned)

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

    cdef int free_fast_c(self, DeviceBlock block, bint poisoned, bint later=False) except -1:
        cdef _Guarded e
        cdef DeviceBlock up
        cdef Stream s
        cdef Py_ssize_t n, held, max_count, max_bytes
        cdef list evicted = None
        cdef ResourceLock lk
        cdef _Guarded x
        cdef _Quarantine q
        cdef unsigned long long t0 = now_ns() if _timing else 0, tq = 0
        impl = block._impl
        if type(impl) is not _Guarded or self._checker is None:
            self.deallocate(block, foreign=True)
            return 0
        e = <_Guarded>impl
        up = e.up
        st = up.alloc_stream
        n = block.requested
        held = n + 2 * self.canary_bytes
        ptr = block.ptr
        gen = self._state.generation
        max_count = as_bound(self.quarantine_count)
        max_bytes = as_bound(self.quarantine_bytes)
        # A block clean on its own stream carries no tracked use (every framework tensor: the
        # framework orders its own work): no wait before its poison, nor before a reuse there.
        if (type(st) is not Stream or e.rs is not None or (<Stream>st)._closed or self._closed
                or held > max_bytes or max_count == 0
                or (gen is not self._generation and gen != self._generation)
                or not block_clean_on(up, st) or self._live.get(ptr) is not e):
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
                block_move(block, BLOCK_QUARANTINED)  # LIVE: it was in the live map
            except BaseException:
                self._live[ptr] = e  # refused: nothing changed
                raise
            self._live_bytes -= n
            q = self._quarantine
            q.put(ptr, e)
            self._quarantined_bytes += held
            if len(q._by_ptr) > max_count or self._quarantined_bytes > max_bytes:
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
        if t0:
            tq = now_ns()
        self._checker._queue_free(s, e, evicted)
        if t0:
            _t[6] += now_ns() - tq
            _t[5] += now_ns() - t0
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
                if block_live(up):
                    st = up.alloc_stream
                    if not (ready and type(st) is Stream and not (<Stream>st)._closed and block_clean_on(up, st)
                            and self._keep_ready(up, b.requested, b.tag, False)):
                        pool_deallocate(mr, up)
                        if fmt is not None:
                            impl = up._impl
                            if impl is not None:
                                fmt[up.ptr] = (impl, impl.size, b.requested)
            except BaseException as exc:  # the upstream refused it: keep it (counted) for a later flush
                lock_take(lk)
                try:
                    self._quarantine.put(b.ptr, e)
                    self._quarantined_bytes += self._held_c(e)
                finally:
                    lock_give(lk)
                if failure is None:
                    failure = exc
                continue
            block_move(b, BLOCK_FREED)
            b._impl = None  # no block <-> record cycle left for the garbage collector
            if rec is not None:
                rec("free_completed", self, b.ptr, b.requested, b.alloc_stream, b)
        if failure is not None:
            raise failure
