"""Export an array's memory, and open memory another process exported.

Design and rules:
- Only memory from a ``VmmResource`` (directly or under adaptors) can be
  exported; anything else is refused with a ``ValueError`` that says how to
  allocate shareable memory. The array need not start its allocation: views
  export their offset.
- Export is a tracked use of the array: the ``"ipc"`` layer acquires it for
  the moment of the export (so it cannot be freed or handed to another layer
  meanwhile), its stream waits for every pending write and read on other
  streams, and the host synchronizes that stream. So the bytes an importer
  sees are the ones written before ``export`` returned. An exporter that
  writes again later, or an importer that writes back, must order that with
  the peer itself (``finish(array)``, then a message).
- ``open`` maps the whole exported allocation on the local device with the
  descriptor's GPU UUID, sets access, and returns an ``NvArray`` that owns
  its mapping, never the memory: freeing it (``free()``, ``ig.ipc.close`` or
  garbage collection, once its views are gone) unmaps, after its queued uses
  have finished, and leaves the exporter's memory alone. Its owner is the
  default ``"compute"``, so every layer can use it. The mapping keeps the
  memory valid while it lives, even after the exporter freed it or exited.
- Imported arrays are tracked like any other (cross-stream waits, sanitizer):
  their blocks live in a per-device ``ImportedMemory`` resource. Arrays made
  from them (``clone``) come from the device's current resource.
- Descriptors are untrusted: they are validated when parsed and again by
  ``open`` before any driver call (every field, the fd open, the size within
  the device's memory and a multiple of the local granularity), the uid must
  be this process's unless ``allow_other_users``, and a size larger than the
  real allocation is refused by the driver's map (reported as ``ValueError``).
  Nothing is leaked on any failure.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import dtypes as _dt
from .._types import Access
from ..array import NvArray
from ..backends import get_backend
from ..errors import DriverError, UnsupportedError, UseAfterFreeError
from ..memory import ResourceAdaptor, TrackedResource, VmmResource, get_current_resource
from ..memory.types import UNTAGGED
from ..memory.block import DeviceBlock, next_generation
from ..memory.vmm import VmmMapping, map_range, release_mapped_block, unmap_range
from ..runtime import Device, Stream
from . import liveness
from .handle import IpcDescriptor, IpcHandle

__all__ = ["export", "open", "close", "finish", "is_imported", "ImportedMemory"]

_RW = Access.READ_WRITE
# Driver statuses that say something about this system, not about the handle: raised as they are.
_SYSTEM_ERRORS = frozenset({"CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_NOT_INITIALIZED",
                            "CUDA_ERROR_DEINITIALIZED", "CUDA_ERROR_INVALID_CONTEXT", "CUDA_ERROR_NO_DEVICE"})
_MAP_REFUSED = frozenset({"CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_NOT_SUPPORTED"})


def _vmm_of(array: NvArray) -> VmmResource:
    mr = array.resource
    while isinstance(mr, ResourceAdaptor):
        mr = mr.upstream
    if isinstance(mr, VmmResource):
        return mr
    if isinstance(mr, ImportedMemory):
        raise ValueError(f"NvArray#{array.id} maps memory imported from another process; only the process that "
                         "allocated it can export it (send the original handle on, or copy into a "
                         "VmmResource array and export that)")
    what = "foreign memory" if mr is None else f"a {type(array.resource).__name__}"
    raise ValueError(f"NvArray#{array.id} lives in {what}; only memory from a VmmResource can be shared "
                     f"between processes: allocate it with mr=ig.VmmResource(device), e.g. "
                     f"ig.empty(shape, dtype, mr=ig.VmmResource({array.device.ordinal}))")


def finish(array: NvArray, *, stream: Stream | None = None) -> None:
    """Wait (on the host) until every queued write and read of ``array``, on any
    stream, has finished: call it before telling another process to use the bytes."""
    s = array.stream if stream is None else stream
    with array.access(s, _RW, by=None, op="ipc finish"):  # whoever holds it: a tracked use only
        pass
    s.synchronize()


def export(array: NvArray, *, stream: Stream | None = None) -> IpcHandle:
    """Export ``array`` (memory of a ``VmmResource``) for another process.

    Pending writes to it are finished first (a host synchronization). Returns a
    handle owning a new file descriptor: send it (``send_handle``, or through
    multiprocessing), then close it. Raises ``ValueError`` for memory that cannot
    be shared or an empty array, ``UseAfterFreeError`` for a freed one, and
    ``MemoryContractViolation`` while another layer holds it.
    """
    if not isinstance(array, NvArray):
        raise TypeError(f"ig.ipc.export needs an NvArray, got {type(array).__name__}")
    array.check_usable("export")
    block = array.block
    if array.nbytes == 0 or block is None:
        raise ValueError(f"NvArray#{array.id} is empty: there is no device memory to share")
    vmm = _vmm_of(array)
    with NvArray.access_all([(array, None)], stream, by="ipc", op="ipc export"):  # held for the export
        finish(array, stream=stream)
        fd = vmm.export_fd(block)
        try:
            desc = IpcDescriptor(size=block.bytes, offset=array.device_ptr - block.ptr, shape=tuple(array.shape),
                                 dtype=array.dtype.name, generation=int(block.generation),
                                 device_uuid=array.device.uuid, pid=os.getpid(), uid=os.geteuid(),
                                 service=liveness.register(block))
            return IpcHandle(fd, desc)
        except BaseException:
            os.close(fd)
            raise


def _device_for(uuid: str, device: "Device | int | None") -> Device:
    if device is not None:
        dev = Device(device)
        if dev.uuid != uuid:
            raise ValueError(f"the handle's memory is on GPU {uuid}, but device {dev.ordinal} is {dev.uuid}; "
                             "open it on that GPU (or leave device=None to find it)")
        return dev
    backend = get_backend()
    for i in range(backend.device_count()):  # properties only: no context on the other GPUs
        if backend.device_properties(i).uuid == uuid:
            return Device(i)
    raise ValueError(f"no local device is GPU {uuid} (where the handle's memory lives); a handle can only be "
                     "opened on the same GPU, by a process that can see it (check CUDA_VISIBLE_DEVICES)")


def open(handle: IpcHandle, *, device: "Device | int | None" = None, stream: Stream | None = None,
         check_live: bool = True, allow_other_users: bool = False, timeout: float = 1.0) -> NvArray:
    """Map the memory of ``handle`` and return an ``NvArray`` over it (zero-copy).

    ``device``: where to map it (default: the local device with the handle's
    GPU UUID). ``stream``: the array's stream (default: the device's default
    stream). ``check_live``: ask the exporter whether the block is still live
    (``UseAfterFreeError`` if it answers that it was freed; an exporter that
    has exited cannot answer, and the memory is opened as it was left).
    ``allow_other_users``: accept a handle exported by another uid.
    The handle stays open (and the caller's); the array does not need it.

    Raises ``ValueError`` for a forged, corrupt or foreign descriptor (all but a
    size larger than the real allocation found before any driver call, e.g. a
    ``size`` beyond the device's memory) or an fd that is not open,
    ``TypeError`` for arguments of the wrong type, ``PermissionError`` for
    another user's handle, ``UnsupportedError`` where the device cannot import,
    ``ClosedError`` for a closed handle.
    """
    if not isinstance(handle, IpcHandle):
        raise TypeError(f"ig.ipc.open needs an IpcHandle, got {type(handle).__name__}")
    fd = handle.fd
    # Everything checkable on the host is checked before the first driver call.
    desc = handle.descriptor.validated()
    try:
        os.fstat(fd)
    except OSError as exc:
        raise ValueError(f"the handle's file descriptor {fd} is not open ({exc.strerror}); it was closed "
                         "behind the handle's back, or the handle is forged: export the array again") from None
    if desc.uid != os.geteuid() and not allow_other_users:
        raise PermissionError(f"the handle was exported by uid {desc.uid} (pid {desc.pid}), not by this "
                              f"process's user (uid {os.geteuid()}); pass allow_other_users=True to map "
                              "another user's memory")
    dev = _device_for(desc.device_uuid, device)
    if desc.size > dev.total_memory:
        raise ValueError(f"invalid IPC descriptor: size {desc.size} bytes is more than the {dev.total_memory} bytes "
                         f"of device {dev.ordinal} ({dev.name}), where the memory would live; the handle is "
                         "corrupt or forged (export the array again with ig.ipc.export)")
    caps = dev.capabilities
    if not (caps.get("vmm") and caps.get("posix_fd_ipc")):
        raise UnsupportedError(f"importing shared memory on device {dev.ordinal}", dev.backend.name,
                               "the device or driver lacks VMM or POSIX fd handles")
    if stream is not None and not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
    if stream is not None and stream.device is not dev:
        raise ValueError(f"stream {stream!r} is on device {stream.device.ordinal}, not device {dev.ordinal}")
    if check_live and liveness.query(desc, timeout) is False:
        raise UseAfterFreeError(f"the exporter (pid {desc.pid}) freed this memory before it was opened; "
                                "ask it to export a live array", generation=desc.generation)
    backend, ordinal = dev.backend, dev.ordinal
    res = ImportedMemory.of(dev)
    g = res.granularity
    if desc.size % g:
        raise ValueError(f"invalid IPC descriptor: size {desc.size} is not a multiple of device {ordinal}'s "
                         f"{g}-byte allocation granularity; the handle is corrupt or forged")
    try:
        h = backend.vmm_import_fd(fd)
    except DriverError as e:
        if e.name in _SYSTEM_ERRORS or e.detail == "injected fault":
            raise
        raise ValueError(f"the handle's file descriptor {fd} is not device memory exported by ig.ipc.export "
                         f"(the driver refused to import it: {e.name}); the handle is corrupt or forged") from e
    try:
        ptr = map_range(backend, ordinal, h, desc.size, g)
    except DriverError as e:
        _release_quietly(backend, h, e)
        # A mapping past the allocation's end is INVALID_VALUE on the emulator and NOT_SUPPORTED on the driver.
        if e.name in _MAP_REFUSED and e.detail != "injected fault":
            raise ValueError(f"the exported allocation is smaller than the {desc.size} bytes its descriptor "
                             f"claims (the driver refused to map it: {e.name}); the handle is corrupt or "
                             "forged") from e
        raise
    except BaseException as e:
        _release_quietly(backend, h, e)
        raise
    try:
        backend.vmm_release(h)  # the mapping keeps the memory
        s = dev.default_stream if stream is None else stream
        block = res.adopt(ptr, desc.size, s, tag=f"ipc:pid{desc.pid}")
    except BaseException:
        unmap_range(backend, ptr, desc.size)
        raise
    # The array owns its mapping (not the memory): freeing it unmaps, through ImportedMemory.
    try:
        return NvArray.from_block(block, res, desc.shape, _dt.dtype(desc.dtype), s, offset=desc.offset)
    except BaseException:
        res.deallocate(block)  # unmaps: nothing of the import is left
        raise


def _release_quietly(backend: Any, h: int, exc: BaseException) -> None:
    try:
        backend.vmm_release(h)
    except Exception as undo:  # noqa: BLE001 - the first error is the one to report
        if hasattr(exc, "add_note"):
            exc.add_note(f"while unwinding, releasing the imported handle also failed: {undo}")


def is_imported(array: NvArray) -> bool:
    """True for arrays (and their views) made by ``open``."""
    return isinstance(array.resource, ImportedMemory) and array.block is not None \
        and array.resource.holds(array.block)


def close(array: NvArray) -> None:
    """Unmap an array made by ``open`` (same as ``array.free()``; idempotent).
    Views of it must be freed or dropped first."""
    if not isinstance(array, NvArray) or not isinstance(array.resource, ImportedMemory):
        raise ValueError(f"ig.ipc.close is for arrays made by ig.ipc.open, got {array!r}")
    if not array.freed:
        array.free()


class ImportedMemory(TrackedResource):
    """The blocks of one device that map other processes' memory.

    It allocates nothing of its own: ``allocate`` (used by ``clone`` of an
    imported array) forwards to the device's current resource, and that
    block's tracking and deallocation go back there. ``bytes_outstanding`` is
    the bytes mapped now.
    """

    _instances: dict[tuple[int, int, int], "ImportedMemory"] = {}
    _instances_lock = threading.Lock()

    @classmethod
    def of(cls, device: Device) -> "ImportedMemory":
        """The one ``ImportedMemory`` of ``device`` in its current context generation.

        Args:
            device: the ``ig.Device``.
        """
        key = (id(device.backend), device.ordinal, device.state.generation)
        res = cls._instances.get(key)
        if res is None:
            with cls._instances_lock:
                res = cls._instances.get(key)
                if res is None:
                    res = cls._instances[key] = cls(device)
        return res

    def __init__(self, device: "Device | int | None" = None) -> None:
        super().__init__(device)
        self.granularity: int = self._backend.vmm_granularity(self.device.ordinal)
        self._bytes = 0
        self._forwarded: dict[int, Any] = {}  # generation -> resource of a block made by allocate()
        self._unmapped: dict[int, DeviceBlock] = {}  # blocks whose unmap succeeded but address free failed

    def adopt(self, ptr: int, nbytes: int, stream: Stream, tag: str) -> DeviceBlock:
        """A live block for a mapping made by ``open``."""
        self._check_alive()
        block = DeviceBlock(ptr, stream, nbytes, nbytes, tag, next_generation(), VmmMapping(None))
        with self._lock:
            self._live[ptr] = block
            self._bytes += nbytes
        return block

    def holds(self, block: DeviceBlock) -> bool:
        """True if ``block`` is a live imported block of this resource.

        Args:
            block: a ``DeviceBlock``.
        """
        return self._live.get(block.ptr) is block

    # -- blocks made by allocate() belong to the current resource ---------------------------
    def allocate(self, nbytes: int, stream: Stream | None = None, tag: str = UNTAGGED) -> DeviceBlock:
        up = get_current_resource(self.device)
        block = up.allocate(nbytes, stream, tag)
        self._forwarded[int(block.generation)] = up
        return block

    def _upstream(self, block: Any) -> Any:
        return self._forwarded.get(int(block.generation)) if self._forwarded else None

    def prepare_block_use(self, block: Any, stream: Stream, access: Access, span: tuple | None = None) -> None:
        up = self._upstream(block)
        if up is not None:
            return up.prepare_block_use(block, stream, access, span)
        return super().prepare_block_use(block, stream, access, span)

    def finish_block_use(self, block: Any, stream: Stream, access: Access) -> None:
        up = self._upstream(block)
        if up is not None:
            return up.finish_block_use(block, stream, access)
        return super().finish_block_use(block, stream, access)

    def record_block_use(self, block: Any, stream: Stream) -> None:
        up = self._upstream(block)
        if up is not None:
            return up.record_block_use(block, stream)
        return super().record_block_use(block, stream)

    # -- unmapping --------------------------------------------------------------------------------
    def deallocate(self, block: DeviceBlock) -> None:
        """Unmap an imported block once its queued uses are done (a host synchronization)."""
        up = self._forwarded.get(int(block.generation)) if self._forwarded else None
        if up is not None:
            up.deallocate(block)  # if it raises, the block stays forwarded: a retry goes there again
            self._forwarded.pop(int(block.generation), None)
            return
        release_mapped_block(self, block)

    @property
    def bytes_outstanding(self) -> int:
        return self._bytes

    def memory_numbers(self) -> dict[str, int]:
        return {"live_bytes": self._bytes, "cached_bytes": 0, "largest_free_block": 0}
