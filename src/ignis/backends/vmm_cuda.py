"""Virtual memory management (seeds/002) for the ``cuda`` backend: the ``vmm_*``
operations of the Backend protocol as a mixin of ``CudaBackend``.

Design and rules:
- Physical memory is ``cuMemCreate`` with a ``CUmemAllocationProp`` of type
  PINNED, located on the device, requesting POSIX file descriptor handles, so
  every allocation can be exported (``cuMemExportToShareableHandle``) and
  imported by another process (``cuMemImportFromShareableHandle``, where the
  fd travels as a pointer-sized int, as the C API casts it to ``void*``).
- Addresses come from ``cuMemAddressReserve``; ``cuMemMap`` backs them;
  ``cuMemSetAccess`` (PROT_READWRITE for one device) makes them usable;
  ``cuMemUnmap`` / ``cuMemAddressFree`` / ``cuMemRelease`` undo it. Handles,
  pointers and fds are plain ints at the protocol boundary.
- Every status goes through ``_cu._check`` (DriverError naming the cu* call);
  nothing is masked. (Faults are injected by wrapping the backend: ``ignis.backends.faults``.)
- Calls that name a device make its primary context current; the others
  need only some context (``_enter_any``).
- The binding and the status check are ``_cu``'s, which ``cuda.py`` imports too.
"""

from __future__ import annotations

from typing import Any

from ._cu import _check, cu
from .base import driver_error

__all__ = ["CudaVmm"]


class CudaVmm:
    """The ``vmm_*`` operations of ``CudaBackend`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vmm_props: dict[int, Any] = {}

    def _vmm_prop(self, ordinal: int) -> Any:
        """The (cached) allocation properties for exportable memory on ``ordinal``."""
        props = self._vmm_props
        prop = props.get(ordinal)
        if prop is None:
            prop = cu.CUmemAllocationProp()
            prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            prop.location.id = ordinal
            prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            props[ordinal] = prop
        return prop

    def vmm_granularity(self, ordinal: int, recommended: bool = False) -> int:
        """``cuMemGetAllocationGranularity`` for exportable memory on ``ordinal``: the minimum granularity in
        bytes, or the recommended one if ``recommended``."""
        self._enter(ordinal)
        flags = cu.CUmemAllocationGranularity_flags
        which = (flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED if recommended
                 else flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        res = _check(cu.cuMemGetAllocationGranularity(self._vmm_prop(ordinal), which),
                     "cuMemGetAllocationGranularity")
        return int(res[1])

    def vmm_create(self, ordinal: int, nbytes: int) -> int:
        """``cuMemCreate``: ``nbytes`` (a multiple of the granularity) of physical memory on ``ordinal``,
        exportable as a POSIX fd. Returns the allocation handle."""
        self._enter(ordinal)
        return int(_check(cu.cuMemCreate(nbytes, self._vmm_prop(ordinal), 0), "cuMemCreate")[1])

    def vmm_release(self, handle: int) -> None:
        """``cuMemRelease`` the allocation ``handle``; the memory goes once no mapping uses it."""
        self._enter_any()
        _check(cu.cuMemRelease(handle), "cuMemRelease")

    def vmm_export_fd(self, handle: int) -> int:
        """``cuMemExportToShareableHandle``: a new POSIX file descriptor for ``handle`` (the caller closes it)."""
        self._enter_any()
        kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return int(_check(cu.cuMemExportToShareableHandle(handle, kind, 0),
                          "cuMemExportToShareableHandle")[1])

    def vmm_import_fd(self, fd: int) -> int:
        """``cuMemImportFromShareableHandle``: an allocation handle for the memory behind ``fd`` (which stays
        the caller's). A value that is not a non-negative int is ``CUDA_ERROR_INVALID_VALUE``."""
        if type(fd) is not int or fd < 0:
            raise driver_error("CUDA_ERROR_INVALID_VALUE", "cuMemImportFromShareableHandle",
                               f"{fd!r} is not a file descriptor")
        self._enter_any()
        kind = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        return int(_check(cu.cuMemImportFromShareableHandle(fd, kind),
                          "cuMemImportFromShareableHandle")[1])

    def vmm_reserve(self, ordinal: int, nbytes: int, alignment: int = 0) -> int:
        """``cuMemAddressReserve``: a device virtual address range of ``nbytes`` (aligned to ``alignment``,
        0 for the default); returns its start."""
        self._enter(ordinal)
        return int(_check(cu.cuMemAddressReserve(nbytes, alignment, 0, 0), "cuMemAddressReserve")[1])

    def vmm_free_address(self, ptr: int, nbytes: int) -> None:
        """``cuMemAddressFree`` a range from ``vmm_reserve``."""
        self._enter_any()
        _check(cu.cuMemAddressFree(ptr, nbytes), "cuMemAddressFree")

    def vmm_map(self, ptr: int, nbytes: int, handle: int, offset: int = 0) -> None:
        """``cuMemMap``: back ``nbytes`` at the reserved ``ptr`` with ``handle``'s memory from ``offset``."""
        self._enter_any()
        _check(cu.cuMemMap(ptr, nbytes, offset, handle, 0), "cuMemMap")

    def vmm_unmap(self, ptr: int, nbytes: int) -> None:
        """``cuMemUnmap`` a mapped range. Does not wait for queued work: synchronize first."""
        self._enter_any()
        _check(cu.cuMemUnmap(ptr, nbytes), "cuMemUnmap")

    def vmm_set_access(self, ordinal: int, ptr: int, nbytes: int) -> None:
        """``cuMemSetAccess``: give device ``ordinal`` read-write access to a mapped range."""
        self._enter(ordinal)
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = ordinal
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(cu.cuMemSetAccess(ptr, nbytes, [desc], 1), "cuMemSetAccess")
