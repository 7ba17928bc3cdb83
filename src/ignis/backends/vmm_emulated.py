"""Virtual memory management (seeds/002) for the emulated backend: the ``vmm_*``
operations of the Backend protocol as a mixin of ``EmulatedBackend``.

Design:
- A physical allocation is a sealed ``memfd_create`` file of a whole number of
  granules (``GRANULARITY``, 2 MiB, reported by ``vmm_granularity``). Its
  handle is a small int, never reused. Export is ``os.dup`` of the memfd, so
  the fd can cross processes (SCM_RIGHTS, multiprocessing) and another
  process's ``vmm_import_fd`` maps the very same pages: IPC runs for real.
- A reservation is a range of fake device addresses taken from the device's
  own address allocator (so it never overlaps an ordinary allocation),
  aligned to the granularity. ``vmm_map`` mmaps part of a memfd for a granule-
  aligned subrange; ``vmm_set_access`` registers each mapping with the device
  as an allocation, so memcpy, memset and ``host_view`` work on it exactly as
  on ``mem_alloc`` memory; ``vmm_unmap`` withdraws it.
- Semantics follow CUDA: memory lives while a handle or a mapping refers to
  it (release before unmap is fine); a mapping has no access until
  ``vmm_set_access``; unmapping a range that is not mapped, mapping over a
  mapping, freeing a reservation that still has mappings, and sizes or
  offsets that are not granule multiples raise ``CUDA_ERROR_INVALID_VALUE``.
  Created memory counts against the device's memory (``mem_get_info``);
  imported memory belongs to its exporter and does not.

Rules and differences from CUDA (documented, not hidden):
- Each mapping is its own emulated allocation: one copy cannot span two
  mappings, even adjacent ones (CUDA allows it).
- Mapped memory stays valid for work already queued (queued items hold the
  mmap), so an unmap never leaves a stream worker touching unmapped pages;
  like CUDA, unmap does not wait for queued work: synchronize first.
- memfds are sealed against shrinking and growing; an fd that is not such a
  memfd is refused at import, so a peer cannot make this process fault.
- ``mem_free`` on a mapped VMM address is not caught (CUDA refuses it).
- A context rebuild drops the device's reservations and created handles;
  using them afterwards raises ``CUDA_ERROR_INVALID_VALUE``. Staleness is seen
  through the device's allocation table being replaced by the rebuild.
- Lock order: ``_vmm_lock``, then the device lock.
"""

from __future__ import annotations

import bisect
import fcntl
import itertools
import mmap
import os
import stat
import threading
from typing import Any

import numpy as np

from .base import OPS, driver_error

__all__ = ["EmulatedVmm", "GRANULARITY"]

GRANULARITY = 2 << 20          # bytes; minimum and recommended alike
_MEMFD_PREFIX = "ignis-vmm-dev"
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class _Alloc:
    """One block of emulated device memory (an allocation's, or a mapping's once its access is
    set): its base address, size, the span it reserves, its host buffer and address. Here,
    beside the mappings that make them too; ``emulated.py`` imports it."""
    __slots__ = ("base", "nbytes", "span", "buf", "host", "freeing")

    def __init__(self, base: int, nbytes: int, span: int, buf: np.ndarray, host: int) -> None:
        self.base, self.nbytes, self.span, self.buf, self.host = base, nbytes, span, buf, host
        self.freeing = False  # an async free is queued: no new work may touch it


class _Phys:
    """One physical allocation: a memfd (created here or imported)."""

    __slots__ = ("handle", "fd", "nbytes", "ordinal", "epoch", "mappings", "released")

    def __init__(self, handle: int, fd: int, nbytes: int, ordinal: int, epoch: Any) -> None:
        self.handle, self.fd, self.nbytes, self.ordinal = handle, fd, nbytes, ordinal
        self.epoch = epoch       # the device's allocation table when created (None: imported)
        self.mappings = 0
        self.released = False


class _Map:
    __slots__ = ("ptr", "nbytes", "phys", "mm", "alloc")

    def __init__(self, ptr: int, nbytes: int, phys: _Phys, mm: mmap.mmap) -> None:
        self.ptr, self.nbytes, self.phys, self.mm = ptr, nbytes, phys, mm
        self.alloc: Any = None   # the device allocation registered by set_access


class _Reservation:
    __slots__ = ("ordinal", "base", "nbytes", "raw", "span", "epoch", "maps")

    def __init__(self, ordinal: int, base: int, nbytes: int, raw: int, span: int, epoch: Any) -> None:
        self.ordinal, self.base, self.nbytes, self.raw, self.span = ordinal, base, nbytes, raw, span
        self.epoch = epoch
        self.maps: dict[int, _Map] = {}


class EmulatedVmm:
    """The ``vmm_*`` operations of ``EmulatedBackend`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vmm_lock = threading.Lock()
        self._vmm_ids = itertools.count(1)
        self._vmm_handles: dict[int, _Phys] = {}
        self._vmm_res: dict[int, _Reservation] = {}
        self._vmm_bases: list[int] = []   # sorted keys of _vmm_res

    # -- helpers (caller holds _vmm_lock where noted) ---------------------------------
    @staticmethod
    def _vmm_check_size(nbytes: Any, call: str, what: str = "size") -> None:
        if type(nbytes) is not int or nbytes <= 0 or nbytes % GRANULARITY:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"{what} {nbytes!r} is not a positive multiple of the {GRANULARITY}-byte "
                               f"granularity (vmm_granularity)")

    def _vmm_handle(self, handle: Any, call: str) -> _Phys:
        """The live handle (caller holds _vmm_lock)."""
        phys = self._vmm_handles.get(handle) if type(handle) is int else None
        if phys is not None and phys.epoch is not None \
                and self._devices[phys.ordinal].allocs is not phys.epoch:
            del self._vmm_handles[handle]
            phys.released = True
            self._vmm_drop(phys)
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"allocation handle {handle} was lost to a context rebuild")
        if phys is None:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"allocation handle {handle!r} was released or never created")
        return phys

    def _vmm_drop(self, phys: _Phys) -> None:
        """Free the memfd once no handle and no mapping refers to it (caller holds _vmm_lock)."""
        if not phys.released or phys.mappings or phys.fd < 0:
            return
        os.close(phys.fd)
        phys.fd = -1
        if phys.epoch is not None:
            dev = self._devices[phys.ordinal]
            with dev.lock:
                if dev.allocs is phys.epoch:
                    dev.live -= phys.nbytes

    def _vmm_range(self, ptr: Any, nbytes: Any, call: str) -> _Reservation:
        """The reservation holding every byte of [ptr, ptr + nbytes) (caller holds _vmm_lock)."""
        if type(ptr) is not int or type(nbytes) is not int or nbytes <= 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"range ({ptr!r}, {nbytes!r}) is not valid")
        i = bisect.bisect_right(self._vmm_bases, ptr) - 1
        rec = self._vmm_res[self._vmm_bases[i]] if i >= 0 else None
        if rec is None or ptr + nbytes > rec.base + rec.nbytes:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"range [{ptr:#x}, +{nbytes}) is not inside one address reservation "
                               f"(vmm_reserve)")
        if self._devices[rec.ordinal].allocs is not rec.epoch:
            self._vmm_forget(rec)
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"the reservation at {rec.base:#x} was lost to a context rebuild")
        return rec

    def _vmm_forget(self, rec: _Reservation) -> None:
        """Drop a reservation and its mappings (caller holds _vmm_lock)."""
        del self._vmm_res[rec.base]
        del self._vmm_bases[bisect.bisect_left(self._vmm_bases, rec.base)]
        for m in list(rec.maps.values()):
            self._vmm_unmap_one(rec, m)

    def _vmm_tiles(self, rec: _Reservation, ptr: int, nbytes: int, call: str, what: str) -> list[_Map]:
        """The mappings that exactly cover [ptr, ptr + nbytes) (caller holds _vmm_lock)."""
        out, at, end = [], ptr, ptr + nbytes
        while at < end:
            m = rec.maps.get(at)
            if m is None or at + m.nbytes > end:
                why = "nothing is mapped at" if m is None else "a mapping runs past the range's end from"
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"cannot {what} [{ptr:#x}, +{nbytes}): {why} {at:#x} (the range must "
                                   f"consist of whole mappings made by vmm_map)")
            out.append(m)
            at += m.nbytes
        return out

    def _vmm_unmap_one(self, rec: _Reservation, m: _Map) -> None:
        del rec.maps[m.ptr]
        alloc, m.alloc, m.mm = m.alloc, None, None
        if alloc is not None:
            dev = self._devices[rec.ordinal]
            with dev.lock:
                if dev.allocs.get(m.ptr) is alloc:
                    del dev.allocs[m.ptr]
                    del dev.bases[bisect.bisect_left(dev.bases, m.ptr)]
            alloc.freeing = True
        m.phys.mappings -= 1
        self._vmm_drop(m.phys)

    # -- the protocol ----------------------------------------------------------------------
    def vmm_granularity(self, ordinal: int, recommended: bool = False) -> int:
        """2 MiB, minimum and recommended (as on current NVIDIA GPUs)."""
        self._device(ordinal, OPS["vmm_granularity"])
        return GRANULARITY

    def vmm_create(self, ordinal: int, nbytes: int) -> int:
        """``nbytes`` (a multiple of the granularity) of physical memory on ``ordinal``: a sealed memfd,
        counted against the device's memory. Returns the allocation handle (never reused)."""
        call = OPS["vmm_create"]
        dev = self._device(ordinal, call)
        self._vmm_check_size(nbytes, call)
        with dev.lock:
            if dev.live + nbytes > dev.total:
                raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                                   f"device {ordinal}: {nbytes} bytes requested, "
                                   f"{dev.total - dev.live} of {dev.total} free")
            dev.live += nbytes
            epoch = dev.allocs
        try:
            fd = os.memfd_create(f"{_MEMFD_PREFIX}{ordinal}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, nbytes)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            with dev.lock:
                if dev.allocs is epoch:
                    dev.live -= nbytes
            raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                               f"the host could not back {nbytes} bytes: {exc.strerror}") from None
        handle = next(self._vmm_ids)
        with self._vmm_lock:
            self._vmm_handles[handle] = _Phys(handle, fd, nbytes, ordinal, epoch)
        return handle

    def vmm_release(self, handle: int) -> None:
        """The memory goes once its mappings are unmapped too."""
        with self._vmm_lock:
            phys = self._vmm_handle(handle, OPS["vmm_release"])
            del self._vmm_handles[handle]
            phys.released = True
            self._vmm_drop(phys)

    def vmm_export_fd(self, handle: int) -> int:
        """A new file descriptor (a dup of the memfd) for ``handle`` (the caller closes it)."""
        call = OPS["vmm_export_fd"]
        with self._vmm_lock:
            phys = self._vmm_handle(handle, call)
            try:
                return os.dup(phys.fd)
            except OSError as exc:
                raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                                   f"cannot duplicate the allocation's fd: {exc.strerror}") from None

    def vmm_import_fd(self, fd: int) -> int:
        """Import a memfd exported by ``vmm_export_fd`` (this process or another);
        ``fd`` stays the caller's. Anything else is CUDA_ERROR_INVALID_VALUE."""
        call = OPS["vmm_import_fd"]
        if type(fd) is not int or fd < 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call, f"{fd!r} is not a file descriptor")
        try:
            st = os.fstat(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS) if stat.S_ISREG(st.st_mode) else 0
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError as exc:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"fd {fd} is not an exported allocation: {exc.strerror}") from None
        prefix = "/memfd:" + _MEMFD_PREFIX
        ordinal = name[len(prefix):].split(" ", 1)[0]
        fixed = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW  # a peer must not be able to truncate it under us
        if not name.startswith(prefix) or not ordinal.isdigit() or seals & fixed != fixed \
                or st.st_size <= 0 or st.st_size % GRANULARITY:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"fd {fd} ({name}) is not an allocation exported by vmm_export_fd")
        try:
            own = os.dup(fd)
        except OSError as exc:
            raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call,
                               f"cannot duplicate fd {fd}: {exc.strerror}") from None
        handle = next(self._vmm_ids)
        with self._vmm_lock:
            self._vmm_handles[handle] = _Phys(handle, own, st.st_size, int(ordinal), None)
        return handle

    def vmm_reserve(self, ordinal: int, nbytes: int, alignment: int = 0) -> int:
        """A granule-aligned range of device addresses (a multiple of the granularity)."""
        call = OPS["vmm_reserve"]
        dev = self._device(ordinal, call)
        self._vmm_check_size(nbytes, call)
        if type(alignment) is not int or alignment < 0 or alignment & (alignment - 1):
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"alignment {alignment!r} is not 0 or a power of two")
        align = max(alignment, GRANULARITY)
        span = nbytes + align
        with dev.lock:
            raw = dev._address(span, call)
            epoch = dev.allocs
        base = raw + (-raw % align)
        with self._vmm_lock:
            self._vmm_res[base] = _Reservation(ordinal, base, nbytes, raw, span, epoch)
            bisect.insort(self._vmm_bases, base)
        return base

    def vmm_free_address(self, ptr: int, nbytes: int) -> None:
        """Free a reservation from ``vmm_reserve`` (the same ``ptr`` and ``nbytes``); it must have no
        mappings left (else ``CUDA_ERROR_INVALID_VALUE``)."""
        call = OPS["vmm_free_address"]
        with self._vmm_lock:
            rec = self._vmm_res.get(ptr) if type(ptr) is int else None
            if rec is None or rec.nbytes != nbytes:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"({ptr!r}, {nbytes!r}) is not an address reservation; pass the pointer "
                                   f"and size that vmm_reserve returned and was given")
            if rec.maps and self._devices[rec.ordinal].allocs is rec.epoch:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"the reservation at {ptr:#x} still has {len(rec.maps)} mapping(s); "
                                   f"vmm_unmap them first")
            self._vmm_forget(rec)
        dev = self._devices[rec.ordinal]
        with dev.lock:
            if dev.allocs is rec.epoch:
                dev.free_addrs.setdefault(rec.span, []).append(rec.raw)

    def vmm_map(self, ptr: int, nbytes: int, handle: int, offset: int = 0) -> None:
        """Map ``nbytes`` of ``handle``'s memory from ``offset`` at ``ptr`` inside a reservation
        (sizes and offsets granule-aligned, no overlap with another mapping; else
        ``CUDA_ERROR_INVALID_VALUE``). The mapping has no access until ``vmm_set_access``."""
        call = OPS["vmm_map"]
        self._vmm_check_size(nbytes, call)
        if type(offset) is not int or offset < 0 or offset % GRANULARITY:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                               f"offset {offset!r} is not a non-negative multiple of the granularity")
        with self._vmm_lock:
            rec = self._vmm_range(ptr, nbytes, call)
            if (ptr - rec.base) % GRANULARITY:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"{ptr:#x} is not granule-aligned within its reservation")
            phys = self._vmm_handle(handle, call)
            if offset + nbytes > phys.nbytes:
                raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                   f"bytes [{offset}, {offset + nbytes}) are past the end of the "
                                   f"{phys.nbytes}-byte allocation")
            for m in rec.maps.values():
                if m.ptr < ptr + nbytes and ptr < m.ptr + m.nbytes:
                    raise driver_error("CUDA_ERROR_INVALID_VALUE", call,
                                       f"[{ptr:#x}, +{nbytes}) overlaps the mapping at {m.ptr:#x}; "
                                       f"unmap it first")
            try:
                mm = mmap.mmap(phys.fd, nbytes, flags=mmap.MAP_SHARED,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
            except (OSError, ValueError) as exc:
                raise driver_error("CUDA_ERROR_OUT_OF_MEMORY", call, f"host mmap failed: {exc}") from None
            rec.maps[ptr] = _Map(ptr, nbytes, phys, mm)
            phys.mappings += 1

    def vmm_unmap(self, ptr: int, nbytes: int) -> None:
        """Unmap whole mappings; queued work that already holds them still completes."""
        call = OPS["vmm_unmap"]
        with self._vmm_lock:
            rec = self._vmm_range(ptr, nbytes, call)
            for m in self._vmm_tiles(rec, ptr, nbytes, call, "unmap"):
                self._vmm_unmap_one(rec, m)

    def vmm_set_access(self, ordinal: int, ptr: int, nbytes: int) -> None:
        """Make the mappings in ``[ptr, ptr + nbytes)`` usable (each becomes an emulated allocation that
        copies, memsets and kernels can reach)."""
        call = OPS["vmm_set_access"]
        self._device(ordinal, call)
        with self._vmm_lock:
            rec = self._vmm_range(ptr, nbytes, call)
            dev = self._devices[rec.ordinal]
            for m in self._vmm_tiles(rec, ptr, nbytes, call, "set access to"):
                if m.alloc is not None:
                    continue
                buf = np.frombuffer(m.mm, dtype=np.uint8)
                alloc = _Alloc(m.ptr, m.nbytes, m.nbytes, buf, buf.ctypes.data)
                with dev.lock:
                    dev.allocs[m.ptr] = alloc
                    bisect.insort(dev.bases, m.ptr)
                m.alloc = alloc
