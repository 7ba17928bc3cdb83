"""The framework allocators' hot path, compiled: PyTorch's allocator entry points and the
front end's allocate and free, over the guard's compiled core (``ignis.memory.guard_base``:
its ``allocate_c`` and ``free_fast_c``).

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
The guard itself (``DeferredGuardResource``, its compiled allocate and free, its check
batches) is the memory layer's (``ignis.memory.guard`` and ``guard_base``); this module only
hands it a framework's allocations and frees.
"""

from __future__ import annotations

import sys
import threading

from cpython.ref cimport PyObject, Py_XDECREF
from libc.stdint cimport uintptr_t

from .._cpython cimport ignis_finalizing

from ..memory.block cimport DeviceBlock
from ..memory.hooks cimport Hooks
from ..memory.hooks import HOOKS as _HOOKS
from ..memory.guard_base cimport GuardBase, fill_plan
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

__all__ = ["torch_guard_bind", "torch_guard_poison"]

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields

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
    cdef GuardBase g
    cdef DeviceBlock blk
    ignis_guard_busy = 1
    try:
        found = st.guards.get(device)
        if found is None:
            found = _make_guard(device)
        g = <GuardBase?>found
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
        blk = g.allocate_c(size, s, tag or st.tag, capture_c(1, g.stack_depth) if g.capture_stacks else ())
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
        (<GuardBase?>g).free_fast_c(<DeviceBlock?>blk, poisoned, later)
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
        # GuardBase.free_fast_c); else it is queued now, here, in C.
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
