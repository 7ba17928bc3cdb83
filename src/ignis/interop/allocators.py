"""Allocator plug-ins: Ignis as the memory layer under other libraries.

``cupy_allocator(mr)`` returns a function for ``cupy.cuda.set_allocator``: every
CuPy allocation becomes a block of ``mr`` (default: the current resource),
ordered on CuPy's current stream, and goes back to ``mr`` in stream order when
CuPy drops it. Foreign stream handles are adopted once (never destroyed) so the
pool's per-stream free lists work as for Ignis's own streams.

A PyTorch plug-in needs a compiled shared library (``CUDAPluggableAllocator``);
Ignis ships none (it has no compiled core), so PyTorch interop goes through
DLPack / ``__cuda_array_interface__`` instead.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..memory import DeviceMemoryResource, get_current_resource
from ..runtime import Device, Stream

__all__ = ["cupy_allocator", "adopt_stream"]

_streams: dict[tuple[int, int], Stream] = {}
_lock = threading.Lock()
_LEGACY = 1  # CU_STREAM_LEGACY: what a NULL stream handle means


def adopt_stream(handle: int, device: "Device | int" = 0) -> Stream:
    """The one ignis Stream for a foreign stream handle (0 means the legacy default stream)."""
    dev = Device(device)
    h = handle or _LEGACY
    key = (id(dev), h)
    s = _streams.get(key)
    if s is None or s.stale:
        with _lock:
            s = _streams.get(key)
            if s is None or s.stale:
                s = _streams[key] = Stream.from_handle(h, dev)
    return s


class _Hold:
    """What CuPy keeps for one allocation; returns the block when CuPy lets go."""

    __slots__ = ("mr", "block")

    def __init__(self, mr: DeviceMemoryResource, block: Any) -> None:
        self.mr, self.block = mr, block

    def __del__(self) -> None:
        try:
            self.mr.deallocate(self.block)
        except Exception:
            pass


def cupy_allocator(mr: DeviceMemoryResource | None = None) -> Callable[[int], Any]:
    """An allocator for ``cupy.cuda.set_allocator`` backed by ``mr``."""
    import cupy as _cupy  # noqa: F401 - fail here, clearly, when CuPy is missing

    def allocate(nbytes: int) -> Any:
        import cupy
        dev_id = cupy.cuda.Device().id
        res = mr or get_current_resource(dev_id)
        if nbytes == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev_id), 0)
        stream = adopt_stream(cupy.cuda.get_current_stream().ptr, dev_id)
        block = res.allocate(nbytes, stream, "cupy")
        mem = cupy.cuda.UnownedMemory(block.ptr, nbytes, _Hold(res, block), dev_id)
        return cupy.cuda.MemoryPointer(mem, 0)

    return allocate
