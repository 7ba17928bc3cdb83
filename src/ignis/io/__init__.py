"""Subsystem (layer 5): safetensors files straight to and from device memory.

``load_safetensors`` / ``safe_open`` read a file into device arrays (one
allocation, views into it) through a ring of pinned buffers that overlaps
file reads with host-to-device copies; ``save_safetensors`` runs the mirror
image and writes the format byte for byte as the reference library does.
Headers are untrusted input: a malformed file raises ``SafetensorsError``
before anything is allocated. Arrays are held by the ``"io"`` owner while
their bytes move.
"""

from .format import MAX_HEADER_SIZE, SafetensorsError, TensorEntry
from .load import SafetensorsFile, load_safetensors, safe_open
from .pipeline import PipelineOptions
from .save import save_safetensors

__all__ = ["load_safetensors", "save_safetensors", "safe_open", "SafetensorsFile", "SafetensorsError",
           "TensorEntry", "PipelineOptions", "MAX_HEADER_SIZE"]
