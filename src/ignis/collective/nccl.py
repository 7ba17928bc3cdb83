"""The CUDA engine: NCCL, through whichever Python bindings are present.

Design:
- ``load_bindings()`` picks, in order, NVIDIA's ``nccl4py``
  (``nccl.bindings.nccl``), the NCCL bindings that ship in CuPy
  (``cupy.cuda.nccl``), or ``libnccl.so.2`` itself through ``ctypes`` (the
  library the ``nvidia-nccl`` wheels install, which PyTorch also uses).
  ``IGNIS_NCCL_BINDINGS=nccl4py|cupy|ctypes`` forces one. All three are
  wrapped by the same small adapter interface over plain integers (device
  pointers, stream handles), so the engine does not know which is in use.
- Operations are enqueued on the communicator's stream and return at once;
  a group of calls is one ``ncclGroupStart``/``ncclGroupEnd``.
- Communicator init runs on a helper thread that the caller waits for with
  the time-out, watching for dead ranks, so a rank that never arrives gives
  a ``CollectiveTimeoutError`` rather than a hang.
- A watchdog thread (every 50 ms) checks ``ncclCommGetAsyncError`` and the
  progress of the stream: it records an event on the communicator's stream
  for the work enqueued since its last look (the hot path records nothing),
  and if that work has not finished ``timeout`` seconds after it was
  enqueued it fails the communicator. ``synchronize()`` and the next
  operation also ask ``ncclCommGetAsyncError`` themselves (``poll``;
  operations at most once a millisecond), so neither waits for the
  watchdog's next look. Errors name the oldest call not known to have
  finished (each call is kept, with what it writes, in ``_flight``).
- What real NCCL does when a peer fails: a kernel waiting for a peer that
  died, closed its communicator or called something else spins until the
  communicator is aborted, and everything queued behind it on its stream (or
  waiting on it from other streams) waits too; ``ncclCommAbort`` from the host
  is the only way out, and after it the communicator is unusable while the
  device context is fine. So any failure (the time-out, a dead or departed
  rank, a mismatch, an NCCL error, the stream's own failure) first poisons what
  the unfinished calls were to write (``Health``'s first hook), so that a later
  access raises ``CollectiveError`` instead of reading what the aborted kernels
  left behind, then tells the other ranks it gives up (a goodbye saying why on
  the checker mesh: their calls that wait for this rank fail at once, and their
  own aborts close the connections NCCL's abort here may wait for), then calls
  ``ncclCommAbort``. The abort runs on a thread of its
  own (it sets the abort flag first, so the kernels return at once, then may
  wait on peers and on the device while it frees the communicator), and a
  failure path waits for it at most ``_ABORT_WAIT`` seconds. A rank's own communicator is
  destroyed only when it is healthy; NCCL's destroy waits for the peers'
  connections to close, which a peer's abort does.
- Matching: NCCL compares nothing between ranks. A call matcher
  (``matching.OpMatcher``, over the ``checker`` mesh: the loopback transport's
  TCP connections, set up with the communicator) ships each call's descriptor
  (operation, dtype, count, root, reduction) to the other ranks in the
  background and compares, so an operation, size, dtype, reduction or root
  mismatch fails the communicator on every rank, naming the ranks and both
  calls, and a rank that closed its communicator without making a call this
  rank made fails that call at once. The calling thread pays one deque
  append; ``synchronize()`` compares what the others made before it (one
  round trip, ``confirm``). Rooted operations (broadcast, reduce) are checked
  before NCCL is called: the calling thread waits until every rank made the
  same calls up to them (one round trip), so a mismatched one never reaches
  NCCL (a broadcast meeting an all_reduce faults the context).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

try:  # compiled, this is Cython's (``cython.compiled`` a constant there); as plain Python, its
    import cython  # shadow module if installed (not required), else the package's stand-in
except ImportError:
    from .._cython_shim import cython

from ..memory.resource import ResourceLock
from .communicator import poison
from .errors import CollectiveError, CollectiveTimeoutError
from .matching import Gate, OpMatcher

if TYPE_CHECKING:
    from ..runtime import Device, Stream
    from .communicator import Health, _Op
    from .loopback import LoopbackEngine

__all__ = ["NcclEngine", "load_bindings", "FP8_MIN_VERSION"]

FP8_MIN_VERSION = 22400  # NCCL 2.24: ncclFloat8e4m3 / ncclFloat8e5m2
_WATCH_INTERVAL = 0.05
_POLL_EVERY = 0.001  # how often calls ask ncclCommGetAsyncError themselves (synchronize always does)
_ABORT_WAIT = 5.0    # how long a failure path waits for ncclCommAbort (it runs on a thread of its own)
_EXPLAIN_WAIT = 2.0  # how long a call NCCL refused waits for the peers' calls, to name a mismatch behind it
_ROOTED = frozenset({"broadcast", "reduce"})
_monotonic = time.monotonic


# -- bindings ------------------------------------------------------------------------
def _load_libnccl() -> ctypes.CDLL:
    """libnccl.so.2 from an nvidia-nccl wheel on sys.path, else the system's; loaded
    RTLD_GLOBAL so extension modules linked against it (CuPy's) find the same copy."""
    tried = []
    for base in sys.path:
        for path in sorted(glob.glob(os.path.join(base or ".", "nvidia", "nccl", "lib", "libnccl.so*"))):
            try:
                return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path}: {e}")
    for name in ("libnccl.so.2", "libnccl.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ImportError("libnccl.so.2 not found (" + "; ".join(tried[-3:]) + "); pip install nvidia-nccl-cu12 "
                      "(or -cu13), or ignis[nccl]")


class _Nccl4py:
    """NVIDIA's nccl4py (``nccl.bindings.nccl``)."""

    name = "nccl4py"

    def __init__(self) -> None:
        from nccl.bindings import nccl as nb  # type: ignore[import-not-found]
        for fn in ("get_unique_id", "comm_init_rank", "all_reduce", "group_start", "comm_abort"):
            if not hasattr(nb, fn):
                raise ImportError(f"nccl4py has no {fn} (unsupported version)")
        self.nb = nb
        self.version = int(nb.get_version())

    def unique_id(self) -> bytes:
        return bytes(self.nb.get_unique_id())

    def init_rank(self, n: int, uid: bytes, rank: int) -> Any:
        buf = bytearray(uid)
        return self.nb.comm_init_rank(n, self.nb.UniqueId.from_buffer(buf), rank)

    def all_reduce(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self.nb.all_reduce(s, r, n, dt, op, h, st)

    def reduce(self, h, s, r, n, dt, op, root, st):  # type: ignore[no-untyped-def]
        self.nb.reduce(s, r, n, dt, op, root, h, st)

    def broadcast(self, h, s, r, n, dt, root, st):  # type: ignore[no-untyped-def]
        self.nb.broadcast(s, r, n, dt, root, h, st)

    def all_gather(self, h, s, r, n, dt, st):  # type: ignore[no-untyped-def]
        self.nb.all_gather(s, r, n, dt, h, st)

    def reduce_scatter(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self.nb.reduce_scatter(s, r, n, dt, op, h, st)

    def send(self, h, s, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self.nb.send(s, n, dt, peer, h, st)

    def recv(self, h, r, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self.nb.recv(r, n, dt, peer, h, st)

    def group_start(self) -> None:
        self.nb.group_start()

    def group_end(self) -> None:
        self.nb.group_end()

    def abort(self, h: Any) -> None:
        self.nb.comm_abort(h)

    def destroy(self, h: Any) -> None:
        self.nb.comm_destroy(h)

    def async_error(self, h: Any) -> str | None:
        rc = int(self.nb.comm_get_async_error(h))
        return None if rc in (0, 7) else f"{self.nb.get_error_string(rc)} ({rc})"  # 7: ncclInProgress


class _Cupy:
    """The NCCL bindings in CuPy (``cupy.cuda.nccl``)."""

    name = "cupy"

    def __init__(self) -> None:
        try:
            _load_libnccl()  # so CuPy's extension finds the wheel's libnccl
        except ImportError:
            pass
        try:
            from cupy.cuda import nccl  # type: ignore[import-not-found]
        except ImportError:
            from cupy_backends.cuda.libs import nccl  # type: ignore[import-not-found,no-redef]
        if not getattr(nccl, "available", True):
            raise ImportError("cupy.cuda.nccl is present but NCCL is not available")
        import cupy  # type: ignore[import-not-found]
        self.cupy = cupy
        self.m = nccl
        self.version = int(nccl.get_version())

    def unique_id(self) -> bytes:
        uid = self.m.get_unique_id()  # bytes (CuPy 14) or a tuple of C chars (before)
        return bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes(b & 0xFF for b in uid)

    def init_rank(self, n: int, uid: bytes, rank: int) -> Any:
        try:
            return self.m.NcclCommunicator(n, uid, rank)
        except TypeError:  # CuPy before 14 takes the id as a tuple of C chars
            return self.m.NcclCommunicator(n, tuple(b - 256 if b > 127 else b for b in uid), rank)

    def set_device(self, ordinal: int) -> None:
        self.cupy.cuda.Device(ordinal).use()

    def all_reduce(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        h.allReduce(s, r, n, dt, op, st)

    def reduce(self, h, s, r, n, dt, op, root, st):  # type: ignore[no-untyped-def]
        h.reduce(s, r, n, dt, op, root, st)

    def broadcast(self, h, s, r, n, dt, root, st):  # type: ignore[no-untyped-def]
        h.broadcast(s, r, n, dt, root, st)

    def all_gather(self, h, s, r, n, dt, st):  # type: ignore[no-untyped-def]
        h.allGather(s, r, n, dt, st)

    def reduce_scatter(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        h.reduceScatter(s, r, n, dt, op, st)

    def send(self, h, s, n, dt, peer, st):  # type: ignore[no-untyped-def]
        h.send(s, n, dt, peer, st)

    def recv(self, h, r, n, dt, peer, st):  # type: ignore[no-untyped-def]
        h.recv(r, n, dt, peer, st)

    def group_start(self) -> None:
        self.m.groupStart()

    def group_end(self) -> None:
        self.m.groupEnd()

    def abort(self, h: Any) -> None:
        h.abort()

    def destroy(self, h: Any) -> None:
        h.destroy()

    def async_error(self, h: Any) -> str | None:
        try:
            h.check_async_error()
        except Exception as e:  # cupy.cuda.nccl.NcclError
            return str(e)
        return None


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class _Ctypes:
    """``libnccl.so.2`` through ctypes (calls drop the GIL)."""

    name = "ctypes"

    def __init__(self) -> None:
        lib = _load_libnccl()
        P, I, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        sig = {
            "ncclGetVersion": [ctypes.POINTER(I)],
            "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(P), I, _UniqueId, I],
            "ncclAllReduce": [P, P, Z, I, I, P, P],
            "ncclReduce": [P, P, Z, I, I, I, P, P],
            "ncclBroadcast": [P, P, Z, I, I, P, P],
            "ncclAllGather": [P, P, Z, I, P, P],
            "ncclReduceScatter": [P, P, Z, I, I, P, P],
            "ncclSend": [P, Z, I, I, P, P],
            "ncclRecv": [P, Z, I, I, P, P],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
            "ncclCommAbort": [P],
            "ncclCommDestroy": [P],
            "ncclCommGetAsyncError": [P, ctypes.POINTER(I)],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = I
        lib.ncclGetErrorString.argtypes = [I]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        self.lib = lib
        v = I()
        self._check(lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        self.version = v.value

    def _check(self, rc: int, call: str) -> None:
        if rc not in (0, 7):  # ncclSuccess, ncclInProgress
            raise RuntimeError(f"{call} failed: {self.lib.ncclGetErrorString(rc).decode()} ({rc})")

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), 128)

    def init_rank(self, n: int, uid: bytes, rank: int) -> Any:
        u = _UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, 128)
        comm = ctypes.c_void_p()
        self._check(self.lib.ncclCommInitRank(ctypes.byref(comm), n, u, rank), "ncclCommInitRank")
        return comm

    def all_reduce(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclAllReduce(s, r, n, dt, op, h, st), "ncclAllReduce")

    def reduce(self, h, s, r, n, dt, op, root, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclReduce(s, r, n, dt, op, root, h, st), "ncclReduce")

    def broadcast(self, h, s, r, n, dt, root, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclBroadcast(s, r, n, dt, root, h, st), "ncclBroadcast")

    def all_gather(self, h, s, r, n, dt, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclAllGather(s, r, n, dt, h, st), "ncclAllGather")

    def reduce_scatter(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclReduceScatter(s, r, n, dt, op, h, st), "ncclReduceScatter")

    def send(self, h, s, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclSend(s, n, dt, peer, h, st), "ncclSend")

    def recv(self, h, r, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self._check(self.lib.ncclRecv(r, n, dt, peer, h, st), "ncclRecv")

    def group_start(self) -> None:
        self._check(self.lib.ncclGroupStart(), "ncclGroupStart")

    def group_end(self) -> None:
        self._check(self.lib.ncclGroupEnd(), "ncclGroupEnd")

    def abort(self, h: Any) -> None:
        self.lib.ncclCommAbort(h)

    def destroy(self, h: Any) -> None:
        self.lib.ncclCommDestroy(h)

    def async_error(self, h: Any) -> str | None:
        rc = ctypes.c_int()
        self.lib.ncclCommGetAsyncError(h, ctypes.byref(rc))
        if rc.value in (0, 7):
            return None
        return f"{self.lib.ncclGetErrorString(rc.value).decode()} ({rc.value})"


_BINDINGS = {"nccl4py": _Nccl4py, "cupy": _Cupy, "ctypes": _Ctypes}
_loaded: list[Any] = []


def load_bindings() -> Any:
    """The NCCL bindings to use (cached): nccl4py, else CuPy's, else ctypes."""
    if _loaded:
        return _loaded[0]
    forced = os.environ.get("IGNIS_NCCL_BINDINGS", "").strip().lower()
    if forced and forced not in _BINDINGS:
        raise ValueError(f"IGNIS_NCCL_BINDINGS={forced!r} is not valid; use one of {', '.join(_BINDINGS)}")
    names = [forced] if forced else list(_BINDINGS)
    why = []
    for name in names:
        try:
            api = _BINDINGS[name]()
        except Exception as e:  # ImportError, or a library that fails to load
            why.append(f"{name}: {type(e).__name__}: {e}")
            continue
        _loaded.append(api)
        return api
    raise CollectiveError("no NCCL bindings could be loaded (" + "; ".join(why) + "); install nccl4py "
                          "(pip install ignis[nccl]) or CuPy, or use IGNIS_BACKEND=emulated", kind="init")


def _enqueue(api: Any, h: Any, op: "_Op", st: int) -> int:
    """Call NCCL for ``op`` on the stream handle ``st`` (``op.red``: the reduction's code)."""
    name, dt, n = op.name, op.plan.nccl_dtype, op.count
    if name == "all_reduce":
        api.all_reduce(h, op.send_ptr, op.recv_ptr, n, dt, op.red, st)
    elif name == "broadcast":
        api.broadcast(h, op.send_ptr, op.recv_ptr, n, dt, op.root, st)
    elif name == "reduce":
        api.reduce(h, op.send_ptr, op.recv_ptr, n, dt, op.red, op.root, st)
    elif name == "all_gather":
        api.all_gather(h, op.send_ptr, op.recv_ptr, n, dt, st)
    elif name == "reduce_scatter":
        api.reduce_scatter(h, op.send_ptr, op.recv_ptr, n, dt, op.red, st)
    elif name == "send":
        api.send(h, op.send_ptr, n, dt, op.root, st)
    elif name == "recv":
        api.recv(h, op.recv_ptr, n, dt, op.root, st)
    else:  # pragma: no cover
        raise AssertionError(name)
    return 0


# -- the engine ------------------------------------------------------------------
class NcclEngine:
    """One rank's NCCL communicator, its enqueue path, its watchdog and its call matcher.

    Compiled, an extension type (nccl.pxd): every attribute it has is declared there."""

    name = "nccl"

    def __init__(self, api: Any, rank: int, world_size: int, device: "Device", health: "Health",
                 timeout: float, checker: "LoopbackEngine | None" = None) -> None:
        self.api = api
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.health = health
        self.timeout = timeout
        self.checker = checker if world_size > 1 else None
        self.matcher = (OpMatcher(self.checker, rank, world_size, health, timeout, self._unfinished)
                        if self.checker is not None else None)
        self._match = self.matcher.log.append if self.matcher is not None else None  # the hot path's one append
        self.handle: Any = None
        self.fp8 = api.version >= FP8_MIN_VERSION
        # The engine's lock: the hot path takes it as C (lock_take / lock_give) where compiled;
        # the watchdog, the poll and the abort take it with ``with``, as a threading.Lock.
        self._lock = ResourceLock()
        self._unwatched_at = 0.0  # when the first call since the watchdog's last look was enqueued (0: none)
        self._aborted = False
        self._abort_done: threading.Event | None = None
        self._polled = 0.0
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._stream: "Stream | None" = None
        # (event, enqueued at, last ticket before the record): the watchdog's
        self._pending: deque[tuple[int, float, int]] = deque()
        self.issued = 0  # calls enqueued (their tickets are 1..issued)
        self._done = 0   # every call with a ticket <= _done has finished
        self._flight: deque[tuple[int, Any, tuple]] = deque()  # (ticket, first _Op, targets) of calls not known finished
        self._retire_lock = threading.Lock()
        # The first failure poisons, lets the gates go, aborts, and only then is published:
        # whoever sees it sees the poison and the abort.
        health.add_hook(self._poison_in_flight, first=True)
        if self.matcher is not None:
            health.add_hook(self.matcher.release_gates, first=True)
        health.add_hook(self._on_failure, first=True)
        health.oldest = self._oldest

    def _oldest(self) -> str | None:
        """The oldest call not known to have finished (asked from other threads: best effort)."""
        done = self._done
        backend = self.device.backend
        try:
            for ev, _, upto in list(self._pending):
                if not backend.event_query(ev):
                    break
                done = max(done, upto)
        except Exception:  # the watchdog recycled an event meanwhile, or the context broke
            pass
        while True:
            try:
                flight = list(self._flight)
                break
            except RuntimeError:  # changed while copied
                continue
        for ticket, op, _ in flight:
            if ticket > done:
                return op.label
        return None

    def confirm(self, timeout: float) -> None:
        """After the stream finished (``synchronize()``): wait until the other ranks' descriptors
        show they made the same calls (at most ``timeout`` seconds); a mismatch fails the
        communicator."""
        if self.matcher is not None:
            self.matcher.confirm(timeout)

    def _unfinished(self) -> str | None:
        """The oldest call not finished, after asking the watchdog's events and the stream itself."""
        self._refresh()
        return self._oldest()

    # -- calls in flight -------------------------------------------------------------
    def finished(self, upto: int) -> None:
        """Every call with a ticket up to ``upto`` has finished: forget it."""
        with self._retire_lock:
            if upto > self._done:
                self._done = upto
            flight = self._flight
            while flight and flight[0][0] <= upto:
                flight.popleft()

    def _refresh(self) -> None:
        """Learn which calls finished from the watchdog's events and, for the calls since its
        last look, from the stream itself (idle: all of them)."""
        backend = self.device.backend
        try:
            for ev, _, upto in list(self._pending):
                if not backend.event_query(ev):
                    break
                self.finished(upto)
            if self._flight and self._stream is not None:
                upto = self.issued
                backend.set_current(self.device.ordinal)  # the driver context NCCL needs
                if backend.stream_query(self._stream.handle):
                    self.finished(upto)
        except Exception:  # a broken context, or an event recycled meanwhile: keep the rest
            pass

    def _poison_in_flight(self, err: CollectiveError) -> None:
        """The first failure (before it is published, before the abort): poison what every call
        not known to have finished was to write. The watchdog's events and the stream are
        asked first, so calls that finished are spared (a peer that
        exits right after the last call must not poison results that are complete)."""
        self._refresh()
        while True:
            try:
                flight = list(self._flight)
                break
            except RuntimeError:  # changed while copied
                continue
        done = self._done
        for ticket, _, targets in flight:
            if ticket > done and targets:
                poison(targets, err, self.rank)

    def poll(self, force: bool = False) -> None:
        """Ask NCCL for an asynchronous error (a peer failed, a network error); fail on one.
        Calls (not ``force``) ask at most every ``_POLL_EVERY`` s: back-to-back calls cost a
        clock read, and the watchdog asks every 50 ms anyway."""
        now = _monotonic()
        if not force and now - self._polled < _POLL_EVERY:
            return
        self._polled = now
        with self._lock:  # never on a handle that an abort has freed
            if self._aborted or self.handle is None:
                return
            err = self.api.async_error(self.handle)
        if err:
            self.health.fail(CollectiveError(f"NCCL reported an asynchronous error: {err}", op=self._oldest(),
                                             this_rank=self.rank, kind="nccl"))

    @property
    def bindings(self) -> str:
        """Which NCCL bindings are in use: ``"nccl4py"``, ``"cupy"`` or ``"ctypes"``."""
        return self.api.name

    def init(self, uid: bytes, stream: "Stream") -> None:
        """ncclCommInitRank, bounded by the time-out and by dead-rank reports; then the
        watchdog and the call matcher start."""
        self._stream = stream
        out: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                self.device.backend.set_current(self.device.ordinal)  # the driver context NCCL needs
                if hasattr(self.api, "set_device"):
                    self.api.set_device(self.device.ordinal)
                out["h"] = self.api.init_rank(self.world_size, uid, self.rank)
            except BaseException as e:  # reported to the caller below
                out["e"] = e
            done.set()

        threading.Thread(target=work, daemon=True, name="ignis-nccl-init").start()
        deadline = time.monotonic() + self.timeout
        while not done.wait(_WATCH_INTERVAL):
            err = self.health.error
            if err is not None:
                raise CollectiveError(f"NCCL communicator init stopped: {err.detail}", op="init_process_group",
                                      rank=err.rank, this_rank=self.rank, kind="init")
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(
                    f"ncclCommInitRank did not finish within {self.timeout:g} s (some rank did not call it, or "
                    "cannot reach this one)", op="init_process_group", this_rank=self.rank, kind="timeout")
        if "e" in out:
            e = out["e"]
            raise CollectiveError(f"ncclCommInitRank failed ({self.api.name} bindings): {type(e).__name__}: {e}",
                                  op="init_process_group", this_rank=self.rank, kind="nccl") from e
        self.handle = out["h"]
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name=f"ignis-nccl-watchdog-{self.rank}")
        self._watchdog.start()
        if self.matcher is not None:
            self.matcher.start()

    # -- enqueue ---------------------------------------------------------------------
    def run(self, ops: "list[_Op] | tuple[_Op, ...]", stream: "Stream", targets: tuple = ()) -> None:
        """Enqueue ``ops`` on ``stream`` (several: one NCCL group); ``targets`` (``(weakref, _Op)``:
        what they write) are kept until the call is known finished, and poisoned if it fails.
        Rooted operations are called once the ranks agree on them (the calling thread waits)."""
        api, h, st = self.api, self.handle, stream.handle
        grouped = len(ops) > 1
        match = self._match
        if match is not None:
            gate = None
            for op in ops:
                if op.name in _ROOTED:
                    gate = Gate(self.matcher, self.issued + 1)  # type: ignore[arg-type]
                    break
            # Logged before NCCL is called: a call that blocks in NCCL (its connections to a peer that
            # never makes the matching call are set up there) is still compared, and a mismatch
            # aborts NCCL, which lets it return.
            match((ops, gate, targets))
            if gate is not None:
                # A rooted call the ranks disagree on must never reach NCCL: its kernel would meet
                # the peer's other kernel, and a broadcast against an all_reduce faults the context
                # (CUDA_ERROR_ILLEGAL_ADDRESS on two H200s, NCCL 2.28), before any abort can help.
                # Queued behind a host function, it would run once the failure let the function
                # return; so the check is made here, before NCCL is called: one round trip.
                self.matcher.wake()  # type: ignore[union-attr]
                self.matcher.wait_agreed(gate)  # type: ignore[union-attr]
                if self.health.claimed is not None:
                    raise self.health.report(ops[0].label)
        try:
            if grouped:
                api.group_start()
            try:
                for op in ops:
                    _enqueue(api, h, op, st)
            finally:
                if grouped:
                    api.group_end()
        except CollectiveError:
            raise
        except Exception as e:
            if self.matcher is not None and self.health.claimed is None:
                # NCCL may refuse a call because the peer's half differs (a send/recv of other
                # sizes: an internal error at the connection): the calls, logged before NCCL
                # was called, are compared now (one round trip), so a mismatch is named as one.
                self.matcher.settle(_EXPLAIN_WAIT)
            claimed = self.health.claimed
            if claimed is not None and claimed.kind == "mismatch":
                raise self.health.report(ops[0].label) from e
            raise CollectiveError(f"NCCL ({self.api.name} bindings) refused it: {e}", op=ops[0].label,
                                  this_rank=self.rank, kind="nccl") from e
        # Compiled, the lock is taken as C (one atomic operation, no Python call); as plain
        # Python, as a threading.Lock.
        lock = self._lock
        if cython.compiled:
            lock_take(lock)  # type: ignore[name-defined]  # (cimported in nccl.pxd)
        else:
            lock.acquire()
        try:
            ticket = self.issued = self.issued + 1
            self._flight.append((ticket, ops[0], targets))
            if not self._unwatched_at:
                self._unwatched_at = _monotonic()
        finally:
            if cython.compiled:
                lock_give(lock)  # type: ignore[name-defined]
            else:
                lock.release()
        if targets:
            claimed = self.health.claimed
            if claimed is not None:  # the first failure's hooks may have missed this call
                poison(targets, claimed, self.rank)


    # -- watchdog --------------------------------------------------------------------
    def _watch(self) -> None:
        backend = self.device.backend
        ordinal = self.device.ordinal
        stream = self._stream
        assert stream is not None
        pending = self._pending
        free: list[int] = []
        try:
            self.device.backend.set_current(self.device.ordinal)  # the driver context NCCL needs
            while not self._stop.wait(_WATCH_INTERVAL):
                if self.health.error is not None:
                    return
                with self._lock:
                    err = None if self._aborted else self.api.async_error(self.handle)
                if err:
                    self.health.fail(CollectiveError(f"NCCL reported an asynchronous error: {err}",
                                                     op=self._oldest(), this_rank=self.rank, kind="nccl"))
                    return
                with self._lock:
                    since, self._unwatched_at = self._unwatched_at, 0.0
                    upto = self.issued
                if since:
                    ev = free.pop() if free else backend.event_create(ordinal, False)
                    backend.event_record(ev, stream.handle)
                    pending.append((ev, since, upto))
                while pending and backend.event_query(pending[0][0]):
                    ev, _, upto = pending.popleft()
                    free.append(ev)
                    self.finished(upto)
                if pending and time.monotonic() - pending[0][1] > self.timeout:
                    self.health.fail(CollectiveTimeoutError(
                        f"the operation did not finish within {self.timeout:g} s (the time-out): a peer is stuck "
                        "or dead, or the ranks called different operations; the NCCL communicator was aborted",
                        op=self._oldest(), this_rank=self.rank, kind="timeout"))
                    return
        except Exception as e:  # the driver or NCCL broke under us (the stream failed, ...)
            if not self._stop.is_set():
                err = CollectiveError(f"the communicator's stream or NCCL failed (seen by the watchdog): "
                                      f"{type(e).__name__}: {e}", op=self._oldest(), this_rank=self.rank,
                                      kind="stream")
                err.__cause__ = e
                self.health.fail(err)
        finally:
            for ev, _, _ in pending:
                free.append(ev)
            for ev in free:
                try:
                    backend.event_destroy(ev)
                except Exception:
                    pass

    def _on_failure(self, err: BaseException) -> None:
        """The first failure, after the poison: tell the other ranks that this one gives up (its last
        descriptors, then a goodbye saying why, on the checker mesh), so they fail at once instead of
        at their time-out, and abort NCCL. The goodbye goes first: NCCL's abort can wait until the
        peers' connections close, which their own aborts do."""
        if self.matcher is not None:
            self.matcher.flush()
        if self.checker is not None:
            self.checker.abort(getattr(err, "message", None) or str(err))
        self._abort()

    def _abort(self, wait: bool = True) -> None:
        """``ncclCommAbort``, once, on a thread of its own: it sets NCCL's abort flag first (the
        stuck kernels return), then frees the communicator, which can wait on peers and on the
        device. Callers wait for it at most ``_ABORT_WAIT`` seconds (``wait``), so no failure
        path hangs on it."""
        with self._lock:
            if self._aborted or self.handle is None:
                self._aborted = True
                return
            self._aborted = True
            done = self._abort_done = threading.Event()
        api, handle, backend, ordinal = self.api, self.handle, self.device.backend, self.device.ordinal

        def work() -> None:
            try:
                backend.set_current(ordinal)  # the driver context NCCL needs
                api.abort(handle)
            except Exception:
                pass
            finally:
                done.set()

        threading.Thread(target=work, daemon=True, name=f"ignis-nccl-abort-{self.rank}").start()
        if wait:
            done.wait(_ABORT_WAIT)

    # -- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        """Stop the watchdog and the matcher (its last descriptors shipped), say goodbye on the
        checker mesh, and destroy the communicator (abort it after a failure)."""
        self._stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(1.0)
        if self.matcher is not None:
            self.matcher.close()
        if self.health.claimed is not None:
            self._abort()
            if self.checker is not None:
                self.checker.abort()
            return
        if self.checker is not None:
            self.checker.close()
        with self._lock:
            if self._aborted or self.handle is None:
                return
            self._aborted = True
        try:
            self.api.destroy(self.handle)
        except Exception:
            pass

    def abort(self) -> None:
        """Stop the watchdog and the matcher, abort the NCCL communicator (``ncclCommAbort``, once;
        its errors are ignored), and tell the checker mesh why."""
        self._stop.set()
        if self.matcher is not None:
            self.matcher.close()
        self._abort()
        if self.checker is not None:
            self.checker.abort()
