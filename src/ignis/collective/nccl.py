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
  by the rendezvous, an NCCL error) calls ``ncclCommAbort``, which makes the
  stuck kernels return; the next operation or ``synchronize()`` raises the
  ``CollectiveError``.
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

from .errors import CollectiveError, CollectiveTimeoutError

if TYPE_CHECKING:
    from ..runtime import Device, Stream
    from .communicator import Health, _Op

__all__ = ["NcclEngine", "load_bindings", "FP8_MIN_VERSION"]

FP8_MIN_VERSION = 22400  # NCCL 2.24: ncclFloat8e4m3 / ncclFloat8e5m2
_WATCH_INTERVAL = 0.05


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
                 timeout: float) -> None:
        self.api = api
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.health = health
        self.timeout = timeout
        self.handle: Any = None
        self.fp8 = api.version >= FP8_MIN_VERSION
        self._lock = threading.Lock()
        self._first_unwatched: tuple[float, Any] | None = None
        self._aborted = False
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._stream: "Stream | None" = None
        self._pending: deque[tuple[int, float, Any]] = deque()  # (event, enqueued at, first _Op): the watchdog's
        health.add_hook(self._on_failure)
        health.oldest = self._oldest

    def _oldest(self) -> str | None:
        """The oldest call not finished yet (asked from other threads: best effort)."""
        backend = self.device.backend
        try:
            for ev, _, op in list(self._pending):
                if not backend.event_query(ev):
                    return op.label
        except Exception:  # the watchdog recycled an event meanwhile, or the context broke
            pass
        first = self._first_unwatched
        return first[1].label if first is not None else None

    @property
    def bindings(self) -> str:
        return self.api.name

    def init(self, uid: bytes, stream: "Stream") -> None:
        """ncclCommInitRank, bounded by the time-out and by dead-rank reports."""
        self._stream = stream
        out: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                self.device.set_current()
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
    def run(self, ops: "list[_Op]", stream: "Stream") -> None:
        """Enqueue ``ops`` on ``stream`` (several: one NCCL group)."""
        api, h, st = self.api, self.handle, stream.handle
        grouped = len(ops) > 1
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
            if self._first_unwatched is None:
                self._first_unwatched = (time.monotonic(), ops[0])

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
            self.device.set_current()
            while not self._stop.wait(_WATCH_INTERVAL):
                if self.health.error is not None:
                    return
                oldest = pending[0][2].label if pending else None
                err = self.api.async_error(self.handle)
                if err:
                    self.health.fail(CollectiveError(f"NCCL reported an asynchronous error: {err}", op=oldest,
                                                     this_rank=self.rank, kind="nccl"))
                    return
                with self._lock:
                    first, self._first_unwatched = self._first_unwatched, None
                if first is not None:
                    ev = free.pop() if free else backend.event_create(ordinal, False)
                    backend.event_record(ev, stream.handle)
                    pending.append((ev, first[0], first[1]))
                while pending and backend.event_query(pending[0][0]):
                    free.append(pending.popleft()[0])
                if pending and time.monotonic() - pending[0][1] > self.timeout:
                    self.health.fail(CollectiveTimeoutError(
                        f"the operation did not finish within {self.timeout:g} s (the time-out): a peer is stuck "
                        "or dead, or the ranks called different operations; the NCCL communicator was aborted",
                        op=pending[0][2].label, this_rank=self.rank, kind="timeout"))
                    return
        except Exception as e:  # the driver or NCCL broke under us
            if not self._stop.is_set():
                self.health.fail(CollectiveError(f"watchdog: {type(e).__name__}: {e}", this_rank=self.rank,
                                                 kind="nccl"))
        finally:
            for ev, _, _ in pending:
                free.append(ev)
            for ev in free:
                try:
                    backend.event_destroy(ev)
                except Exception:
                    pass

    def _on_failure(self, err: BaseException) -> None:
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
            return
        with self._lock:
            if self._aborted or self.handle is None:
                return
            self._aborted = True
        try:
            self.api.destroy(self.handle)
        except Exception:
            pass

    def abort(self) -> None:
        self._stop.set()
        self._abort()
