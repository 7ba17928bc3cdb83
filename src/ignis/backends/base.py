"""The backend protocol (layer 0).

A backend is a thin set of driver-level operations over plain integers:
device pointers, host addresses, stream and event handles, sizes. It keeps
no policy and no bookkeeping beyond what the driver itself keeps; everything
else (ownership, tracking, pooling) lives in the layers above.

Rules every backend follows:
- Handles are ints. Stream handle 0 is never a valid stream.
- Every failure is a ``DriverError(status, name, call)`` carrying the CUDA
  driver's status name and number, or ``UnsupportedError`` naming the backend.
  Nothing is masked and nothing returns a silent success.
- Asynchronous operations only enqueue; they never wait for the device.
- Backends carry no fault checks: ``FaultInjectingBackend`` (``ignis.backends.faults``)
  wraps any backend and makes chosen calls fail with the error the real driver
  gives, so every error path is testable.
- Observers subscribe to the trace registry (``ignis.backends.trace``): the
  ordering operations (event record, stream wait, synchronizes, successful
  queries, destroys) call their listeners; unobserved, each pays one list test.
- Fork: a child made by ``fork()`` after the parent used a backend inherits
  none of its device state. ``mark_forked`` (run in the child by the at-fork
  handler of ``ignis.backends``) turns the inherited backend into its forked
  stand-in (the instance's class becomes a generated subclass whose every
  operation of ``OPS``, and every host-memory method, raises
  ``ForkedProcessError`` before it touches a lock or the driver), at no cost
  in the parent.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import DriverError, ForkedProcessError, UnsupportedError
from .direct import DirectCalls

__all__ = ["Backend", "DeviceProperties", "CU_STATUS", "OPS", "driver_error", "REFUSED_AFTER_FORK"]

# CUresult values for the statuses Ignis raises or injects (cuda.h).
CU_STATUS: dict[str, int] = {
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_NOT_INITIALIZED": 3,
    "CUDA_ERROR_DEINITIALIZED": 4,
    "CUDA_ERROR_NO_DEVICE": 100,
    "CUDA_ERROR_INVALID_DEVICE": 101,
    "CUDA_ERROR_INVALID_CONTEXT": 201,
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": 217,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_NOT_FOUND": 500,
    "CUDA_ERROR_NOT_READY": 600,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED": 704,
    "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED": 705,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_NOT_PERMITTED": 800,
    "CUDA_ERROR_NOT_SUPPORTED": 801,
    "CUDA_ERROR_UNKNOWN": 999,
}

# Backend operation name -> the driver entry point it stands for. Fault
# injection (FaultInjectingBackend) and DriverError.call use these names on every backend.
OPS: dict[str, str] = {
    "init_device": "cuDevicePrimaryCtxRetain",
    "rebuild_context": "cuDevicePrimaryCtxReset",
    "mem_alloc": "cuMemAlloc",
    "mem_free": "cuMemFree",
    "mem_alloc_async": "cuMemAllocAsync",
    "mem_free_async": "cuMemFreeAsync",
    "mem_get_info": "cuMemGetInfo",
    "mem_pool_trim": "cuMemPoolTrimTo",
    "host_alloc": "cuMemHostAlloc",
    "host_free": "cuMemFreeHost",
    "memcpy_htod_async": "cuMemcpyHtoDAsync",
    "memcpy_dtoh_async": "cuMemcpyDtoHAsync",
    "memcpy_dtod_async": "cuMemcpyDtoDAsync",
    "memcpy_peer_async": "cuMemcpyPeerAsync",
    "memset_d8_async": "cuMemsetD8Async",
    "memset_d32_async": "cuMemsetD32Async",
    "stream_create": "cuStreamCreateWithPriority",
    "stream_destroy": "cuStreamDestroy",
    "stream_wait_event": "cuStreamWaitEvent",
    "stream_query": "cuStreamQuery",
    "stream_synchronize": "cuStreamSynchronize",
    "launch_host_func": "cuLaunchHostFunc",
    "event_create": "cuEventCreate",
    "event_destroy": "cuEventDestroy",
    "event_record": "cuEventRecord",
    "event_query": "cuEventQuery",
    "event_synchronize": "cuEventSynchronize",
    "event_elapsed_ms": "cuEventElapsedTime",
    "device_synchronize": "cuCtxSynchronize",
    "device_can_access_peer": "cuDeviceCanAccessPeer",
    "enable_peer_access": "cuCtxEnablePeerAccess",
    "vmm_granularity": "cuMemGetAllocationGranularity",
    "vmm_create": "cuMemCreate",
    "vmm_release": "cuMemRelease",
    "vmm_export_fd": "cuMemExportToShareableHandle",
    "vmm_import_fd": "cuMemImportFromShareableHandle",
    "vmm_reserve": "cuMemAddressReserve",
    "vmm_free_address": "cuMemAddressFree",
    "vmm_map": "cuMemMap",
    "vmm_unmap": "cuMemUnmap",
    "vmm_set_access": "cuMemSetAccess",
    "kernel_compile": "nvrtcCompileProgram",
    "kernel_launch": "cuLaunchKernel",
}


# Every backend made in this process (weakly): the at-fork handler of ignis.backends marks them.
_instances: "weakref.WeakSet[Backend]" = weakref.WeakSet()


def driver_error(name: str, call: str, detail: str = "") -> DriverError:
    """A DriverError for the status ``name`` (e.g. "CUDA_ERROR_OUT_OF_MEMORY")."""
    return DriverError(CU_STATUS.get(name, CU_STATUS["CUDA_ERROR_UNKNOWN"]), name, call, detail)


@dataclass(frozen=True)
class DeviceProperties:
    """What a device is and can do.

    Attributes:
        ordinal: the device's number in this process.
        name: the device's name.
        total_memory: its memory, in bytes.
        multiprocessor_count: its number of streaming multiprocessors.
        compute_capability: ``(major, minor)``.
        uuid: its UUID, as a string.
        vmm_supported: virtual memory management (exportable allocations) works.
        memory_pools_supported: stream-ordered memory pools (``cuMemAllocAsync``) work.
        posix_fd_ipc_supported: memory can be shared as POSIX file descriptors.
        extra: backend-specific facts (not compared).
    """

    ordinal: int
    name: str
    total_memory: int
    multiprocessor_count: int
    compute_capability: tuple[int, int]
    uuid: str
    vmm_supported: bool
    memory_pools_supported: bool
    posix_fd_ipc_supported: bool
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def capabilities(self) -> dict[str, bool]:
        """``{"vmm": ..., "memory_pools": ..., "posix_fd_ipc": ...}`` from the three flags."""
        return {
            "vmm": self.vmm_supported,
            "memory_pools": self.memory_pools_supported,
            "posix_fd_ipc": self.posix_fd_ipc_supported,
        }


class Backend:
    """Base of the backends. Subclasses override the operations they support;
    the rest raise ``UnsupportedError`` naming the backend.

    Every operation takes and returns plain ints (device pointers, host
    addresses, stream and event handles, sizes in bytes). Every operation may
    raise ``DriverError`` (the driver's status, or an injected fault),
    ``UnsupportedError`` (not on this backend) and, in a child forked after the
    parent used the backend, ``ForkedProcessError``; the methods do not repeat it.

    Every difference between backends is a method or a capability of this
    protocol, so the layers above never branch on a backend's name: they ask
    a capability (below), or call a method that raises ``UnsupportedError``
    where the backend cannot do it (``host_view`` on cuda, ``kernel_compile``
    on the emulator).

    Attributes:
        name: the backend's name (``"cuda"``, ``"emulated"``), for messages and reports.
        host_memory: device memory is host memory: ``host_view``, ``host_address``,
            ``allocation_view``, ``adopt_host_memory`` and ``release_host_memory`` work (else
            they raise ``UnsupportedError``), and DLPack consumers see it as CPU memory.
        host_kernels: ``kernel_launch`` runs a Python callable (a ``Kernel``'s ``host_impl``
            over NumPy views of the memory) instead of compiled CUDA C (``kernel_compile``).
        cuda_driver: the operations are the NVIDIA CUDA driver's: pointers, streams and
            contexts are shared with the other CUDA libraries of the process (PyTorch, CuPy,
            NCCL can use them), the legacy default stream (handle 0) exists, and rebuilding
            a context resets one that other code may be using.
        gpu_timings: event timings and measured rates describe a GPU (the emulator's are
            host times and say nothing about one).
    """

    name: str = "abstract"
    host_memory: bool = False
    host_kernels: bool = False
    cuda_driver: bool = False
    gpu_timings: bool = False

    def __init__(self) -> None:
        self._trace: list = []        # trace listeners (ignis.backends.trace); changed in place
        self._fast_off: dict[str, Any] = {}  # why a direct driver path must stay off ("forked"); changed in place
        self._used = False            # set once a device was initialized (fork safety)
        self._forked_from: int | None = None  # the parent's pid in a forked child
        _instances.add(self)

    # -- fork safety ----------------------------------------------------------
    def fork_unsafe(self) -> bool:
        """True when a child forked now could not use this backend: the parent has
        device state (threads, driver contexts) that a fork does not copy."""
        return self._used

    def mark_forked(self, parent_pid: int) -> None:
        """In a forked child: make every later operation (``REFUSED_AFTER_FORK``) raise
        ``ForkedProcessError``. The instance's class becomes its forked stand-in (a
        generated subclass whose operations only raise), and the memory layer's direct driver
        path, which calls no method, is turned off through ``_fast_off`` (it holds that dict)."""
        if self._forked_from is None:
            self._forked_from = parent_pid
        self._fast_off["forked"] = parent_pid
        if not getattr(type(self), "_forked_stand_in", False):
            self.__class__ = _forked_class(type(self))

    def forked_error(self, what: str) -> ForkedProcessError:
        """The ``ForkedProcessError`` to raise for ``what`` in a forked child (returned, not raised).

        Args:
            what: what was attempted (``"use the stream"``...).
        """
        return ForkedProcessError(what, backend=self.name, parent_pid=self._forked_from or 0, pid=os.getpid())

    def _check_fork(self, what: str) -> None:
        """Raise ``ForkedProcessError`` in a forked child (for helpers outside ``OPS``)."""
        if self._forked_from is not None:
            raise self.forked_error(what)

    def direct_calls(self) -> DirectCalls | None:
        """The driver calls the compiled hot paths may make without this backend's methods
        (the memory layer's event records and stream waits, the kernel launch), as one typed
        capability (``ignis.backends.direct``), or None: every call goes through the methods.
        Here None; a backend that has them builds them with ``_direct_calls``, which gates
        them with this backend's own state."""
        return None

    def _direct_calls(self, streams: dict, events: dict, current: Any, epoch: list | None, raw: tuple,
                      entry_points: dict | None = None) -> DirectCalls:
        """A ``DirectCalls`` over this backend's handle tables and entry points, gated by its
        trace listeners (a direct call emits no trace event) and its fork marker; a launch (not
        traced) by the fork marker only."""
        return DirectCalls(self, streams, events, current, epoch, (self._fast_off, self._trace), (self._fast_off,),
                           raw, entry_points)

    def _unsupported(self, what: str, hint: str = "") -> UnsupportedError:
        return UnsupportedError(what, self.name, hint)

    # -- devices -----------------------------------------------------------
    def device_count(self) -> int:
        """How many devices the backend sees."""
        raise self._unsupported("device_count")

    def device_properties(self, ordinal: int) -> DeviceProperties:
        """The ``DeviceProperties`` of device ``ordinal``."""
        raise self._unsupported("device_properties")

    def versions(self) -> dict[str, str]:
        """Driver and library versions, for ``ignis doctor``."""
        return {}

    def init_device(self, ordinal: int) -> None:
        """Make the device usable from this process (retain the primary context)."""
        raise self._unsupported("init_device")

    def set_current(self, ordinal: int) -> None:
        """Make ``ordinal``'s context current on the calling thread (no-op where
        the backend has no per-thread context)."""

    def rebuild_context(self, ordinal: int) -> None:
        """Destroy and recreate the device's context. Every pointer, stream and
        event of the old context becomes invalid."""
        raise self._unsupported("rebuild_context")

    def device_synchronize(self, ordinal: int) -> None:
        """Block the host until all work on device ``ordinal`` has finished (``cuCtxSynchronize``)."""
        raise self._unsupported("device_synchronize")

    def device_can_access_peer(self, ordinal: int, peer: int) -> bool:
        """Whether work on device ``ordinal`` can be given direct access to ``peer``'s memory
        (``cuDeviceCanAccessPeer``: NVLink or PCIe peer-to-peer); False for ``peer == ordinal``."""
        raise self._unsupported("device_can_access_peer")

    def enable_peer_access(self, ordinal: int, peer: int) -> None:
        """Let work on device ``ordinal`` (its context) address ``peer``'s memory directly
        (``cuCtxEnablePeerAccess``); nothing to do when it already can. Until either context is
        rebuilt. Raises CUDA_ERROR_PEER_ACCESS_UNSUPPORTED where ``device_can_access_peer`` says no."""
        raise self._unsupported("enable_peer_access")

    # -- memory ------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int) -> int:
        """Allocate ``nbytes`` bytes of device memory on ``ordinal`` (``cuMemAlloc``); returns the device pointer."""
        raise self._unsupported("mem_alloc")

    def mem_free(self, ordinal: int, ptr: int) -> None:
        """Free device memory from ``mem_alloc`` (``cuMemFree``)."""
        raise self._unsupported("mem_free")

    def mem_alloc_async(self, ordinal: int, nbytes: int, stream: int) -> int:
        """Allocate from the device's default memory pool, ordered on ``stream``."""
        raise self._unsupported("mem_alloc_async")

    def mem_free_async(self, ordinal: int, ptr: int, stream: int) -> None:
        """Return ``ptr`` to the device's memory pool once ``stream`` reaches this point."""
        raise self._unsupported("mem_free_async")

    def mem_get_info(self, ordinal: int) -> tuple[int, int]:
        """``(free, total)`` bytes of device memory."""
        raise self._unsupported("mem_get_info")

    def mem_pool_trim(self, ordinal: int, keep_bytes: int = 0) -> None:
        """Release unused memory of the device's default pool back to the system."""
        raise self._unsupported("mem_pool_trim")

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory; returns its host address."""
        raise self._unsupported("host_alloc")

    def host_free(self, ptr: int) -> None:
        """Free page-locked host memory from ``host_alloc`` (``cuMemFreeHost``)."""
        raise self._unsupported("host_free")

    def memcpy_htod_async(self, dst: int, src_host: int, nbytes: int, stream: int) -> None:
        """Queue a copy of ``nbytes`` bytes from host address ``src_host`` to device pointer ``dst`` on ``stream``."""
        raise self._unsupported("memcpy_htod_async")

    def memcpy_dtoh_async(self, dst_host: int, src: int, nbytes: int, stream: int) -> None:
        """Queue a copy of ``nbytes`` bytes from device pointer ``src`` to host address ``dst_host`` on ``stream``."""
        raise self._unsupported("memcpy_dtoh_async")

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue a copy of ``nbytes`` bytes from device pointer ``src`` to device pointer ``dst`` on ``stream``.
        Both must be memory the stream's device can address: its own, or a peer's once
        ``enable_peer_access`` was called (else CUDA_ERROR_INVALID_VALUE); between devices,
        ``memcpy_peer_async`` works either way."""
        raise self._unsupported("memcpy_dtod_async")

    def memcpy_peer_async(self, dst: int, dst_ordinal: int, src: int, src_ordinal: int, nbytes: int,
                          stream: int) -> None:
        """Queue a copy of ``nbytes`` bytes from device pointer ``src`` of device ``src_ordinal`` to
        device pointer ``dst`` of device ``dst_ordinal`` on ``stream`` (a stream of either device;
        ``cuMemcpyPeerAsync``). Direct where peer access from the stream's device is enabled, staged
        through host memory by the driver where it is not; ordered on ``stream`` only."""
        raise self._unsupported("memcpy_peer_async")

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Queue setting ``nbytes`` bytes at device pointer ``ptr`` to the byte ``value`` on ``stream``."""
        raise self._unsupported("memset_d8_async")

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        """Queue setting ``count`` 32-bit words at device pointer ``ptr`` (4-byte aligned, else
        CUDA_ERROR_INVALID_VALUE) to ``value`` (0 .. 2**32 - 1, stored in the device's byte
        order, little-endian) on ``stream``. A byte pattern replicated into a word
        (``byte * 0x01010101``) fills ``4 * count`` bytes as ``memset_d8_async`` would, with
        word-wide stores: the faster fill of large aligned regions on a GPU."""
        raise self._unsupported("memset_d32_async")

    # -- streams -----------------------------------------------------------
    def stream_create(self, ordinal: int, priority: int = 0) -> int:
        """A new non-blocking stream on the device; returns its handle (never 0)."""
        raise self._unsupported("stream_create")

    def stream_destroy(self, stream: int) -> None:
        """Destroy ``stream`` (work already queued on it still completes)."""
        raise self._unsupported("stream_destroy")

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Work queued on ``stream`` after this call waits for the event's
        most recent record (as captured at call time). Blocks only ``stream``."""
        raise self._unsupported("stream_wait_event")

    def stream_query(self, stream: int) -> bool:
        """True when all work queued on ``stream`` has finished."""
        raise self._unsupported("stream_query")

    def stream_synchronize(self, stream: int) -> None:
        """Block the host until all work queued on ``stream`` has finished."""
        raise self._unsupported("stream_synchronize")

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on a host thread when ``stream`` reaches this point; the
        stream waits for it to return. ``fn`` must not call the backend."""
        raise self._unsupported("launch_host_func")

    # -- events ------------------------------------------------------------
    def event_create(self, ordinal: int, timing: bool = False) -> int:
        """A new event on device ``ordinal`` (able to measure time if ``timing``); returns its handle."""
        raise self._unsupported("event_create")

    def event_destroy(self, event: int) -> None:
        """Destroy ``event``."""
        raise self._unsupported("event_destroy")

    def event_record(self, event: int, stream: int) -> None:
        """Record ``event`` at the current end of ``stream``'s queued work."""
        raise self._unsupported("event_record")

    def event_query(self, event: int) -> bool:
        """True when the most recent record has been reached (or never recorded)."""
        raise self._unsupported("event_query")

    def event_synchronize(self, event: int) -> None:
        """Block the host until ``event``'s most recent record is reached."""
        raise self._unsupported("event_synchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between the records of the timing events ``start`` and ``end`` (both reached)."""
        raise self._unsupported("event_elapsed_ms")

    # -- virtual memory (exportable allocations, seeds/002) ----------------------
    def vmm_granularity(self, ordinal: int, recommended: bool = False) -> int:
        """Allocation granularity in bytes for a POSIX-fd-exportable device allocation."""
        raise self._unsupported("vmm_granularity")

    def vmm_create(self, ordinal: int, nbytes: int) -> int:
        """Physical memory (a multiple of the granularity), exportable as a POSIX fd.
        Returns the allocation handle."""
        raise self._unsupported("vmm_create")

    def vmm_release(self, handle: int) -> None:
        """Release a physical allocation handle (``cuMemRelease``); the memory goes once no mapping uses it."""
        raise self._unsupported("vmm_release")

    def vmm_export_fd(self, handle: int) -> int:
        """A new POSIX file descriptor for the allocation (the caller closes it)."""
        raise self._unsupported("vmm_export_fd")

    def vmm_import_fd(self, fd: int) -> int:
        """An allocation handle for memory exported by another process (fd stays the caller's)."""
        raise self._unsupported("vmm_import_fd")

    def vmm_reserve(self, ordinal: int, nbytes: int, alignment: int = 0) -> int:
        """Reserve a device virtual address range; returns its start."""
        raise self._unsupported("vmm_reserve")

    def vmm_free_address(self, ptr: int, nbytes: int) -> None:
        """Free a virtual address range from ``vmm_reserve`` (``cuMemAddressFree``); it must have no mappings."""
        raise self._unsupported("vmm_free_address")

    def vmm_map(self, ptr: int, nbytes: int, handle: int, offset: int = 0) -> None:
        """Map ``nbytes`` of the allocation ``handle``, from byte ``offset``, at the reserved address ``ptr`` (``cuMemMap``)."""
        raise self._unsupported("vmm_map")

    def vmm_unmap(self, ptr: int, nbytes: int) -> None:
        """Unmap a range. Does not order itself against queued work: synchronize first."""
        raise self._unsupported("vmm_unmap")

    def vmm_set_access(self, ordinal: int, ptr: int, nbytes: int) -> None:
        """Give ``ordinal`` read-write access to a mapped range."""
        raise self._unsupported("vmm_set_access")

    # -- host memory (backends whose device memory is host memory: ``host_memory``) --
    def host_view(self, ptr: int, nbytes: int) -> Any:
        """A writable uint8 NumPy view of ``nbytes`` bytes of device memory at ``ptr``
        (host kernels and debug guards use it); the range must lie in one live allocation."""
        raise self._unsupported("host_view", "device memory is not host memory on this backend")

    def host_address(self, ptr: int) -> int:
        """The host address backing device pointer ``ptr`` (interior pointers too)."""
        raise self._unsupported("host_address", "device memory is not host memory on this backend")

    def allocation_view(self, ptr: int) -> tuple[Any, int]:
        """The whole allocation holding ``ptr`` as a uint8 NumPy array, and ``ptr``'s offset
        in it (a host kernel's raw pointers are bounded by their allocation, as on a GPU)."""
        raise self._unsupported("allocation_view", "device memory is not host memory on this backend")

    def adopt_host_memory(self, ordinal: int, host: int, nbytes: int) -> tuple[int, bool]:
        """Make ``nbytes`` bytes of existing host memory at ``host`` addressable as device memory
        of ``ordinal`` (foreign CPU arrays adopted zero-copy through DLPack). Returns
        ``(device_ptr, adopted)``; ``adopted`` is False when the memory already was device
        memory of this backend (nothing to release). The caller keeps the host memory alive
        and, when ``adopted``, calls ``release_host_memory`` once done."""
        raise self._unsupported("adopt_host_memory", "device memory is not host memory on this backend")

    def release_host_memory(self, ordinal: int, ptr: int) -> None:
        """Forget memory adopted with ``adopt_host_memory`` (``ptr`` is the device pointer it returned)."""
        raise self._unsupported("release_host_memory", "device memory is not host memory on this backend")

    # -- kernels -----------------------------------------------------------------
    def kernel_compile(self, ordinal: int, source: str, name: str, options: tuple = ()) -> Any:
        """Compile CUDA C ``source`` for the device and return a launchable handle for
        the ``extern "C"`` function ``name``."""
        raise self._unsupported("kernel_compile")

    def kernel_launch(self, function: Any, grid: tuple, block: tuple, shared_mem: int, stream: int,
                      params: Sequence[Any]) -> None:
        """Queue ``function`` on ``stream``. ``params`` are ctypes values, one per kernel
        parameter (the emulator takes a Python callable as ``function`` and no params)."""
        raise self._unsupported("kernel_launch")


# -- fork: the stand-in an inherited backend becomes (Backend.mark_forked) -----------------
# What a backend inherited through fork() refuses: every operation of OPS and the host-memory methods.
REFUSED_AFTER_FORK: tuple[str, ...] = (*OPS, "host_view", "host_address", "allocation_view", "adopt_host_memory",
                                       "release_host_memory")
_forked_classes: dict[type, type] = {}


def _refuse(name: str) -> Callable[..., Any]:
    what = f"call {OPS[name]} ({name})" if name in OPS else f"use {name}"

    def refused(self: Backend, *args: Any, **kwargs: Any) -> Any:
        raise self.forked_error(what)

    refused.__name__ = name
    refused.__doc__ = "Raises ``ForkedProcessError``: this backend was inherited through fork()."
    return refused


def _forked_class(cls: type) -> type:
    """``cls``'s forked stand-in: a subclass whose ``REFUSED_AFTER_FORK`` methods only raise."""
    forked = _forked_classes.get(cls)
    if forked is None:
        ns: dict[str, Any] = {name: _refuse(name) for name in REFUSED_AFTER_FORK}
        ns.update(__module__=cls.__module__, _forked_stand_in=True,
                  __doc__=f"A {cls.__name__} inherited through fork(): its operations raise ForkedProcessError.")
        forked = _forked_classes.setdefault(cls, type(f"Forked{cls.__name__}", (cls,), ns))
    return forked
