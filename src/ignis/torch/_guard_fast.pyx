"""PyTorch's allocator entry points, compiled: the C functions its pluggable allocator loads,
over the guard front's compiled allocate and free (``ignis.memory.guard_alloc``).

- ``ignis_torch_alloc`` / ``ignis_torch_free``: the C functions that
  ``torch.cuda.memory.CUDAPluggableAllocator`` loads from this extension by name
  (``void *alloc(ssize_t size, int device, cudaStream_t stream)`` and
  ``void free(void *ptr, ssize_t size, int device, cudaStream_t stream)``). PyTorch
  calls them from any thread, holding the GIL or not: each takes the GIL
  (``PyGILState_Ensure``) and runs the allocate / free bound by
  ``torch_guard_bind`` (the front's ``alloc`` / ``free`` are called directly, without a
  Python call; any other callable is called with plain ints). An exception pending
  in the caller's thread is kept aside and restored. A failed allocation returns
  NULL with its exception left pending, so the PyTorch call that asked for the
  memory raises it (as SystemError, with the cause chained); an exception in a
  free is printed (``PyErr_WriteUnraisable``): a free has nobody to raise to.
  Unbound, and while the interpreter finalizes, allocations fail and frees are
  dropped (the process is ending; the driver reclaims the memory).
- A free may first queue the block's poison itself (``torch_guard_poison``: the driver's
  ``cuMemsetD32Async`` over the aligned words, ``cuMemsetD8Async`` for an unaligned
  head or tail, through the C entry points of ``ignis.backends._cudriver``, which
  call the driver's functions; no Python call), for a block the guard handed out with
  no ``record_stream`` streams to wait for, on the device of the thread's
  current context; the free is told whether it did.
``ignis.torch._guard`` installs this as PyTorch's allocator.
"""

from __future__ import annotations

from cpython.ref cimport PyObject, Py_XDECREF
from libc.stdint cimport uintptr_t
from posix.time cimport CLOCK_THREAD_CPUTIME_ID

from .._cpython cimport ignis_finalizing

from ..memory.guard_base cimport fill_plan, now_ns
from ..memory.guard_alloc cimport State, alloc_c, free_c
from ..memory.guard_alloc import alloc as _front_alloc, free as _front_free, state as _state

cdef extern from "Python.h":
    int Py_IsInitialized() nogil
    void PyErr_Fetch(PyObject **, PyObject **, PyObject **)
    void PyErr_Restore(PyObject *, PyObject *, PyObject *)
    void PyErr_SetObject(object, object)
    void PyErr_WriteUnraisable(object)

cdef extern from *:
    """
    /* PyTorch's pluggable allocator finds these by name in this library: exported
       whatever the build's default visibility. */
    __attribute__((visibility("default"))) void *ignis_torch_alloc(Py_ssize_t, int, void *);
    __attribute__((visibility("default"))) void ignis_torch_free(void *, Py_ssize_t, int, void *);
    """

__all__ = ["torch_guard_bind", "torch_guard_poison", "torch_guard_timing"]

cdef State _st = _state  # the front's state (one per process; re-initialized in place, never replaced)


# -- PyTorch's allocator entry points ---------------------------------------------------------------------
cdef object _bound_alloc = None
cdef object _bound_free = None
cdef object _ALLOC = _front_alloc
cdef object _FREE = _front_free
cdef unsigned long long _n_alloc = 0
cdef unsigned long long _n_free = 0

ctypedef int (*_memset8_fn)(unsigned long long dst, unsigned char value, size_t n, void *stream) noexcept nogil
ctypedef int (*_memset32_fn)(unsigned long long dst, unsigned int value, size_t n, void *stream) noexcept nogil
ctypedef int (*_ctx_device_fn)(int *device) noexcept nogil
cdef _memset8_fn _tg_memset = NULL
cdef _memset32_fn _tg_memset32 = NULL
cdef _ctx_device_fn _tg_ctx_device = NULL
cdef int _tg_poison = -1
cdef bint _timing = False  # the entry points' time measured (torch_guard_timing; a diagnostic)
cdef unsigned long long _t_alloc = 0, _t_free = 0, _t_poison = 0, _t_nalloc = 0, _t_nfree = 0, _t_gil = 0, _t_cpu = 0
cdef dict _tg_blocks = None
cdef object _tg_rs = None


def torch_guard_bind(alloc: object, free: object) -> tuple:
    """Bind the allocate / free that ``ignis_torch_alloc`` / ``ignis_torch_free`` (PyTorch's
    pluggable allocator entry points) run: the front's ``alloc`` / ``free``
    (``ignis.memory.guard_alloc``, called directly) or any callables taking (size, device,
    stream handle) and (ptr, size, device, stream handle, poisoned). ``None, None`` unbinds. Returns the number of calls
    to each entry point so far."""
    global _bound_alloc, _bound_free
    if (alloc is not None and not callable(alloc)) or (free is not None and not callable(free)):
        raise TypeError("torch_guard_bind: expected two callables (or None, None)")
    _bound_alloc = alloc
    _bound_free = free
    return (_n_alloc, _n_free)


def torch_guard_timing(on: bool) -> tuple:
    """A diagnostic: measure (``on``) or stop measuring the time spent in the entry points,
    the GIL's taking included. Returns what was measured since the last call and restarts
    the count: (allocations, ns in them, frees, ns in them, ns of the frees in the poison's
    driver calls, ns of both in taking the GIL, ns of both on the thread's CPU)."""
    global _timing, _t_alloc, _t_free, _t_poison, _t_nalloc, _t_nfree, _t_gil, _t_cpu
    out = (_t_nalloc, _t_alloc, _t_nfree, _t_free, _t_poison, _t_gil, _t_cpu)
    _t_alloc = _t_free = _t_poison = _t_nalloc = _t_nfree = _t_gil = _t_cpu = 0
    _timing = bool(on)
    return out


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
    global _t_poison
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
    cdef unsigned long long t0 = now_ns() if _timing else 0
    with nogil:
        if ctx_device(&cur) == 0 and cur == device:
            r = _poison_words(ms8, ms32, <unsigned long long><uintptr_t>ptr, <unsigned char>poison, <size_t>size, stream)
    if t0:
        _t_poison += now_ns() - t0
    return r == 0


cdef public void *ignis_torch_alloc(Py_ssize_t size, int device, void *stream) noexcept nogil:
    global _t_alloc, _t_nalloc, _t_gil, _t_cpu
    cdef void *r
    cdef unsigned long long t0, c0
    if size <= 0 or not Py_IsInitialized():
        return NULL
    if not _timing:
        with gil:
            return _entry_alloc(size, device, stream)
    c0 = now_ns(CLOCK_THREAD_CPUTIME_ID)
    t0 = now_ns()
    with gil:
        _t_gil += now_ns() - t0
        r = _entry_alloc(size, device, stream)
        _t_alloc += now_ns() - t0
        _t_cpu += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0
        _t_nalloc += 1
    return r


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
            r = alloc_c(size, device, <uintptr_t>stream, None, None)
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
    global _t_free, _t_nfree, _t_gil, _t_cpu
    cdef unsigned long long t0, c0
    if ptr == NULL or not Py_IsInitialized():
        return
    if not _timing:
        with gil:
            _entry_free(ptr, size, device, stream)
        return
    c0 = now_ns(CLOCK_THREAD_CPUTIME_ID)
    t0 = now_ns()
    with gil:
        _t_gil += now_ns() - t0
        _entry_free(ptr, size, device, stream)
        _t_free += now_ns() - t0
        _t_cpu += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0
        _t_nfree += 1


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
            free_c(key, size, device, <uintptr_t>stream, poisoned, later)
        else:
            fn(key, size, device, <uintptr_t>stream, poisoned)
    except BaseException as exc:
        err = exc
    if err is not None:
        PyErr_SetObject(type(err), err)
        PyErr_WriteUnraisable(fn)  # a free has nobody to raise to
    PyErr_Restore(et, ev, tb)
