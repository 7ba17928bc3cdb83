"""Interop (layer 5): DLPack, the CUDA array interface, and allocator plug-ins."""

from .. import array as _array
from .allocators import adopt_stream, cupy_allocator
from .dlpack import from_dlpack

_array.adopt_foreign = from_dlpack  # ig.asarray / ig.array.from_dlpack adopt foreign memory through it

__all__ = ["from_dlpack", "cupy_allocator", "adopt_stream"]
