"""Value types every layer shares (foundation: imports nothing of Ignis).

``Access`` says what a use does to memory's bytes. The runtime's kernels declare
it for their array arguments, the memory layer orders uses by it, the sanitizer
checks it and the arrays, subsystems and front ends pass it; so it lives below
all of them, next to ``errors``, ``dtypes`` and ``units``. Its public homes are
``ignis.Access`` and ``ignis.memory.Access`` (the same class).

``MAX_NDIM``, ``MAX_EXTENT`` and ``shape_problem`` say which shapes an array can have:
those every format Ignis exports to can describe. The arrays refuse the others when
they are made or reshaped, and the safetensors reader refuses them in a header, so a
file Ignis writes is one it reads back.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Access", "MAX_NDIM", "MAX_EXTENT", "shape_problem"]

# NumPy's NPY_MAXDIMS: what a NumPy array (a DLPack import, a safetensors load) can have.
MAX_NDIM = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
# The most bytes an array's dimensions may span, a zero dimension counted as 1: DLPack's
# shape and strides are int64 (the stride of the first dimension is the product of the
# others times the item size, even when another dimension is 0), and NumPy's limit too.
MAX_EXTENT = (1 << 63) - 1


def shape_problem(shape: "tuple[int, ...] | list[int]", itemsize: int) -> str | None:
    """What makes ``shape`` (non-negative ints) impossible for an array of ``itemsize``-byte
    elements in the formats Ignis exports to (DLPack, safetensors, NumPy), or None.

    Args:
        shape: the dimensions.
        itemsize: bytes per element.
    """
    if len(shape) > MAX_NDIM:
        return f"shape has {len(shape)} dimensions; arrays have at most {MAX_NDIM} (NumPy's limit)"
    extent = itemsize
    for d in shape:
        extent *= d or 1
        if extent > MAX_EXTENT:
            return (f"it is too large: its dimensions span more than 2**63 - 1 bytes (8 EiB) of {itemsize}-byte "
                    "elements (a zero dimension counted as 1), past what DLPack's int64 shape and strides, "
                    "NumPy and the safetensors readers describe, and any device's memory")
    return None


class Access(enum.Enum):
    """What a use does to a block's bytes.

    READ waits on a prior write from another stream. WRITE and READ_WRITE
    also wait on every outstanding read from another stream, and become the
    block's last write.

    Wherever an access is taken, the strings ``"read"``, ``"write"`` and
    ``"read_write"`` (any case, ``-`` for ``_``) are accepted too (``parse``).

    Attributes:
        reads: True if the use reads the bytes (READ, READ_WRITE).
        writes: True if the use writes the bytes (WRITE, READ_WRITE).
    """

    READ = (True, False)
    WRITE = (False, True)
    READ_WRITE = (True, True)

    def __init__(self, reads: bool, writes: bool) -> None:
        self.reads = reads
        self.writes = writes

    @classmethod
    def parse(cls, x: "Access | str") -> "Access":
        """The ``Access`` that ``x`` names.

        Args:
            x: an ``Access``, or its name as a string (``"read"``, ``"WRITE"``, ``"read-write"``...).

        Raises:
            ValueError: ``x`` names no access.
        """
        if isinstance(x, Access):
            return x
        try:
            return cls[str(x).upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown access {x!r}; use Access.READ, Access.WRITE or Access.READ_WRITE") from None
