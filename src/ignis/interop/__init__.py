"""Interop (layer 5): DLPack, the CUDA array interface, and allocator plug-ins."""

from .allocators import adopt_stream, cupy_allocator
from .convert import asarray
from .dlpack import from_dlpack

__all__ = ["from_dlpack", "asarray", "cupy_allocator", "adopt_stream"]
