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
  enqueued it fails the communicator. Any failure (this, a dead rank reported
  by the rendezvous, an NCCL error, the stream's own failure) calls
  ``ncclCommAbort``, which makes the stuck kernels return; the next operation
  or ``synchronize()`` raises the ``CollectiveError``. ``synchronize()`` and
  the next operation also ask ``ncclCommGetAsyncError`` themselves (``poll``;
  operations at most once a millisecond), so neither waits for the
  watchdog's next look.
- Stale data: the engine keeps, per enqueued call, weak references to the
  arrays it writes (``_flight``), until the watchdog's event (or a
  ``synchronize()``) shows the call finished. The first failure poisons all
  of them (``Health``'s first hook) *before* ``ncclCommAbort`` lets the
  stuck kernels return, so a later access raises ``CollectiveError`` instead
  of reading what the aborted kernels left behind.
- Roots: NCCL does not compare the arguments of the ranks; ranks that name
  different roots corrupt its buffers or hang. So every call with a rooted
  operation (broadcast, reduce) first queues a host function on the stream
  that exchanges the operations' headers (operation, dtype, count, root,
  reduction) with every other rank over the loopback mesh (``checker``, a
  small TCP side channel set up with the communicator): the NCCL kernels run
  only once all ranks agree. A mismatch poisons the call's targets and fails
  the communicator on every rank, naming the ranks and both roots; the abort
  is then left to the watchdog (no CUDA call may come from a host function).
  The caller never waits: the exchange costs the stream one round trip on
  rooted operations only.
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

from .communicator import poison
from .errors import CollectiveError, CollectiveTimeoutError

if TYPE_CHECKING:
    from ..runtime import Device, Stream
    from .communicator import Health, _Op
    from .loopback import LoopbackEngine

__all__ = ["NcclEngine", "load_bindings", "FP8_MIN_VERSION"]

FP8_MIN_VERSION = 22400  # NCCL 2.24: ncclFloat8e4m3 / ncclFloat8e5m2
_WATCH_INTERVAL = 0.05
_POLL_EVERY = 0.001  # how often calls ask ncclCommGetAsyncError themselves (synchronize always does)
_ROOTED = frozenset({"broadcast", "reduce"})
_monotonic = time.monotonic
_in_host_fn = threading.local()  # set while a root check runs on the driver's host-function thread


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


# -- the engine ------------------------------------------------------------------
class NcclEngine:
    """One rank's NCCL communicator, its enqueue path and its watchdog."""

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
        self.handle: Any = None
        self.fp8 = api.version >= FP8_MIN_VERSION
        self._lock = threading.Lock()
        self._first_unwatched: tuple[float, Any] | None = None
        self._aborted = False
        self._abort_deferred = False
        self._polled = 0.0
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._stream: "Stream | None" = None
        # (event, enqueued at, first _Op, last ticket before the record): the watchdog's
        self._pending: deque[tuple[int, float, Any, int]] = deque()
        self.issued = 0  # calls enqueued (their tickets are 1..issued)
        self._done = 0   # every call with a ticket <= _done has finished
        self._flight: deque[tuple[int, tuple]] = deque()  # (ticket, targets) of calls that write arrays
        self._retire_lock = threading.Lock()
        health.add_hook(self._poison_in_flight, first=True)
        health.add_hook(self._on_failure)
        health.oldest = self._oldest

    def _oldest(self) -> str | None:
        """The oldest call not finished yet (asked from other threads: best effort)."""
        backend = self.device.backend
        try:
            for ev, _, op, _ in list(self._pending):
                if not backend.event_query(ev):
                    return op.label
        except Exception:  # the watchdog recycled an event meanwhile, or the context broke
            pass
        first = self._first_unwatched
        return first[1].label if first is not None else None

    # -- calls in flight -------------------------------------------------------------
    def finished(self, upto: int) -> None:
        """Every call with a ticket up to ``upto`` has finished: forget its targets."""
        with self._retire_lock:
            if upto > self._done:
                self._done = upto
            flight = self._flight
            while flight and flight[0][0] <= upto:
                flight.popleft()

    def _poison_in_flight(self, err: CollectiveError) -> None:
        """The first failure (before it is published, before the abort): poison what every call
        not known to have finished was to write. Off the host-function thread, the watchdog's
        events are asked first, so calls that finished are spared."""
        if not getattr(_in_host_fn, "on", False):
            backend = self.device.backend
            try:
                for ev, _, _, upto in list(self._pending):
                    if not backend.event_query(ev):
                        break
                    self.finished(upto)
                if self._flight and self._stream is not None:
                    # Calls since the watchdog's last look (a peer that exits right after the
                    # last call must not poison results that are complete): is the stream idle?
                    upto = self.issued
                    self.device.backend.set_current(self.device.ordinal)  # the driver context NCCL needs
                    if backend.stream_query(self._stream.handle):
                        self.finished(upto)
            except Exception:  # a broken context, or an event recycled meanwhile: keep the rest
                pass
        while True:
            try:
                flight = list(self._flight)
                break
            except RuntimeError:  # changed while copied
                continue
        done = self._done
        for ticket, targets in flight:
            if ticket > done:
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
        """ncclCommInitRank, bounded by the time-out and by dead-rank reports."""
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

    # -- enqueue ---------------------------------------------------------------------
    def run(self, ops: "list[_Op] | tuple[_Op, ...]", stream: "Stream", targets: tuple = ()) -> None:
        """Enqueue ``ops`` on ``stream`` (several: one NCCL group); ``targets`` (``(weakref, _Op)``:
        what they write) are kept until the call is known finished, and poisoned if it fails."""
        api, h, st = self.api, self.handle, stream.handle
        grouped = len(ops) > 1
        if self.checker is not None:
            rooted = [op for op in ops if op.name in _ROOTED] if grouped else (ops if ops[0].name in _ROOTED else ())
            if rooted:
                stream.launch_host_func(_RootCheck(self, tuple(rooted), self.issued + 1))
        try:
            if grouped:
                api.group_start()
            try:
                for op in ops:
                    self._call(api, h, op, st)
            finally:
                if grouped:
                    api.group_end()
        except CollectiveError:
            raise
        except Exception as e:
            raise CollectiveError(f"NCCL ({self.api.name} bindings) refused it: {e}", op=ops[0].label,
                                  this_rank=self.rank, kind="nccl") from e
        with self._lock:
            ticket = self.issued = self.issued + 1
            if targets:
                self._flight.append((ticket, targets))
            if self._first_unwatched is None:
                self._first_unwatched = (time.monotonic(), ops[0])
        if targets:
            claimed = self.health.claimed
            if claimed is not None:  # the first failure's hooks may have missed this call
                poison(targets, claimed, self.rank)

    @staticmethod
    def _call(api: Any, h: Any, op: "_Op", st: int) -> None:
        name, dt, n = op.name, op.plan.nccl_dtype, op.count
        if name == "all_reduce":
            api.all_reduce(h, op.send_ptr, op.recv_ptr, n, dt, op.op.value, st)
        elif name == "broadcast":
            api.broadcast(h, op.send_ptr, op.recv_ptr, n, dt, op.root, st)
        elif name == "reduce":
            api.reduce(h, op.send_ptr, op.recv_ptr, n, dt, op.op.value, op.root, st)
        elif name == "all_gather":
            api.all_gather(h, op.send_ptr, op.recv_ptr, n, dt, st)
        elif name == "reduce_scatter":
            api.reduce_scatter(h, op.send_ptr, op.recv_ptr, n, dt, op.op.value, st)
        elif name == "send":
            api.send(h, op.send_ptr, n, dt, op.root, st)
        elif name == "recv":
            api.recv(h, op.recv_ptr, n, dt, op.root, st)
        else:  # pragma: no cover
            raise AssertionError(name)

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
                    if self._abort_deferred:  # failed on the host-function thread, which may not abort
                        self._abort()
                    return
                oldest = pending[0][2].label if pending else None
                with self._lock:
                    err = None if self._aborted else self.api.async_error(self.handle)
                if err:
                    self.health.fail(CollectiveError(f"NCCL reported an asynchronous error: {err}", op=oldest,
                                                     this_rank=self.rank, kind="nccl"))
                    return
                with self._lock:
                    first, self._first_unwatched = self._first_unwatched, None
                    upto = self.issued
                if first is not None:
                    ev = free.pop() if free else backend.event_create(ordinal, False)
                    backend.event_record(ev, stream.handle)
                    pending.append((ev, first[0], first[1], upto))
                while pending and backend.event_query(pending[0][0]):
                    ev, _, _, upto = pending.popleft()
                    free.append(ev)
                    self.finished(upto)
                if pending and time.monotonic() - pending[0][1] > self.timeout:
                    self.health.fail(CollectiveTimeoutError(
                        f"the operation did not finish within {self.timeout:g} s (the time-out): a peer is stuck "
                        "or dead, or the ranks called different operations; the NCCL communicator was aborted",
                        op=pending[0][2].label, this_rank=self.rank, kind="timeout"))
                    return
        except Exception as e:  # the driver or NCCL broke under us (the stream failed, ...)
            if not self._stop.is_set():
                err = CollectiveError(f"the communicator's stream or NCCL failed (seen by the watchdog): "
                                      f"{type(e).__name__}: {e}", op=pending[0][2].label if pending else None,
                                      this_rank=self.rank, kind="stream")
                err.__cause__ = e
                self.health.fail(err)
        finally:
            if self._abort_deferred:  # the failure came from the host-function thread meanwhile
                self._abort()
            for ev, _, _, _ in pending:
                free.append(ev)
            for ev in free:
                try:
                    backend.event_destroy(ev)
                except Exception:
                    pass

    def _on_failure(self, err: BaseException) -> None:
        if getattr(_in_host_fn, "on", False):
            self._abort_deferred = True  # no CUDA call from here: the watchdog aborts
            return
        self._abort()

    def _abort(self) -> None:
        with self._lock:
            if self._aborted or self.handle is None:
                self._aborted = True
                return
            self._aborted = True
        try:
            self.api.abort(self.handle)
        except Exception:
            pass

    # -- shutdown --------------------------------------------------------------------
    def close(self) -> None:
        """Stop the watchdog and destroy the communicator (abort it after a failure)."""
        self._stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(1.0)
        if self.health.error is not None:
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
        """Stop the watchdog and abort the NCCL communicator (``ncclCommAbort``, once; its
        errors are ignored), and the checker mesh if any."""
        self._stop.set()
        self._abort()
        if self.checker is not None:
            self.checker.abort()


class _RootCheck:
    """A host function queued before a call with rooted operations: the ranks exchange the
    operations' headers over the checker mesh and compare them (roots included) before the
    NCCL kernels may run. Everything queued earlier on the stream has finished when it runs."""

    __slots__ = ("engine", "ops", "ticket")

    def __init__(self, engine: NcclEngine, ops: tuple, ticket: int) -> None:
        self.engine = engine
        self.ops = ops
        self.ticket = ticket

    def __call__(self) -> None:
        eng = self.engine
        _in_host_fn.on = True
        try:
            eng.finished(self.ticket - 1)
            checker = eng.checker
            assert checker is not None
            deadline = time.monotonic() + eng.timeout
            for op in self.ops:
                checker.agree(op.header(), f"k{op.seq}", op.label, deadline)
        except BaseException as e:
            if isinstance(e, CollectiveError):
                err = e
            else:
                err = CollectiveError(f"root check: {type(e).__name__}: {e}", op=self.ops[0].label,
                                      this_rank=eng.rank, kind="error")
                err.__cause__ = e
            eng.health.fail(err)  # poisons what is queued; the watchdog aborts
            if err is e:
                raise
            raise err from e
        finally:
            _in_host_fn.on = False

    def __repr__(self) -> str:
        return f"ignis.collective.nccl[rank {self.engine.rank}] root check"
