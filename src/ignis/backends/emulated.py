"""The emulated backend: a real asynchronous model of a CUDA device on the host.

Design:
- Device memory is host memory. Each allocation is an ``np.empty`` uint8
  buffer (untouched pages cost nothing) placed at a fake 64-bit device address
  in a 1 TiB window per device (``0x7e00_0000_0000 + (ordinal << 40)``),
  256-byte aligned; the host buffer has the same alignment, so pointer
  arithmetic, interior pointers and views behave as on a GPU. Freed addresses
  are reused (same rounded size, last freed first), as a driver would.
- Every stream is a FIFO worked by its own daemon thread. Copies, memsets,
  event records, event waits, host functions and async frees are queue items;
  the enqueueing call only validates and appends. Copies run as
  ``ctypes.memmove`` / ``ctypes.memset``, which drop the GIL, so streams
  really overlap.
- A stream counts items submitted and completed. An event record is
  (stream, ticket): it is reached when the stream has completed that many
  items. Waits, queries and synchronizes compare those counters, so a wait on
  an event blocks only the waiting stream's worker.
- Optional jitter (``IGNIS_EMU_JITTER=SEED[:MAX_US]``): each item sleeps a
  seeded random time before it runs, to widen race windows.

Rules:
- Ranges are checked at enqueue time: every byte of (ptr, nbytes) must lie in
  one live allocation, else ``CUDA_ERROR_INVALID_VALUE`` naming the call. A
  pointer whose async free is queued is no longer live for new work, but its
  bytes stay counted until the stream reaches the free.
- Devices are separate, as GPUs are: a device-to-device copy queued on a
  stream touches memory of the stream's device, or of a peer that device was
  given access to (``enable_peer_access``, where the backend's
  ``peer_access`` allows it); else CUDA_ERROR_INVALID_VALUE. A copy between
  devices without that goes through ``memcpy_peer_async``.
- Queued items hold references to the buffers they touch, so a free or a
  context rebuild never leaves a worker writing to released host memory.
- An exception in a queued item (a host function) makes the stream's error
  sticky, and the device's: every later synchronize or query of that stream,
  of events recorded on it, and ``device_synchronize`` raise
  ``CUDA_ERROR_LAUNCH_FAILED`` with the exception text, until
  ``rebuild_context``. Later items still run, so nothing waiting on them hangs.
- A failure travels along waits, as a GPU's sticky error does: a stream that
  waits on an event whose record comes after (or is) a failed item of its
  stream fails too when it reaches the wait, with an error that names the
  stream it waited on; so do its later synchronizes and queries and the events
  recorded on it afterwards. A wait on a record made before the failure
  passes (the work it waits for succeeded).
- Fork: the worker threads do not exist in a child made by ``fork()``, so a
  backend that had streams or initialized devices is unusable there (see
  ``ignis.backends``); every operation raises ``ForkedProcessError``.
- Handles are never reused. A destroyed stream drains its queue, then its
  worker exits; a context rebuild drops queued work at once.
- Timings are host ``time.perf_counter()`` readings taken when a worker
  reaches a record; they say nothing about a GPU.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import os
import random
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

import numpy as np

from .base import OPS, Backend, DeviceProperties, driver_error
from .trace import emit
from ..units import parse_bytes
from .vmm_emulated import EmulatedVmm, _Alloc

__all__ = ["EmulatedBackend"]

ALIGNMENT = 256                      # device allocation alignment (cudaMalloc gives >= 256)
HOST_ALIGNMENT = 4096                # pinned host memory is page aligned
_ADDRESS_BASE = 0x7E00_0000_0000     # first device's address window
_WINDOW_BITS = 40                    # 1 TiB of address space per device
_MAX_DEVICES = 64
_DEFAULT_DEVICES = 2
_DEFAULT_MEMORY = 4 << 30
_DEFAULT_JITTER_US = 200.0


def _parse_bytes(text: "str | int", var: str) -> int:
    try:
        return parse_bytes(text, var)
    except ValueError as e:
        raise ValueError(f"{var}={text!r} is not a byte count; use e.g. 4294967296, 512MiB or 4GiB") from e


def _parse_jitter(text: str) -> tuple[int, float]:
    seed, _, max_us = text.partition(":")
    try:
        jitter = int(seed), float(max_us) if max_us else _DEFAULT_JITTER_US
        if jitter[1] >= 0:
            return jitter
    except ValueError:
        pass
    raise ValueError(f"IGNIS_EMU_JITTER={text!r} is not valid; use SEED or SEED:MAX_US, "
                     f"e.g. 1234 or 1234:500")


class _Device:
    """One device's memory: allocations by base address, and its streams."""

    def __init__(self, ordinal: int, total: int) -> None:
        self.ordinal = ordinal
        self.total = total
        self.window = _ADDRESS_BASE + (ordinal << _WINDOW_BITS)
        self.limit = self.window + (1 << _WINDOW_BITS)
        self.lock = threading.Lock()
        self.streams: set[_Stream] = set()  # live and draining
        self.error: str | None = None       # sticky: first failure on any stream
        self.peers: set[int] = set()        # devices whose memory work here may address (enable_peer_access)
        self.reset()

    def reset(self) -> None:
        self.live = 0
        self.allocs: dict[int, _Alloc] = {}
        self.bases: list[int] = []              # sorted keys of allocs
        self.free_addrs: dict[int, list[int]] = {}  # span -> reusable addresses
        self.bump = self.window

    def allocate(self, nbytes: int, call: str) -> int:
        if type(nbytes) is not int or nbytes <= 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"cannot allocate {nbytes!r} bytes")
        span = (nbytes + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
        with self.lock:
            if self.live + nbytes > self.total:
                raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                                   f"device {self.ordinal}: {nbytes} bytes requested, "
                                   f"{self.total - self.live} of {self.total} free")
            addr = self._address(span, call)
            try:
                buf = np.empty(nbytes + ALIGNMENT - 1, dtype=np.uint8)
            except MemoryError:
                self.free_addrs.setdefault(span, []).append(addr)
                raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                                   f"the host could not back {nbytes} bytes") from None
            host = buf.ctypes.data
            skip = -host % ALIGNMENT
            buf = buf[skip:skip + nbytes]
            self.allocs[addr] = _Alloc(addr, nbytes, span, buf, host + skip)
            bisect.insort(self.bases, addr)
            self.live += nbytes
        return addr

    def _address(self, span: int, call: str) -> int:
        reuse = self.free_addrs.get(span)
        if reuse:
            return reuse.pop()
        addr = self.bump
        if addr + span > self.limit:
            # Window exhausted: forget the free lists, restart above the top
            # live allocation, and as a last resort take the first gap.
            self.free_addrs.clear()
            top = self.window
            if self.bases:
                last = self.allocs[self.bases[-1]]
                top = last.base + last.span
            addr = top
            if addr + span > self.limit:
                addr = self._first_gap(span, call)
                return addr
        self.bump = addr + span
        return addr

    def _first_gap(self, span: int, call: str) -> int:
        prev_end = self.window
        for base in self.bases:
            if base - prev_end >= span:
                return prev_end
            prev_end = base + self.allocs[base].span
        raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                           f"device {self.ordinal}: address space exhausted")

    def _base(self, ptr: int, call: str) -> _Alloc:
        alloc = self.allocs.get(ptr)
        if alloc is None or alloc.freeing:
            why = "its free is already queued" if alloc else "it is not a live allocation of this device"
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"cannot free {ptr!r} on device {self.ordinal}: {why}")
        return alloc

    def free(self, ptr: int, call: str) -> None:
        with self.lock:
            self._drop(self._base(ptr, call))

    def retire(self, ptr: int, call: str) -> _Alloc:
        """Mark ``ptr`` as having a queued free: no new work, bytes still counted."""
        with self.lock:
            alloc = self._base(ptr, call)
            alloc.freeing = True
            return alloc

    def release(self, alloc: _Alloc) -> None:
        """Forget ``alloc`` (no-op if a context rebuild already dropped it)."""
        with self.lock:
            if self.allocs.get(alloc.base) is alloc:
                self._drop(alloc)

    def _drop(self, alloc: _Alloc) -> None:
        del self.allocs[alloc.base]
        del self.bases[bisect.bisect_left(self.bases, alloc.base)]
        self.live -= alloc.nbytes
        self.free_addrs.setdefault(alloc.span, []).append(alloc.base)

    def find(self, ptr: int, nbytes: int, call: str) -> _Alloc:
        """The live allocation holding every byte of [ptr, ptr + nbytes)."""
        with self.lock:
            i = bisect.bisect_right(self.bases, ptr) - 1
            alloc = self.allocs[self.bases[i]] if i >= 0 else None
        if alloc is None or ptr + nbytes > alloc.base + alloc.nbytes:
            if alloc is not None and ptr < alloc.base + alloc.nbytes:
                what = (f"runs {ptr + nbytes - alloc.base - alloc.nbytes} bytes past the end of "
                        f"the {alloc.nbytes}-byte allocation at {alloc.base:#x}")
            else:
                what = "is not inside a live allocation"
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"device range [{ptr:#x}, +{nbytes}) on device {self.ordinal} {what}")
        if alloc.freeing:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"device pointer {ptr:#x} is in an allocation whose free is queued")
        return alloc


class _Stream:
    """A FIFO of (func, args, keepalive) items worked by one daemon thread."""

    __slots__ = ("handle", "device", "priority", "closed", "dead", "error", "failed_at", "_lock", "_has_work",
                 "_progress", "_queue", "_submitted", "_completed", "_idle", "_waiters", "_rng",
                 "_max_s")

    def __init__(self, handle: int, device: _Device, priority: int,
                 jitter: tuple[int, float] | None) -> None:
        self.handle = handle
        self.device = device
        self.priority = priority
        self.closed = False        # destroyed: no new work; the worker exits once drained
        self.dead = False          # context rebuilt: queued work dropped
        self.error: str | None = None
        self.failed_at = 0         # ticket of the first item that failed (0: none)
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._queue: deque[tuple[Callable[..., Any], tuple, Any]] = deque()
        self._submitted = 0
        self._completed = 0
        self._idle = False
        self._waiters = 0
        self._rng = random.Random(f"{jitter[0]}/{handle}") if jitter else None
        self._max_s = jitter[1] / 1e6 if jitter else 0.0
        threading.Thread(target=self._work, name=f"ignis-emulated-stream-{handle}",
                         daemon=True).start()

    def enqueue(self, func: Callable[..., Any], args: tuple, keep: Any = None) -> int:
        """Append an item; returns its ticket (1-based), or 0 if the stream is closed."""
        with self._lock:
            if self.closed:
                return 0
            self._queue.append((func, args, keep))
            self._submitted = n = self._submitted + 1
            if self._idle:
                self._has_work.notify()
        return n

    def reached(self, ticket: int) -> bool:
        return self._completed >= ticket

    def drained(self) -> bool:
        with self._lock:
            return self._completed == self._submitted

    def submitted(self) -> int:
        return self._submitted

    def wait_for(self, ticket: int) -> bool:
        """Block until ``ticket`` is reached; False if the stream died first."""
        if self._completed >= ticket:
            return True
        with self._lock:
            self._waiters += 1
            try:
                while self._completed < ticket and not self.dead:
                    self._progress.wait()
            finally:
                self._waiters -= 1
            return self._completed >= ticket

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._has_work.notify()

    def kill(self) -> None:
        with self._lock:
            self.closed = self.dead = True
            self._queue.clear()
            self._has_work.notify()
            self._progress.notify_all()

    def _work(self) -> None:
        lock, queue, rng, max_s = self._lock, self._queue, self._rng, self._max_s
        while True:
            with lock:
                while not queue:
                    if self.closed:
                        with self.device.lock:
                            self.device.streams.discard(self)
                        return
                    self._idle = True
                    self._has_work.wait()
                    self._idle = False
                func, args, keep = queue.popleft()
            if rng is not None:
                time.sleep(rng.random() * max_s)
            try:
                func(*args)
            except BaseException as exc:  # any failure becomes the stream's sticky error
                if self.error is None:
                    if isinstance(exc, _WaitedOnFailure):
                        self.error = str(exc)
                    else:
                        name = getattr(func, "__qualname__", None) or repr(func)
                        self.error = f"{name} raised {type(exc).__name__}: {exc}"
                    self.failed_at = self._completed + 1
                    if self.device.error is None and not self.dead:  # not into a rebuilt context
                        self.device.error = f"stream {self.handle}: {self.error}"
            del func, args, keep
            with lock:
                self._completed += 1
                if self._waiters:
                    self._progress.notify_all()


class _WaitedOnFailure(Exception):
    """Raised by a wait item whose awaited work failed: the waiting stream fails too."""


def _wait_item(src: "_Stream", ticket: int) -> None:
    """A queued stream wait: block this worker until ``src`` reaches ``ticket``; then
    pass on ``src``'s failure if the awaited work includes it."""
    src.wait_for(ticket)
    if src.failed_at and src.failed_at <= ticket:
        raise _WaitedOnFailure(f"waited on an event of stream {src.handle}, which failed: {src.error}")


class _Record:
    """One event record: reached when its stream completes ``ticket`` items."""

    __slots__ = ("stream", "ticket", "time")

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream
        self.ticket = 1 << 62   # set right after the enqueue, before anyone sees it
        self.time: float | None = None

    def reach(self) -> None:
        self.time = time.perf_counter()

    def done(self) -> bool:
        return self.stream.reached(self.ticket)


class _Event:
    __slots__ = ("handle", "device", "timing", "latest")

    def __init__(self, handle: int, device: _Device, timing: bool) -> None:
        self.handle = handle
        self.device = device
        self.timing = timing
        self.latest: _Record | None = None


class EmulatedBackend(EmulatedVmm, Backend):
    """CUDA-like devices emulated on the host; see the module docstring.

    ``devices`` (default ``IGNIS_EMULATED_DEVICES`` or 2), ``memory`` (bytes per
    device, default ``IGNIS_EMULATED_MEMORY`` or 4 GiB; "512MiB" style strings
    accepted), ``jitter`` (``(seed, max_us)``, a bare seed, ``False`` for
    none; default ``IGNIS_EMU_JITTER``) and ``peer_access`` (whether the devices
    can be given access to each other's memory, as NVLink or PCIe peer-to-peer
    allows; default ``IGNIS_EMULATED_PEER_ACCESS`` or true) override the environment.
    Emulated timings (``event_elapsed_ms``) are host times and mean nothing
    about a GPU.
    """

    name = "emulated"
    host_memory = True    # device memory is NumPy host memory: host views, DLPack as CPU memory
    host_kernels = True   # a kernel is a Python callable over NumPy views (a Kernel's host_impl)

    def __init__(self, devices: int | None = None, memory: int | str | None = None,
                 jitter: tuple[int, float] | int | bool | None = None, peer_access: bool | None = None) -> None:
        super().__init__()
        if peer_access is None:
            text = os.environ.get("IGNIS_EMULATED_PEER_ACCESS", "").strip().lower()
            if text not in ("", "0", "1", "false", "true", "no", "yes"):
                raise ValueError(f"IGNIS_EMULATED_PEER_ACCESS={text!r} is not valid; use 1 (peers can "
                                 "access each other, the default) or 0 (they cannot)")
            peer_access = text not in ("0", "false", "no")
        self.peer_access = bool(peer_access)
        if devices is None:
            text = os.environ.get("IGNIS_EMULATED_DEVICES", "").strip()
            try:
                devices = int(text) if text else _DEFAULT_DEVICES
            except ValueError:
                raise ValueError(f"IGNIS_EMULATED_DEVICES={text!r} is not an integer") from None
        if not 0 <= devices <= _MAX_DEVICES:
            raise ValueError(f"the emulated backend supports 0 to {_MAX_DEVICES} devices, got {devices}")
        if memory is None:
            text = os.environ.get("IGNIS_EMULATED_MEMORY", "").strip()
            memory = _parse_bytes(text, "IGNIS_EMULATED_MEMORY") if text else _DEFAULT_MEMORY
        elif isinstance(memory, str):
            memory = _parse_bytes(memory, "memory")
        if not 0 < memory <= 1 << _WINDOW_BITS:
            raise ValueError(f"emulated device memory must be 1 byte to 1 TiB, got {memory}")
        if jitter is None:
            text = os.environ.get("IGNIS_EMU_JITTER", "").strip()
            jitter = _parse_jitter(text) if text else None
        elif jitter is False:
            jitter = None
        elif isinstance(jitter, int) and not isinstance(jitter, bool):
            jitter = (jitter, _DEFAULT_JITTER_US)
        elif isinstance(jitter, tuple) and len(jitter) == 2 and float(jitter[1]) >= 0:
            jitter = (int(jitter[0]), float(jitter[1]))
        else:
            raise ValueError(f"jitter must be (seed, max_us), a seed, False or None; got {jitter!r}")
        self.jitter: tuple[int, float] | None = jitter
        self._devices = [_Device(i, memory) for i in range(devices)]
        self._lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._stream_ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._pinned: dict[int, np.ndarray] = {}

    # -- lookups -------------------------------------------------------------
    def _device(self, ordinal: int, call: str) -> _Device:
        if type(ordinal) is int and 0 <= ordinal < len(self._devices):
            return self._devices[ordinal]
        raise driver_error("CUDA_ERROR_INVALID_DEVICE", call,
                           f"device {ordinal!r} does not exist; {len(self._devices)} emulated "
                           f"device(s) (IGNIS_EMULATED_DEVICES)")

    def _stream(self, handle: int, call: str) -> _Stream:
        s = self._streams.get(handle)
        if s is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                               f"stream {handle!r} was destroyed or never created")
        return s

    def _event(self, handle: int, call: str) -> _Event:
        e = self._events.get(handle)
        if e is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                               f"event {handle!r} was destroyed or never created")
        return e

    def _owner(self, ptr: int, call: str) -> _Device:
        if type(ptr) is int:
            i = (ptr - _ADDRESS_BASE) >> _WINDOW_BITS
            if 0 <= i < len(self._devices):
                return self._devices[i]
        raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                           f"{ptr!r} is not an emulated device pointer")

    def _find(self, ptr: int, nbytes: int, call: str) -> _Alloc:
        return self._owner(ptr, call).find(ptr, nbytes, call)

    @staticmethod
    def _check_size(nbytes: int, call: str) -> None:
        if type(nbytes) is not int or nbytes < 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"byte count {nbytes!r} is not valid")

    def _put(self, s: _Stream, call: str, func: Callable[..., Any], args: tuple,
             keep: Any = None) -> int:
        ticket = s.enqueue(func, args, keep)
        if not ticket:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call, f"stream {s.handle} was destroyed")
        return ticket

    @staticmethod
    def _raise_sticky(error: str | None, call: str) -> None:
        if error is not None:
            raise driver_error("CUDA_ERROR_LAUNCH_FAILED", call, error)

    # -- host memory (the protocol's host_memory methods) ---------------------------
    def host_view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A writable uint8 NumPy view of ``nbytes`` of device memory at ``ptr``
        (kernels and debug guards use it). Raises ``DriverError``
        CUDA_ERROR_INVALID_VALUE unless the range lies in one live allocation."""
        self._check_size(nbytes, "host_view")
        if nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        alloc = self._find(ptr, nbytes, "host_view")
        off = ptr - alloc.base
        return alloc.buf[off:off + nbytes]

    def host_address(self, ptr: int) -> int:
        """The host address backing device pointer ``ptr`` (interior pointers too)."""
        alloc = self._find(ptr, 0, "host_address")
        return alloc.host + (ptr - alloc.base)

    def adopt_host_memory(self, ordinal: int, host: int, nbytes: int) -> tuple[int, bool]:
        """Make ``nbytes`` of existing host memory at ``host`` addressable
        as device memory of ``ordinal`` (so foreign CPU arrays can be adopted zero-copy
        through DLPack). Memory that already backs an emulated allocation maps back to
        its device address. Counted as used until ``release_host_memory``; the caller
        keeps the host memory alive. Returns ``(device_ptr, adopted)``: ``adopted`` is
        False when the memory already was emulated device memory (nothing to release)."""
        dev = self._device(ordinal, "adopt_host_memory")
        self._check_size(nbytes, "adopt_host_memory")
        with dev.lock:
            for alloc in dev.allocs.values():
                if alloc.host <= host and host + nbytes <= alloc.host + alloc.nbytes and not alloc.freeing:
                    return alloc.base + (host - alloc.host), False
        span = (max(nbytes, 1) + ALIGNMENT - 1) & ~(ALIGNMENT - 1)
        buf = (np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(host)) if nbytes
               else np.empty(0, np.uint8))
        with dev.lock:
            addr = dev._address(span, "adopt_host_memory")
            dev.allocs[addr] = _Alloc(addr, nbytes, span, buf, host)
            bisect.insort(dev.bases, addr)
            dev.live += nbytes
        return addr, True

    def release_host_memory(self, ordinal: int, ptr: int) -> None:
        """Forget memory adopted with ``adopt_host_memory``."""
        self._device(ordinal, "release_host_memory").free(ptr, "release_host_memory")

    def allocation_view(self, ptr: int) -> tuple[np.ndarray, int]:
        """The whole allocation holding ``ptr`` as uint8, and ``ptr``'s
        offset in it (kernels' raw pointers are bounded by their allocation, as on a GPU)."""
        alloc = self._find(ptr, 0, "allocation_view")
        return alloc.buf, ptr - alloc.base

    # -- kernels -------------------------------------------------------------------
    def kernel_compile(self, ordinal: int, source: str, name: str, options: tuple = ()) -> Any:
        raise self._unsupported(f"compiling CUDA source (kernel {name!r})",
                                "the emulator runs a Kernel's host_impl instead")

    def kernel_launch(self, function: Any, grid: tuple, block: tuple, shared_mem: int, stream: int,
                      params: Any = ()) -> None:
        """Queue ``function`` (a Python callable: a Kernel's host_impl bound to its
        arguments) on the stream. An exception in it fails the stream like a faulting
        kernel (a sticky CUDA_ERROR_LAUNCH_FAILED)."""
        call = OPS["kernel_launch"]
        if not callable(function):
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call, f"{function!r} is not a host kernel")
        self._put(self._stream(stream, call), call, function, ())

    # -- devices ---------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._devices)

    def device_properties(self, ordinal: int) -> DeviceProperties:
        dev = self._device(ordinal, "cuDeviceGet")
        ident = uuid.uuid5(uuid.NAMESPACE_URL, f"ignis-emulated-device/{ordinal}")
        return DeviceProperties(
            ordinal=ordinal, name=f"Ignis Emulated Device {ordinal}", total_memory=dev.total,
            multiprocessor_count=4, compute_capability=(9, 0), uuid=f"GPU-{ident}",
            vmm_supported=True, memory_pools_supported=True, posix_fd_ipc_supported=True,
            extra={"emulated": True, "address_window": dev.window, "alignment": ALIGNMENT,
                   "jitter": self.jitter})

    def versions(self) -> dict[str, str]:
        return {"emulator": "1", "numpy": np.__version__}

    def init_device(self, ordinal: int) -> None:
        self._device(ordinal, OPS["init_device"])
        self._used = True

    def set_current(self, ordinal: int) -> None:
        """No-op: the emulator has no per-thread context."""

    def rebuild_context(self, ordinal: int) -> None:
        """Like a primary-context reset: free every allocation of the device,
        invalidate its streams and events (queued work is dropped; an item
        already running finishes) and clear its sticky error. Pinned host
        memory is process-wide and survives."""
        dev = self._device(ordinal, OPS["rebuild_context"])
        # Lock order everywhere: stream lock, then device lock, then self._lock.
        with dev.lock:
            with self._lock:
                for h in [h for h, s in self._streams.items() if s.device is dev]:
                    del self._streams[h]
                for h in [h for h, e in self._events.items() if e.device is dev]:
                    del self._events[h]
            streams = list(dev.streams)
            dev.streams.clear()
            dev.reset()
            dev.error = None
            dev.peers.clear()
        for other in self._devices:  # the others' mappings of this context's memory are gone too
            other.peers.discard(ordinal)
        for s in streams:
            s.kill()

    def device_synchronize(self, ordinal: int) -> None:
        """Wait for all work queued on the device's streams (destroyed ones still
        draining included). Raises CUDA_ERROR_LAUNCH_FAILED if any stream of the
        device has failed since the last context rebuild."""
        dev = self._device(ordinal, OPS["device_synchronize"])
        with dev.lock:
            streams = list(dev.streams)
        targets = [(s, s.submitted()) for s in streams]
        for s, ticket in targets:
            s.wait_for(ticket)
        self._raise_sticky(dev.error, OPS["device_synchronize"])
        if self._trace:
            emit(self._trace, "on_device_synchronize", ordinal)

    def device_can_access_peer(self, ordinal: int, peer: int) -> bool:
        """True for two different devices when the backend was made with peer access (the default)."""
        call = OPS["device_can_access_peer"]
        self._device(ordinal, call)
        self._device(peer, call)
        return self.peer_access and ordinal != peer

    def enable_peer_access(self, ordinal: int, peer: int) -> None:
        """From now on (until either device's context is rebuilt) work queued on ``ordinal``'s
        streams may address ``peer``'s memory (``memcpy_dtod_async`` between them)."""
        call = OPS["enable_peer_access"]
        dev = self._device(ordinal, call)
        self._device(peer, call)
        if not self.device_can_access_peer(ordinal, peer):
            why = ("a device does not need peer access to itself" if ordinal == peer else
                   "this emulated machine has no peer-to-peer path (peer_access=False, IGNIS_EMULATED_PEER_ACCESS=0)")
            raise driver_error("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", call,
                               f"device {ordinal} cannot access device {peer}'s memory: {why}")
        with dev.lock:
            dev.peers.add(peer)

    # -- memory ------------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int) -> int:
        call = OPS["mem_alloc"]
        return self._device(ordinal, call).allocate(nbytes, call)

    def mem_free(self, ordinal: int, ptr: int) -> None:
        call = OPS["mem_free"]
        self._device(ordinal, call).free(ptr, call)

    def mem_alloc_async(self, ordinal: int, nbytes: int, stream: int) -> int:
        """The address is reserved at once; the emulator has no pool to order."""
        call = OPS["mem_alloc_async"]
        dev = self._device(ordinal, call)
        self._same_device(self._stream(stream, call), dev, call)
        return dev.allocate(nbytes, call)

    def mem_free_async(self, ordinal: int, ptr: int, stream: int) -> None:
        """The bytes stay counted, and the address unusable, until ``stream``
        reaches the free; no work may be queued on ``ptr`` after this call."""
        call = OPS["mem_free_async"]
        dev = self._device(ordinal, call)
        s = self._stream(stream, call)
        self._same_device(s, dev, call)
        alloc = dev.retire(ptr, call)
        if not s.enqueue(dev.release, (alloc,)):
            alloc.freeing = False
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call, f"stream {stream} was destroyed")

    @staticmethod
    def _same_device(s: _Stream, dev: _Device, call: str) -> None:
        if s.device is not dev:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"stream {s.handle} belongs to device {s.device.ordinal}, "
                               f"not device {dev.ordinal}")

    def mem_get_info(self, ordinal: int) -> tuple[int, int]:
        dev = self._device(ordinal, OPS["mem_get_info"])
        with dev.lock:
            return dev.total - dev.live, dev.total

    def mem_pool_trim(self, ordinal: int, keep_bytes: int = 0) -> None:
        """No-op: the emulator caches nothing."""
        self._device(ordinal, OPS["mem_pool_trim"])

    def host_alloc(self, nbytes: int) -> int:
        call = OPS["host_alloc"]
        if type(nbytes) is not int or nbytes <= 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"cannot allocate {nbytes!r} bytes")
        try:
            buf = np.empty(nbytes + HOST_ALIGNMENT - 1, dtype=np.uint8)
        except MemoryError:
            raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                               f"the host could not allocate {nbytes} bytes") from None
        addr = buf.ctypes.data
        skip = -addr % HOST_ALIGNMENT
        with self._lock:
            self._pinned[addr + skip] = buf
        return addr + skip

    def host_free(self, ptr: int) -> None:
        with self._lock:
            buf = self._pinned.pop(ptr, None)
        if buf is None:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", OPS["host_free"],
                               f"{ptr!r} is not a live pinned host allocation")

    # -- copies (ranges checked now, bytes moved when the stream gets there) -------
    def memcpy_htod_async(self, dst: int, src_host: int, nbytes: int, stream: int) -> None:
        call = OPS["memcpy_htod_async"]
        s = self._stream(stream, call)
        self._check_size(nbytes, call)
        if nbytes == 0:
            return
        self._check_host(src_host, call)
        alloc = self._owner(dst, call).find(dst, nbytes, call)
        self._put(s, call, ctypes.memmove, (alloc.host + (dst - alloc.base), src_host, nbytes),
                  alloc.buf)

    def memcpy_dtoh_async(self, dst_host: int, src: int, nbytes: int, stream: int) -> None:
        call = OPS["memcpy_dtoh_async"]
        s = self._stream(stream, call)
        self._check_size(nbytes, call)
        if nbytes == 0:
            return
        self._check_host(dst_host, call)
        alloc = self._owner(src, call).find(src, nbytes, call)
        self._put(s, call, ctypes.memmove, (dst_host, alloc.host + (src - alloc.base), nbytes),
                  alloc.buf)

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Both pointers must be memory the stream's device addresses: its own, or a peer's it
        was given access to (``enable_peer_access``); else CUDA_ERROR_INVALID_VALUE, as the driver."""
        call = OPS["memcpy_dtod_async"]
        s = self._stream(stream, call)
        self._check_size(nbytes, call)
        if nbytes == 0:
            return
        d = self._reachable(s, dst, call).find(dst, nbytes, call)
        a = self._reachable(s, src, call).find(src, nbytes, call)
        self._put(s, call, ctypes.memmove,
                  (d.host + (dst - d.base), a.host + (src - a.base), nbytes), (d.buf, a.buf))

    def memcpy_peer_async(self, dst: int, dst_ordinal: int, src: int, src_ordinal: int, nbytes: int,
                          stream: int) -> None:
        """A copy between the memory of two devices, queued on a stream of either. The driver copies
        directly where peer access is enabled and stages through host memory where it is not; here both
        are one host copy when the stream gets there."""
        call = OPS["memcpy_peer_async"]
        s = self._stream(stream, call)
        dd, sd = self._device(dst_ordinal, call), self._device(src_ordinal, call)
        self._check_size(nbytes, call)
        if s.device is not dd and s.device is not sd:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"stream {stream} is on device {s.device.ordinal}, neither the source's device "
                               f"{src_ordinal} nor the destination's {dst_ordinal}")
        if nbytes == 0:
            return
        for ptr, dev, role in ((dst, dd, "destination"), (src, sd, "source")):
            if self._owner(ptr, call) is not dev:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"the {role} {ptr:#x} is not memory of device {dev.ordinal}")
        d = dd.find(dst, nbytes, call)
        a = sd.find(src, nbytes, call)
        self._put(s, call, ctypes.memmove,
                  (d.host + (dst - d.base), a.host + (src - a.base), nbytes), (d.buf, a.buf))

    def _reachable(self, s: _Stream, ptr: int, call: str) -> _Device:
        """The device of ``ptr``, which work on ``s`` must be able to address."""
        dev = self._owner(ptr, call)
        here = s.device
        if dev is not here and dev.ordinal not in here.peers:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"device pointer {ptr:#x} is memory of device {dev.ordinal}, but stream {s.handle} "
                               f"is on device {here.ordinal}, which has no peer access to it; copy between devices "
                               f"with memcpy_peer_async, or enable_peer_access({here.ordinal}, {dev.ordinal}) first")
        return dev

    def memset_d8_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        call = OPS["memset_d8_async"]
        s = self._stream(stream, call)
        self._check_size(nbytes, call)
        if type(value) is not int or not 0 <= value <= 0xFF:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"byte value {value!r} is not in 0..255")
        if nbytes == 0:
            return
        alloc = self._owner(ptr, call).find(ptr, nbytes, call)
        self._put(s, call, ctypes.memset, (alloc.host + (ptr - alloc.base), value, nbytes),
                  alloc.buf)

    def memset_d32_async(self, ptr: int, value: int, count: int, stream: int) -> None:
        """Fill ``count`` words on the stream's worker, as the driver does: ``ptr`` must be
        4-byte aligned (else CUDA_ERROR_INVALID_VALUE, as cuMemsetD32Async). A word whose
        four bytes are equal (a replicated byte, the common case) is a ``ctypes.memset``,
        any other a NumPy fill over the words (little-endian, as on a GPU)."""
        call = OPS["memset_d32_async"]
        s = self._stream(stream, call)
        if type(count) is not int or count < 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"word count {count!r} is not valid")
        if type(value) is not int or not 0 <= value <= 0xFFFFFFFF:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"32-bit value {value!r} is not in 0..2**32-1")
        if type(ptr) is int and ptr & 3:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"device pointer {ptr:#x} is not 4-byte aligned; a 32-bit memset needs an "
                               "aligned destination (fill an unaligned head or tail with memset_d8_async)")
        if count == 0:
            return
        nbytes = 4 * count
        alloc = self._owner(ptr, call).find(ptr, nbytes, call)
        off = ptr - alloc.base
        if value == (value & 0xFF) * 0x01010101:
            self._put(s, call, ctypes.memset, (alloc.host + off, value & 0xFF, nbytes), alloc.buf)
        else:
            words = alloc.buf[off:off + nbytes].view("<u4")
            self._put(s, call, words.fill, (value,), alloc.buf)

    @staticmethod
    def _check_host(addr: int, call: str) -> None:
        if type(addr) is not int or addr <= 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"host address {addr!r} is not valid")

    # -- streams -----------------------------------------------------------------
    def stream_create(self, ordinal: int, priority: int = 0) -> int:
        """A new stream with its own worker thread; ``priority`` is accepted and ignored."""
        dev = self._device(ordinal, OPS["stream_create"])
        self._used = True  # a worker thread exists from now on: a forked child cannot use this backend
        handle = next(self._stream_ids)
        s = _Stream(handle, dev, priority, self.jitter)
        with dev.lock:  # atomic with respect to rebuild_context
            dev.streams.add(s)
            with self._lock:
                self._streams[handle] = s
        return handle

    def stream_destroy(self, stream: int) -> None:
        """The handle is invalid at once; queued work still runs, then the worker exits."""
        with self._lock:
            s = self._streams.pop(stream, None)
        if s is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", OPS["stream_destroy"],
                               f"stream {stream!r} was destroyed or never created")
        s.close()
        if self._trace:
            emit(self._trace, "on_stream_destroyed", stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        call = OPS["stream_wait_event"]
        s = self._stream(stream, call)
        rec = self._event(event, call).latest
        # Nothing to queue when never recorded, in FIFO order (the same stream), or already
        # reached with the work before it succeeded.
        if rec is not None and rec.stream is not s:
            src = rec.stream
            if not rec.done() or (src.failed_at and src.failed_at <= rec.ticket):
                self._put(s, call, _wait_item, (src, rec.ticket), rec)
        if self._trace:
            emit(self._trace, "on_stream_wait_event", stream, event)

    def stream_query(self, stream: int) -> bool:
        """True when nothing is queued or running. A failed stream raises its
        sticky CUDA_ERROR_LAUNCH_FAILED, as cuStreamQuery does."""
        call = OPS["stream_query"]
        s = self._stream(stream, call)
        self._raise_sticky(s.error, call)
        done = s.drained()
        if done and self._trace:
            emit(self._trace, "on_stream_synchronize", stream)
        return done

    def stream_synchronize(self, stream: int) -> None:
        """Wait for everything queued before this call. Raises
        CUDA_ERROR_LAUNCH_FAILED (with the exception text) if an item of this
        stream raised; the error stays until ``rebuild_context``."""
        call = OPS["stream_synchronize"]
        s = self._stream(stream, call)
        if not s.wait_for(s.submitted()):
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                               f"stream {stream} was lost to a context rebuild while waiting")
        self._raise_sticky(s.error, call)
        if self._trace:
            emit(self._trace, "on_stream_synchronize", stream)

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the stream's worker thread. If it raises, the stream's
        error becomes sticky (see ``stream_synchronize``). ``fn`` must not call
        the backend (as in CUDA); a synchronize from it would deadlock."""
        call = OPS["launch_host_func"]
        if not callable(fn):
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"{fn!r} is not callable")
        self._put(self._stream(stream, call), call, fn, ())

    # -- events ------------------------------------------------------------------
    def event_create(self, ordinal: int, timing: bool = False) -> int:
        dev = self._device(ordinal, OPS["event_create"])
        handle = next(self._event_ids)
        with dev.lock, self._lock:
            self._events[handle] = _Event(handle, dev, bool(timing))
        return handle

    def event_destroy(self, event: int) -> None:
        """The handle is invalid at once; pending records still complete."""
        with self._lock:
            e = self._events.pop(event, None)
        if e is None:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", OPS["event_destroy"],
                               f"event {event!r} was destroyed or never created")
        if self._trace:
            emit(self._trace, "on_event_destroyed", event)

    def event_record(self, event: int, stream: int) -> None:
        if self._trace:
            emit(self._trace, "on_event_record", event, stream)
        call = OPS["event_record"]
        e = self._event(event, call)
        s = self._stream(stream, call)
        if s.device is not e.device:
            raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                               f"event {event} is on device {e.device.ordinal} but stream "
                               f"{stream} is on device {s.device.ordinal}")
        rec = _Record(s)
        rec.ticket = self._put(s, call, rec.reach, ())
        e.latest = rec

    def event_query(self, event: int) -> bool:
        """True when the latest record is reached (or the event never recorded).
        Raises the recording stream's sticky error once reached."""
        call = OPS["event_query"]
        rec = self._event(event, call).latest
        if rec is not None:
            if not rec.done():
                return False
            self._raise_sticky(rec.stream.error, call)
        if self._trace:
            emit(self._trace, "on_event_synchronize", event)
        return True

    def event_synchronize(self, event: int) -> None:
        """Wait for the latest record as of this call; raises the recording
        stream's sticky CUDA_ERROR_LAUNCH_FAILED if it failed."""
        call = OPS["event_synchronize"]
        rec = self._event(event, call).latest
        if rec is not None:
            if not rec.stream.wait_for(rec.ticket):
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                                   f"event {event} was lost to a context rebuild while waiting")
            self._raise_sticky(rec.stream.error, call)
        if self._trace:
            emit(self._trace, "on_event_synchronize", event)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Host milliseconds between the two records being reached by their
        workers: meaningless as GPU timings. Both events need timing enabled
        (else CUDA_ERROR_INVALID_HANDLE), a record (else CUDA_ERROR_INVALID_HANDLE,
        as the driver) and a completed one (else CUDA_ERROR_NOT_READY)."""
        call = OPS["event_elapsed_ms"]
        recs = []
        for handle in (start, end):
            e = self._event(handle, call)
            if not e.timing:
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                                   f"event {handle} was created without timing; create both "
                                   f"events with timing=True to measure between them")
            if e.latest is None:
                raise driver_error("CUDA_ERROR_INVALID_HANDLE", call,
                                   f"event {handle} was never recorded")
            recs.append(e.latest)
        for handle, rec in zip((start, end), recs):
            if not rec.done():
                raise driver_error("CUDA_ERROR_NOT_READY", call,
                                   f"event {handle}'s latest record has not been reached")
        return (recs[1].time - recs[0].time) * 1000.0
