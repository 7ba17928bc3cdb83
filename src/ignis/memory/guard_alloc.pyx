"""The framework allocators' hot path, compiled: a framework's allocate and free over the
guard's compiled core (``ignis.memory.guard_base``: its ``allocate_c`` and ``free_fast_c``).

PyTorch's pluggable-allocator entry points (``ignis.torch._guard_fast``) and CuPy's allocator
(``ignis.cupy``) both come here; ``guard_front`` has the rest (options, one guard per device,
the reports, the checks at synchronize points) and the design.

- ``alloc`` / ``free`` (and ``alloc_c`` / ``free_c`` for compiled callers): the front's state
  (``State``: guards, adopted streams, pointer -> block), the allocation site, the
  sanitizer's ``extent_allocated`` / ``extent_freed`` (through the memory layer's checker
  slot), and the deferral of a free that arrives while this thread is inside the allocator
  (the garbage collector running a tensor's free there): ``state.tls.busy``, a C
  thread-local flag, and ``state.deferred``, drained when the outer call ends.
- CUDA graphs: while a stream captures (``graph_begin`` / ``graph_end``), what it allocates is
  its graph pool's memory, unguarded, and the frees of guarded blocks wait for the capture's end.
"""

from __future__ import annotations

import sys
import threading

from .block cimport DeviceBlock
from .hooks cimport Hooks
from .hooks import HOOKS as _HOOKS
from .guard_base cimport GuardBase

cdef extern from *:
    """
    /* Set while this thread runs the guard's allocate or free (state.tls.busy). */
    static __thread int ignis_guard_busy = 0;
    """
    int ignis_guard_busy

__all__ = ["State", "state", "setup", "alloc", "free", "graph_begin", "graph_end", "drain_deferred"]

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields


cdef inline tuple _site(Py_ssize_t depth):
    """The allocation site: the program's frames at the framework's allocation call, through the
    memory layer's stack-capture slot (``ignis.safety.frames`` fills it when ``ignis`` is
    imported); () if no walker is installed."""
    if _HK.capture == NULL:
        return ()
    return _HK.capture(1, depth)


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


cdef class State:
    """The framework allocators' state (one per process, ``state``); ``guard_front.reset``
    re-initializes it in place.

    ``guards``: device ordinal -> DeferredGuardResource; ``streams``: (device, handle) ->
    adopted Stream; ``blocks``: user pointer -> DeviceBlock of the live guarded blocks;
    ``rs_ptrs``: live blocks that ``record_stream`` named another stream for; ``tls.busy``:
    this thread is inside the allocator; ``deferred``: frees that arrived meanwhile.
    CUDA graphs (the PyTorch adapter's capture listener): ``capturing``: the streams capturing now, with the
    pool each allocates into; ``graph_blocks``: the graphs' memory, unguarded (its bytes are
    written by every replay, so it cannot hold poison or go to the quarantine, and stream
    work queued while capturing would be captured); freed, it stays its pool's
    (``graph_free``) for the pool's later allocations, never handed to anyone else;
    ``after_capture``: frees of guarded blocks of a capturing stream, done when it ends."""

    # Fields: see guard_alloc.pxd.

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

    # -- the writers (the fields are read-only from Python) ------------------------------
    def reset(self) -> None:
        """Everything forgotten, as new, but the PyTorch flag and the two maps the PyTorch
        adapter's compiled poison path holds (``blocks``, ``rs_ptrs``): the same objects,
        emptied, so it never reads a map the front no longer writes."""
        torch_on, blocks, rs = self.torch, self.blocks, self.rs_ptrs
        self.__init__()
        self.torch = torch_on
        blocks.clear()
        rs.clear()
        self.blocks, self.rs_ptrs = blocks, rs

    def configure(self, opts: dict) -> None:
        """The guard's options (checked by the front), and its tag from them."""
        self.opts = opts
        self.tag = opts["tag"] or "torch"

    def use_framework(self, name: str) -> None:
        """``name`` ("torch" or "cupy") allocates through the guard from now on."""
        if name == "torch":
            self.torch = True
        elif name == "cupy":
            self.cupy = True
        else:
            raise ValueError(f"unknown framework {name!r} (torch or cupy)")

    def bind(self, **slots: object) -> None:
        """Set the PyTorch adapter's slots by name: ``lib`` (its library of op overrides),
        ``current_stream`` ((device) -> the raw handle of the thread's current stream, or
        None) and ``graph_alloc`` ((device, size) -> a pointer for a graph, or None)."""
        for name in slots:
            if name not in ("lib", "current_stream", "graph_alloc"):
                raise TypeError(f"State.bind() got an unknown slot {name!r} (lib, current_stream, graph_alloc)")
        if "lib" in slots:
            self.lib = slots["lib"]
        if "current_stream" in slots:
            self.current_stream = slots["current_stream"]
        if "graph_alloc" in slots:
            self.graph_alloc = slots["graph_alloc"]

    def note_live_check(self, now: float) -> None:
        """A check of every live block ran at ``now`` (``time.monotonic()``)."""
        self.last_live = now

    def take_problems(self) -> list:
        """The problems found so far; forgotten here (with their groups)."""
        out = self.problems
        self.problems = []
        self.groups = {}
        return out

    def mark_atexit(self) -> None:
        """The exit check is registered."""
        self.atexit = True


state: State = State()
cdef State state_c = state

# The front's slow paths (``guard_front.guard_resource`` and ``guard_front.stream_for``), bound by ``setup``.
cdef object _make_guard = None
cdef object _make_stream = None


def setup(guard_resource: object, stream: object) -> None:
    """Bind the front end's slow paths: the guard of a device seen for the first time and
    the Ignis stream of a framework's stream handle seen for the first time."""
    global _make_guard, _make_stream
    _make_guard = guard_resource
    _make_stream = stream


def alloc(size: int, device: int, handle: int, tag: str | None = None, owner: object = None) -> int:
    """Allocate ``size`` guarded bytes on ``device`` for a framework's stream ``handle`` and
    return the user pointer (``owner``: the framework's stream object, kept alive with the
    adopted stream). Called by ``ignis_torch_alloc`` and by CuPy's allocator."""
    return alloc_c(size, device, handle, tag, owner)


cdef object alloc_c(object size, object device, object handle, object tag, object owner):
    global ignis_guard_busy
    cdef State st = state_c
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
        blk = g.allocate_c(size, s, tag or st.tag, _site(g.stack_depth) if g.capture_stacks else ())
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
            drain_deferred()


def free(ptr: int, size: int, device: int, handle: int, poisoned: bool = False) -> None:
    """Free the guarded block at ``ptr`` (``poisoned``: its poison is queued already).
    A pointer the guard did not hand out is ignored; a free that arrives while this thread
    is inside the allocator waits in ``state.deferred`` for the outer call's end."""
    free_c(ptr, size, device, handle, poisoned)


cdef object _graph_alloc(State st, object device, object pool, object size):
    """Memory of a CUDA graph's pool: a block its pool freed before, of the same size, or new."""
    spare = st.graph_free.get((device, pool))
    if spare:
        ptrs = spare.get(size)
        if ptrs:
            ptr = ptrs.pop()
            st.graph_blocks[ptr] = (device, pool, size)
            return ptr
    ptr = st.graph_alloc(device, size)
    st.graph_blocks[ptr] = (device, pool, size)
    return ptr


cdef int free_c(object ptr, object size, object device, object handle, object poisoned,
                 bint later=False) except -1:
    global ignis_guard_busy
    cdef State st = state_c
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
            drain_deferred()
    return 0


def graph_begin(device: int, stream: int, pool: object) -> None:
    """``stream`` of ``device`` starts capturing a CUDA graph that allocates into ``pool``."""
    state_c.capturing[(device, stream)] = pool


def graph_end(device: int, stream: int) -> None:
    """``stream``'s capture ended: the frees of guarded blocks that waited for it are done now."""
    if state_c.capturing.pop((device, stream), None) is None:
        return
    waiting = [f for f in state_c.after_capture if (f[2], f[3]) == (device, stream)]
    state_c.after_capture = [f for f in state_c.after_capture if (f[2], f[3]) != (device, stream)]
    for ptr, size, dev, handle, poisoned in waiting:
        free_c(ptr, size, dev, handle, poisoned)


def drain_deferred() -> None:
    """Run the frees deferred while this thread was inside the allocator."""
    while state_c.deferred:
        try:
            ptr, size, device, handle, poisoned = state_c.deferred.pop(0)
        except IndexError:
            return
        free_c(ptr, size, device, handle, poisoned)
