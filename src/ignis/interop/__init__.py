"""Interop (layer 5): DLPack, the CUDA array interface, and allocator plug-ins."""

from .dlpack import from_dlpack

__all__ = ["from_dlpack"]
