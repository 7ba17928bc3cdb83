"""The ``cuda`` backend: the Backend protocol over NVIDIA's driver API
(``cuda.bindings.driver``, cuda-bindings 12.x and 13.x).

Design and rules:
- Every driver status goes through ``_check`` (or ``_ready`` for the two
  query calls, where CUDA_ERROR_NOT_READY means "not yet"), which turns it
  into ``DriverError(status, name, call)`` naming the cu* function. Nothing
  is masked, retried or downgraded.
- Handles are plain ints at the protocol boundary. Streams and events made
  here are remembered as ``handle -> (device, binding object)`` so hot calls
  pass the binding's own object (no re-wrapping) and know their context.
- Contexts: each device's primary context is retained once (``init_device``,
  or lazily by the first op that needs it). A thread-local remembers which
  context this backend made current on the calling thread, so
  ``cuCtxSetCurrent`` runs only when the device changes. Ops that take only
  a stream or event handle make that handle's device current, so they work
  from a fresh thread. Handles this backend did not make run in the thread's
  current context (device 0's if none); code that changes the thread's
  context behind the backend's back calls ``set_current(ordinal)`` after.
- Host functions: one ctypes trampoline is registered with the driver; each
  ``launch_host_func`` passes a token as userData, and the Python callable
  stays in a table until it has run. An exception raised by the callable
  never reaches the driver's thread: it is recorded and raised by the next
  ``stream_synchronize`` of that stream (or ``device_synchronize`` of its
  device), once, as ``DriverError`` CUDA_ERROR_LAUNCH_FAILED naming that
  synchronize call, with the exception in the detail and as ``__cause__``.
  (The driver itself never fails a host function; the stream goes on.)
- No fault checks here: ``FaultInjectingBackend`` (``ignis.backends.faults``)
  wraps this backend to make calls fail. The ordering operations tell the
  trace registry's listeners (``ignis.backends.trace``) behind one list test.
- Thread-safe: binding calls release the GIL; the tables are changed under
  the GIL (single dict operations) or ``self._lock``.
- The compiled hot paths (cross-stream tracking's event records and waits,
  the kernel launch, the guard's poison under PyTorch) call the driver
  through ``ignis.backends._cudriver``: C functions over the driver's own
  entry points, which that module takes from ``libcuda.so.1`` at run time
  (``cuGetProcAddress``, asking for the C signatures it declares), so it
  needs no CUDA headers or cuda-bindings at build time and is built with
  the rest of Ignis. They are called without a Python call (tracking and
  the launch release the GIL around them). This backend loads them when it
  starts and refuses to start without them (``DriverError`` naming what the
  driver lacks; ``ImportError`` saying how to rebuild where the module is
  missing), never falling back to another route to the driver.
- Fork: the driver was initialized (``cuInit``) when this backend was made,
  and a child made by ``fork()`` cannot use the parent's driver state or
  contexts (CUDA does not support it). In such a child every operation raises
  ``ForkedProcessError`` saying to use the ``spawn`` or ``forkserver`` start
  method (see ``ignis.backends``); the exit-time drain does nothing there.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..errors import DriverError
from .base import CU_STATUS, Backend, DeviceProperties, driver_error
from .direct import DirectCalls
from .trace import emit
from ._cu import _check, _error, cu
from .vmm_cuda import CudaVmm

__all__ = ["CudaBackend"]

_NOT_READY = CU_STATUS["CUDA_ERROR_NOT_READY"]

_CUDRIVER_MISSING = (
    "the cuda backend needs its compiled driver entry points, ignis.backends._cudriver, which this "
    "installation lacks ({why}). The module is compiled with the rest of Ignis and needs only a C compiler "
    "(no CUDA headers): reinstall Ignis (`pip install .`), or run `python setup.py build_ext --inplace` in a "
    "source checkout; or set IGNIS_BACKEND=emulated")


# -- status checking: ``_cu._check``, the one place where driver statuses become errors


def _ready(res: tuple, call: str) -> bool:
    """For cuStreamQuery / cuEventQuery: NOT_READY -> False, success -> True."""
    if res[0] == _NOT_READY:
        return False
    _check(res, call)
    return True


# -- host functions ------------------------------------------------------------
# token -> (backend, stream handle, the stream's record or None, callable).
# Entries live until the driver calls the trampoline (or the launch fails, or
# the context is rebuilt).
_PENDING: dict[int, tuple["CudaBackend", int, Any, Callable[[], None]]] = {}
_TOKENS = itertools.count(1)  # 0 would arrive as None through c_void_p


def _run_host_fn(user_data: int | None, _pending: dict = _PENDING) -> None:
    """Runs on the driver's callback thread; must never raise (and reaches nothing
    through this module's globals, which are cleared at interpreter exit)."""
    entry = _pending.pop(user_data or 0, None)
    if entry is None:
        return
    backend, stream, rec, fn = entry
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - surfaced at the next synchronize
        try:
            backend._record_host_error(stream, rec, fn, exc)
        except BaseException:  # noqa: BLE001 - interpreter shutdown; nothing to report to
            pass


_EXITING = [False]  # set at interpreter exit, once the queued host functions have run


def _drain_at_exit(ref: "weakref.ref[CudaBackend]") -> None:
    """atexit: let every queued host function run while the interpreter can still run
    it (a driver thread calling into a finalizing interpreter can crash the process);
    host functions queued after this run inline (see launch_host_func)."""
    backend = ref()
    _EXITING[0] = True
    if backend is None or backend._forked_from is not None:  # a forked child has no context to drain
        return
    for dev in list(backend._devs.values()):
        try:
            backend._make_current(dev)
            cu.cuCtxSynchronize()
        except Exception:  # noqa: BLE001 - a context already gone has nothing queued
            pass


_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_TRAMPOLINE = _HOST_FN_TYPE(_run_host_fn)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_TRAMPOLINE))  # never freed: the driver holds its address
_TRAMPOLINE_ADDR: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value or 0


class _Device:
    """A retained device: its CUdevice, primary context and default pool.
    ``ctx`` is replaced (a new object) on every retain, so a thread-local
    identity test tells whether a thread's current context is still valid."""

    __slots__ = ("ordinal", "handle", "ctx", "pool")

    def __init__(self, ordinal: int, handle: Any, ctx: Any) -> None:
        self.ordinal = ordinal
        self.handle = handle
        self.ctx = ctx
        self.pool: Any = None


class _Current(threading.local):
    ctx: Any = None  # the context object this backend last made current here


def _attr(*names: str) -> Any:
    """The first CUdevice_attribute of ``names`` these bindings know (None if none)."""
    for name in names:
        value = getattr(cu.CUdevice_attribute, name, None)
        if value is not None:
            return value
    return None


def _cstr(raw: Any) -> str:
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
    return str(raw).split("\0", 1)[0].strip()


def _format_uuid(raw: Any) -> str:
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    b = bytes(x & 0xFF for x in raw) if not isinstance(raw, (bytes, bytearray)) else bytes(raw)
    h = b[:16].hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class CudaBackend(CudaVmm, Backend):
    """The Backend protocol on a real GPU through the CUDA driver API.

    Raises ``DriverError`` on construction when the driver library cannot be
    loaded or ``cuInit`` fails (no device, driver too old), and ImportError
    when cuda-bindings is not installed.
    """

    name = "cuda"
    cuda_driver = True   # pointers, streams and contexts are the driver's, shared with PyTorch, CuPy, NCCL
    gpu_timings = True

    def __init__(self) -> None:
        super().__init__()
        if cu is None:
            raise ImportError("the cuda backend needs cuda-bindings (pip install cuda-bindings); "
                              "set IGNIS_BACKEND=emulated to run without a GPU")
        try:
            res = cu.cuInit(0)
        except Exception as exc:  # cuda.pathfinder: DynamicLibNotFoundError (a RuntimeError)
            raise driver_error("CUDA_ERROR_NOT_INITIALIZED", "cuInit",
                               f"the CUDA driver library (libcuda.so.1) could not be loaded: {str(exc).rstrip('.')}; "
                               "install the NVIDIA driver or set IGNIS_BACKEND=emulated") from exc
        _check(res, "cuInit")
        try:  # after cuInit: where there is no driver, that is the reason to give
            from . import _cudriver
        except ImportError as exc:
            raise ImportError(_CUDRIVER_MISSING.format(why=f"{type(exc).__name__}: {exc}"),
                              name="ignis.backends._cudriver") from exc
        try:  # the driver's functions behind the entry points, taken once per process
            _cudriver.load()
        except OSError as exc:
            raise driver_error("CUDA_ERROR_NOT_FOUND", "cuGetProcAddress", str(exc)) from exc
        self._entry_points: dict[str, int] = _cudriver.entry_points()
        self._lock = threading.RLock()
        self._cur = _Current()
        self._ctx_epoch = [0]  # bumped whenever a context is made current or rebuilt (direct_calls)
        self._direct: DirectCalls | None = None
        self._devs: dict[int, _Device] = {}
        self._count: int | None = None
        self._props: dict[int, DeviceProperties] = {}
        # handle -> (device, binding object), for streams and events made here
        self._streams: dict[int, tuple[_Device, Any]] = {}
        self._events: dict[int, tuple[_Device, Any]] = {}
        # Handles of events this backend created and destroyed or lost in a context reset (until
        # the driver hands the same handle out again): refused, never passed to the driver.
        self._gone_events: set[int] = set()
        # host-function exceptions not yet surfaced: stream -> [...], and per
        # device for streams destroyed before they were synchronized
        self._host_errors: dict[int, list[tuple[Callable, BaseException]]] = {}
        self._orphan_errors: dict[int, list[tuple[Callable, BaseException]]] = {}
        self._host_fn = cu.CUhostFn(_TRAMPOLINE_ADDR)
        self._host: dict[int, np.ndarray] = {}  # pinned address -> the process memory behind it
        self._portable = int(cu.CU_MEMHOSTREGISTER_PORTABLE)
        self._not_registered = int(cu.CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        self._peer_enabled_already = int(cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        self._can_access_peer: dict[tuple[int, int], bool] = {}  # (ordinal, peer) -> cuDeviceCanAccessPeer
        self._non_blocking = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self._no_timing = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        # bound driver entry points (hot paths)
        self._cuCtxSetCurrent = cu.cuCtxSetCurrent
        self._cuMemAlloc = cu.cuMemAlloc
        self._cuMemFree = cu.cuMemFree
        self._cuMemAllocAsync = cu.cuMemAllocAsync
        self._cuMemFreeAsync = cu.cuMemFreeAsync
        self._cuMemcpyHtoDAsync = cu.cuMemcpyHtoDAsync
        self._cuMemcpyDtoHAsync = cu.cuMemcpyDtoHAsync
        self._cuMemcpyDtoDAsync = cu.cuMemcpyDtoDAsync
        self._cuMemsetD8Async = cu.cuMemsetD8Async
        self._cuMemsetD32Async = cu.cuMemsetD32Async
        self._cuStreamWaitEvent = cu.cuStreamWaitEvent
        self._cuStreamQuery = cu.cuStreamQuery
        self._cuStreamSynchronize = cu.cuStreamSynchronize
        self._cuLaunchHostFunc = cu.cuLaunchHostFunc
        self._cuEventRecord = cu.cuEventRecord
        self._cuEventQuery = cu.cuEventQuery
        self._cuEventSynchronize = cu.cuEventSynchronize
        atexit.register(_drain_at_exit, weakref.ref(self))

    def fork_unsafe(self) -> bool:
        """Always: cuInit ran in this process, and the driver's state does not survive a fork."""
        return True

    def direct_calls(self) -> DirectCalls:
        """For the compiled hot paths: the memory layer's tracking (ignis/memory/resource.pyx)
        and the kernel launch (ignis/runtime/kernel.pyx). This backend's handle tables
        (handle -> (device, binding object)), the thread's current-context record and the
        epoch it bumps whenever it changes, and the C entry points for cuEventRecord,
        cuStreamWaitEvent and cuLaunchKernel (``ignis.backends._cudriver``: each calls the
        driver's function of that name and returns its CUresult; the handles are the
        driver's pointers), with every entry point of that module by driver name (the
        guard's poison under PyTorch takes cuMemsetD8Async, cuMemsetD32Async and
        cuCtxGetDevice). Gated by this backend's trace listeners and fork marker
        (``Backend._direct_calls``). Made once."""
        dc = self._direct
        if dc is None:
            ep = self._entry_points
            raw = (ep["cuEventRecord"], ep["cuStreamWaitEvent"], ep["cuLaunchKernel"])
            dc = self._direct = self._direct_calls(self._streams, self._events, self._cur, self._ctx_epoch, raw,
                                                   dict(ep))
        return dc

    # -- contexts ----------------------------------------------------------
    def _retain(self, ordinal: int) -> _Device:
        with self._lock:
            dev = self._devs.get(ordinal)
            if dev is None:
                handle = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")[1]
                ctx = _check(cu.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")[1]
                dev = self._devs[ordinal] = _Device(ordinal, handle, ctx)
            return dev

    def _make_current(self, dev: _Device) -> None:
        ctx = dev.ctx
        _check(self._cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._cur.ctx = ctx
        self._ctx_epoch[0] += 1

    def _enter(self, ordinal: int) -> _Device:
        """The device, with its primary context current on this thread."""
        dev = self._devs.get(ordinal)
        if dev is None:
            dev = self._retain(ordinal)
        if self._cur.ctx is not dev.ctx:
            self._make_current(dev)
        return dev

    def _enter_any(self) -> None:
        """Some context current: the one this backend set here, else whatever
        foreign code made current, else device 0's primary context."""
        if self._cur.ctx is not None:
            return
        ctx = _check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")[1]
        if ctx is None or not int(ctx):
            self._enter(0)

    def _enter_stream(self, stream: int) -> Any:
        """The binding object for ``stream``, with its context current."""
        rec = self._streams.get(stream)
        if rec is None:
            self._enter_any()
            return stream
        dev, obj = rec
        if self._cur.ctx is not dev.ctx:
            self._make_current(dev)
        return obj

    def _enter_event(self, event: int, call: str = "cuEvent") -> Any:
        """The binding object for ``event``, with its context current. A handle this backend
        does not hold is passed on as a foreign one, unless it is one of its own events that
        was destroyed or lost in a context reset: the driver's behaviour on such a handle is
        undefined (a query of one crashed the process), so it is refused here."""
        rec = self._events.get(event)
        if rec is None:
            if event in self._gone_events:
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                                   f"event {event:#x} was destroyed, or its context was reset")
            self._enter_any()
            return event
        dev, obj = rec
        if self._cur.ctx is not dev.ctx:
            self._make_current(dev)
        return obj

    def set_current(self, ordinal: int) -> None:
        """Make ``ordinal``'s primary context current on the calling thread
        (always calls cuCtxSetCurrent, so it also repairs the thread after
        foreign code changed its context)."""
        if self._forked_from is not None:
            self._check_fork("make a CUDA context current")
        dev = self._devs.get(ordinal) or self._retain(ordinal)
        self._make_current(dev)

    def init_device(self, ordinal: int) -> None:
        self._enter(ordinal)

    def rebuild_context(self, ordinal: int) -> None:
        """Reset the primary context (cuDevicePrimaryCtxReset) and retain it
        again. Every pointer, stream, event and pending host function of the
        device is gone afterwards; so are unsurfaced host-function errors."""
        with self._lock:
            dev = self._devs.get(ordinal) or self._retain(ordinal)
            _check(cu.cuDevicePrimaryCtxReset(dev.handle), "cuDevicePrimaryCtxReset")
            for table in (self._streams, self._events):
                for handle in [h for h, (d, _) in list(table.items()) if d is dev]:
                    table.pop(handle, None)
                    self._host_errors.pop(handle, None)
                    if table is self._events:
                        self._gone_events.add(handle)
            for token in [t for t, (b, _, rec, _) in list(_PENDING.items())
                          if b is self and rec is not None and rec[0] is dev]:
                _PENDING.pop(token, None)
            self._orphan_errors.pop(ordinal, None)
            dev.pool = None
            # Reset does not release our reference; the retain re-activates the
            # context. The new object makes every thread's cached context stale.
            dev.ctx = _check(cu.cuDevicePrimaryCtxRetain(dev.handle), "cuDevicePrimaryCtxRetain")[1]
            self._ctx_epoch[0] += 1
        self._make_current(dev)

    def device_synchronize(self, ordinal: int) -> None:
        """cuCtxSynchronize on the device, then raise the first host-function
        exception not yet surfaced on any of its streams."""
        dev = self._enter(ordinal)
        _check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        if self._host_errors or self._orphan_errors:
            with self._lock:
                errors = self._orphan_errors.pop(ordinal, [])
                for handle in [h for h, (d, _) in list(self._streams.items()) if d is dev]:
                    errors.extend(self._host_errors.pop(handle, ()))
            self._raise_host_errors(errors, "cuCtxSynchronize")
        if self._trace:
            emit(self._trace, "on_device_synchronize", ordinal)

    def device_can_access_peer(self, ordinal: int, peer: int) -> bool:
        """cuDeviceCanAccessPeer (asked once per pair: a property of the machine)."""
        key = (ordinal, peer)
        can = self._can_access_peer.get(key)
        if can is None:
            a = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")[1]
            b = _check(cu.cuDeviceGet(peer), "cuDeviceGet")[1]
            can = ordinal != peer and bool(_check(cu.cuDeviceCanAccessPeer(a, b), "cuDeviceCanAccessPeer")[1])
            self._can_access_peer[key] = can
        return can

    def enable_peer_access(self, ordinal: int, peer: int) -> None:
        """cuCtxEnablePeerAccess from ``ordinal``'s primary context to ``peer``'s; access
        enabled already (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) is success."""
        self._enter(ordinal)
        other = self._devs.get(peer) or self._retain(peer)
        res = cu.cuCtxEnablePeerAccess(other.ctx, 0)
        if res[0] and int(res[0]) != self._peer_enabled_already:
            raise _error(res[0], "cuCtxEnablePeerAccess")

    # -- devices -----------------------------------------------------------
    def device_count(self) -> int:
        if self._count is None:
            if self._forked_from is not None:
                self._check_fork("count CUDA devices")
            self._count = int(_check(cu.cuDeviceGetCount(), "cuDeviceGetCount")[1])
        return self._count

    def device_properties(self, ordinal: int) -> DeviceProperties:
        props = self._props.get(ordinal)
        if props is not None:
            return props
        if self._forked_from is not None:
            self._check_fork("query CUDA device properties")
        handle = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")[1]

        def attr(*names: str) -> int:
            which = _attr(*names)
            if which is None:
                return 0
            return int(_check(cu.cuDeviceGetAttribute(which, handle), "cuDeviceGetAttribute")[1])

        uuid = _check(cu.cuDeviceGetUuid(handle), "cuDeviceGetUuid")[1]
        props = DeviceProperties(
            ordinal=ordinal,
            name=_cstr(_check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName")[1]),
            total_memory=int(_check(cu.cuDeviceTotalMem(handle), "cuDeviceTotalMem")[1]),
            multiprocessor_count=attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            compute_capability=(attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                                attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")),
            uuid=_format_uuid(uuid.bytes),
            vmm_supported=bool(attr("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
                                    "CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED")),
            memory_pools_supported=bool(attr("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED")),
            posix_fd_ipc_supported=bool(attr("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")),
            extra={
                "pci_bus_id": _cstr(_check(cu.cuDeviceGetPCIBusId(64, handle), "cuDeviceGetPCIBusId")[1]),
                "integrated": bool(attr("CU_DEVICE_ATTRIBUTE_INTEGRATED")),
                "unified_addressing": bool(attr("CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING")),
                "async_engine_count": attr("CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT"),
                "l2_cache_bytes": attr("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
                "memory_bus_width_bits": attr("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH"),
                "max_threads_per_multiprocessor": attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR"),
                "managed_memory": bool(attr("CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY")),
                "concurrent_managed_access": bool(attr("CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS")),
            },
        )
        with self._lock:
            return self._props.setdefault(ordinal, props)

    def versions(self) -> dict[str, str]:
        v = int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion")[1])
        try:
            import cuda.bindings as bindings
            bindings_version = str(bindings.__version__)
        except (ImportError, AttributeError):
            from importlib.metadata import PackageNotFoundError, version
            try:
                bindings_version = version("cuda-bindings")
            except PackageNotFoundError:
                bindings_version = "unknown"
        return {"backend": self.name, "driver": f"{v // 1000}.{(v % 1000) // 10}",
                "cuda-bindings": bindings_version}

    # -- memory ------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int) -> int:
        self._enter(ordinal)
        return int(_check(self._cuMemAlloc(nbytes), "cuMemAlloc")[1])

    def mem_free(self, ordinal: int, ptr: int) -> None:
        self._enter(ordinal)
        _check(self._cuMemFree(ptr), "cuMemFree")

    def _stream_on(self, dev: _Device, stream: int, call: str) -> Any:
        """``stream``'s binding object, refusing a stream of another device
        (the driver would serve that device's pool instead)."""
        rec = self._streams.get(stream)
        if rec is None:
            return stream
        if rec[0] is not dev:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"stream {stream:#x} belongs to device {rec[0].ordinal}, not device {dev.ordinal}")
        return rec[1]

    def mem_alloc_async(self, ordinal: int, nbytes: int, stream: int) -> int:
        """From the device's current memory pool (the default pool unless
        foreign code replaced it with cuDeviceSetMemPool), ordered on ``stream``."""
        dev = self._enter(ordinal)
        s = self._stream_on(dev, stream, "cuMemAllocAsync")
        return int(_check(self._cuMemAllocAsync(nbytes, s), "cuMemAllocAsync")[1])

    def mem_free_async(self, ordinal: int, ptr: int, stream: int) -> None:
        dev = self._enter(ordinal)
        s = self._stream_on(dev, stream, "cuMemFreeAsync")
        _check(self._cuMemFreeAsync(ptr, s), "cuMemFreeAsync")

    def mem_get_info(self, ordinal: int) -> tuple[int, int]:
        self._enter(ordinal)
        _, free, total = _check(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def mem_pool_trim(self, ordinal: int, keep_bytes: int = 0) -> None:
        dev = self._enter(ordinal)
        pool = dev.pool
        if pool is None:
            pool = dev.pool = _check(cu.cuDeviceGetDefaultMemPool(dev.handle), "cuDeviceGetDefaultMemPool")[1]
        _check(cu.cuMemPoolTrimTo(pool, keep_bytes), "cuMemPoolTrimTo")

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory: process memory registered with the driver
        (cuMemHostRegister, portable to every context). The memory itself belongs
        to the process, so it stays valid even if a context reset drops the
        registration (copies then fall back to the driver's staged path)."""
        if type(nbytes) is not int or nbytes <= 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemHostAlloc", f"cannot pin {nbytes!r} bytes")
        self._enter_any()
        raw = np.empty(nbytes + 4095, np.uint8)
        base = raw.ctypes.data
        ptr = base + (-base % 4096)
        _check(cu.cuMemHostRegister(ptr, nbytes, self._portable), "cuMemHostRegister")
        with self._lock:
            self._host[ptr] = raw
        return ptr

    def host_free(self, ptr: int) -> None:
        with self._lock:
            raw = self._host.pop(ptr, None)
        if raw is None:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemFreeHost",
                               f"{ptr:#x} is not pinned memory from this backend")
        try:
            self._enter_any()
            res = cu.cuMemHostUnregister(ptr)
            if res[0] and int(res[0]) != self._not_registered:  # a context reset already dropped it
                raise _error(res[0], "cuMemHostUnregister")
        except BaseException:
            with self._lock:  # still registered: keep the memory, so a later host_free can retry
                self._host[ptr] = raw
            raise
        del raw

    def memcpy_htod_async(self, dst: int, src_host: int, nbytes: int, stream: int) -> None:
        s = self._enter_stream(stream)
        _check(self._cuMemcpyHtoDAsync(dst, src_host, nbytes, s), "cuMemcpyHtoDAsync")

    def memcpy_dtoh_async(self, dst_host: int, src: int, nbytes: int, stream: int) -> None:
        s = self._enter_stream(stream)
        _check(self._cuMemcpyDtoHAsync(dst_host, src, nbytes, s), "cuMemcpyDtoHAsync")

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        s = self._enter_stream(stream)
        _check(self._cuMemcpyDtoDAsync(dst, src, nbytes, s), "cuMemcpyDtoDAsync")

    def memcpy_peer_async(self, dst: int, dst_ordinal: int, src: int, src_ordinal: int, nbytes: int,
                          stream: int) -> None:
        s = self._enter_stream(stream)
        dctx = (self._devs.get(dst_ordinal) or self._retain(dst_ordinal)).ctx
        sctx = (self._devs.get(src_ordinal) or self._retain(src_ordinal)).ctx
        _check(cu.cuMemcpyPeerAsync(dst, dctx, src, sctx, nbytes, s), "cuMemcpyPeerAsync")

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        s = self._enter_stream(stream)
        _check(self._cuMemsetD8Async(ptr, value, nbytes, s), "cuMemsetD8Async")

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        s = self._enter_stream(stream)
        _check(self._cuMemsetD32Async(ptr, value, count, s), "cuMemsetD32Async")

    # -- streams -----------------------------------------------------------
    def stream_create(self, ordinal: int, priority: int = 0) -> int:
        dev = self._enter(ordinal)
        obj = _check(cu.cuStreamCreateWithPriority(self._non_blocking, priority), "cuStreamCreateWithPriority")[1]
        handle = int(obj)
        self._streams[handle] = (dev, obj)
        return handle

    def stream_destroy(self, stream: int) -> None:
        """Destroy ``stream`` (queued work still completes). Host-function
        exceptions not yet surfaced move to the device's next device_synchronize."""
        if stream not in self._streams:
            # Not made here, or its context was reset: the driver may crash on a dead handle.
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuStreamDestroy",
                               f"stream {stream:#x} was not created by this backend or its context was reset")
        s = self._enter_stream(stream)
        _check(cu.cuStreamDestroy(s), "cuStreamDestroy")
        with self._lock:
            rec = self._streams.pop(stream, None)
            errors = self._host_errors.pop(stream, None)
            if errors and rec is not None:
                self._orphan_errors.setdefault(rec[0].ordinal, []).extend(errors)
        if self._trace:
            emit(self._trace, "on_stream_destroyed", stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        srec = self._streams.get(stream)
        erec = self._events.get(event)
        if srec is not None and erec is not None and self._cur.ctx is srec[0].ctx:  # the hot path, inlined
            res = self._cuStreamWaitEvent(srec[1], erec[1], 0)
        else:
            res = self._cuStreamWaitEvent(self._enter_stream(stream),
                                          self._enter_event(event, "cuStreamWaitEvent") if erec is None else erec[1], 0)
        if res[0]:
            raise _error(res[0], "cuStreamWaitEvent")
        if self._trace:
            emit(self._trace, "on_stream_wait_event", stream, event)

    def stream_query(self, stream: int) -> bool:
        done = _ready(self._cuStreamQuery(self._enter_stream(stream)), "cuStreamQuery")
        if done and self._trace:
            emit(self._trace, "on_stream_synchronize", stream)
        return done

    def stream_synchronize(self, stream: int) -> None:
        """Wait for ``stream``; then raise the first exception a host function
        of this stream raised since the last synchronize, as DriverError
        CUDA_ERROR_LAUNCH_FAILED (call "cuStreamSynchronize")."""
        _check(self._cuStreamSynchronize(self._enter_stream(stream)), "cuStreamSynchronize")
        if self._host_errors:
            with self._lock:
                errors = self._host_errors.pop(stream, None)
            if errors:
                self._raise_host_errors(errors, "cuStreamSynchronize")
        if self._trace:
            emit(self._trace, "on_stream_synchronize", stream)

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the driver's host thread when ``stream`` gets here.
        ``fn`` must not call the backend (the driver forbids CUDA calls there);
        its exceptions surface at the next synchronize (see stream_synchronize)."""
        if not callable(fn):
            raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuLaunchHostFunc", f"{fn!r} is not callable")
        s = self._enter_stream(stream)
        if _EXITING[0]:  # the interpreter is exiting: run it here, in stream order
            _check(self._cuStreamSynchronize(s), "cuStreamSynchronize")
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - as from the driver's thread
                self._record_host_error(stream, self._streams.get(stream), fn, exc)
            return
        token = next(_TOKENS)
        _PENDING[token] = (self, stream, self._streams.get(stream), fn)
        try:
            _check(self._cuLaunchHostFunc(s, self._host_fn, token), "cuLaunchHostFunc")
        except BaseException:
            _PENDING.pop(token, None)
            raise

    def _record_host_error(self, stream: int, rec: Any, fn: Callable, exc: BaseException) -> None:
        with self._lock:
            if rec is not None and self._streams.get(stream) is not rec:
                # the stream was destroyed before fn ran: report with its device
                self._orphan_errors.setdefault(rec[0].ordinal, []).append((fn, exc))
            else:
                self._host_errors.setdefault(stream, []).append((fn, exc))

    @staticmethod
    def _raise_host_errors(errors: list[tuple[Callable, BaseException]], call: str) -> None:
        if not errors:
            return
        fn, exc = errors[0]
        name = getattr(fn, "__qualname__", None) or repr(fn)
        detail = f"host function {name} (cuLaunchHostFunc) raised {type(exc).__name__}: {exc}"
        if len(errors) > 1:
            detail += f"; {len(errors) - 1} more host function(s) also raised"
        raise driver_error("CUDA_ERROR_LAUNCH_FAILED", call, detail) from exc

    # -- events ------------------------------------------------------------
    def event_create(self, ordinal: int, timing: bool = False) -> int:
        dev = self._enter(ordinal)
        obj = _check(cu.cuEventCreate(0 if timing else self._no_timing), "cuEventCreate")[1]
        handle = int(obj)
        self._events[handle] = (dev, obj)
        self._gone_events.discard(handle)
        return handle

    def event_destroy(self, event: int) -> None:
        if event not in self._events:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", "cuEventDestroy",
                               f"event {event:#x} was not created by this backend or its context was reset")
        _check(cu.cuEventDestroy(self._enter_event(event, "cuEventDestroy")), "cuEventDestroy")
        self._events.pop(event, None)
        self._gone_events.add(event)
        if self._trace:
            emit(self._trace, "on_event_destroyed", event)

    def event_record(self, event: int, stream: int) -> None:
        if self._trace:
            emit(self._trace, "on_event_record", event, stream)
        srec = self._streams.get(stream)
        erec = self._events.get(event)
        if srec is not None and erec is not None and self._cur.ctx is srec[0].ctx:  # the hot path, inlined
            res = self._cuEventRecord(erec[1], srec[1])
        else:
            res = self._cuEventRecord(self._enter_event(event, "cuEventRecord") if erec is None else erec[1],
                                      self._enter_stream(stream))
        if res[0]:
            raise _error(res[0], "cuEventRecord")

    def event_query(self, event: int) -> bool:
        done = _ready(self._cuEventQuery(self._enter_event(event, "cuEventQuery")), "cuEventQuery")
        if done and self._trace:
            emit(self._trace, "on_event_synchronize", event)
        return done

    def event_synchronize(self, event: int) -> None:
        _check(self._cuEventSynchronize(self._enter_event(event, "cuEventSynchronize")), "cuEventSynchronize")
        if self._trace:
            emit(self._trace, "on_event_synchronize", event)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two completed records of timing events."""
        a = self._enter_event(start, "cuEventElapsedTime")
        rec = self._events.get(end)
        b = self._enter_event(end, "cuEventElapsedTime") if rec is None else rec[1]
        return float(_check(cu.cuEventElapsedTime(a, b), "cuEventElapsedTime")[1])

    # -- kernels -----------------------------------------------------------
    def kernel_compile(self, ordinal: int, source: str, name: str, options: tuple = ()) -> Any:
        """NVRTC-compile ``source`` to a cubin for this device's architecture, load it,
        and return the CUfunction ``name``. Compile errors carry NVRTC's log."""
        from cuda.bindings import nvrtc

        def nv(res: tuple, call: str, prog: Any = None) -> tuple:
            err = res[0]
            if int(err) != 0:
                log = ""
                if prog is not None:
                    try:
                        size = nv(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")[1]
                        buf = b" " * size
                        nvrtc.nvrtcGetProgramLog(prog, buf)
                        log = buf.decode(errors="replace").strip("\0 \n")
                    except Exception:
                        pass
                raise DriverError(int(err), getattr(err, "name", f"NVRTC_ERROR_{int(err)}"), call,
                                  f"kernel {name!r}: {log}" if log else f"kernel {name!r}")
            return res

        self._enter(ordinal)
        major, minor = self.device_properties(ordinal).compute_capability
        prog = nv(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                  "nvrtcCreateProgram")[1]
        try:
            opts = [f"--gpu-architecture=sm_{major}{minor}".encode(), b"--std=c++17",
                    *[o.encode() for o in options]]
            nv(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "nvrtcCompileProgram", prog)
            size = nv(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")[1]
            image = b" " * size
            nv(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN")
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
        holder = ctypes.create_string_buffer(image, len(image))
        module = _check(cu.cuModuleLoadData(ctypes.addressof(holder)), "cuModuleLoadData")[1]
        func = _check(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")[1]
        with self._lock:
            self.__dict__.setdefault("_modules", []).append(module)  # loaded for the context's life
        return func

    def kernel_launch(self, function: Any, grid: tuple, block: tuple, shared_mem: int, stream: int,
                      params: Any = ()) -> None:
        """cuLaunchKernel with ``params`` (ctypes values, one per kernel parameter)."""
        s = self._enter_stream(stream)
        n = len(params)
        ptrs = (ctypes.c_void_p * max(n, 1))(*[ctypes.addressof(p) for p in params])
        _check(cu.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                 shared_mem, s, ctypes.addressof(ptrs), 0), "cuLaunchKernel")
