"""Value types every layer shares (foundation: imports nothing of Ignis).

``Access`` says what a use does to memory's bytes. The runtime's kernels declare
it for their array arguments, the memory layer orders uses by it, the sanitizer
checks it and the arrays, subsystems and front ends pass it; so it lives below
all of them, next to ``errors``, ``dtypes`` and ``units``. Its public homes are
``ignis.Access`` and ``ignis.memory.Access`` (the same class).
"""

from __future__ import annotations

import enum

__all__ = ["Access"]


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
