"""The dtype table: one row per element type Ignis moves.

Each row names the item size, the NumPy dtype (bfloat16 and float8 come from
``ml_dtypes``), the DLPack ``(code, bits)`` pair and the safetensors code.
``dtype(x)`` resolves a name, a ``DType``, a NumPy dtype, type or type code
(``"f4"``) or a safetensors code, and raises ``ValueError`` listing the valid
names when it cannot. ``dtype(None)`` is the default, float32, everywhere.

A ``DType`` compares equal to everything that resolves to it, as NumPy's dtypes
do: ``a.dtype == np.float32``, ``== "float32"``, ``== np.dtype("f4")``; and
``np.dtype(a.dtype)`` is the NumPy dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "DType",
    "dtype",
    "from_safetensors",
    "from_dlpack",
    "names",
    "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "complex64",
]

# DLPack DLDataTypeCode values (dlpack.h, v1.1).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_DL_F8_E4M3FN, _DL_F8_E5M2 = 10, 12


@dataclass(frozen=True, slots=True, eq=False)
class DType:
    """One element type. Rows are unique, so identity works; ``==`` also accepts a
    name, a NumPy dtype or type, or a type code (``"f4"``).

    The rows are made once, in this module (``ig.float32``...); get one with
    ``ig.dtype(x)`` rather than building it.

    Args:
        name: the canonical name (``"float32"``).
        itemsize: bytes per element.
        numpy: the NumPy dtype.
        dlpack_code: the DLPack type code (``DLDataTypeCode``).
        safetensors: the safetensors dtype code (``"F32"``).
    """

    name: str
    itemsize: int
    numpy: np.dtype
    dlpack_code: int
    safetensors: str

    @property
    def dlpack(self) -> tuple[int, int, int]:
        """The DLPack ``(code, bits, lanes)`` triple."""
        return (self.dlpack_code, self.itemsize * 8, 1)

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype (so ``np.dtype(ig.float32)`` works)."""
        return self.numpy

    def __eq__(self, other: Any) -> bool:
        if other is self:
            return True
        if isinstance(other, DType) or other is None:
            return False
        try:
            return dtype(other) is self
        except (ValueError, TypeError):
            return False

    def __hash__(self) -> int:
        return hash(self.numpy)

    def __repr__(self) -> str:
        return f"ignis.{self.name}"

    def __str__(self) -> str:
        return self.name


def _row(name: str, np_dtype: Any, code: int, st: str) -> DType:
    npd = np.dtype(np_dtype)
    return DType(name, npd.itemsize, npd, code, st)


bool_ = _row("bool", np.bool_, _DL_BOOL, "BOOL")
uint8 = _row("uint8", np.uint8, _DL_UINT, "U8")
int8 = _row("int8", np.int8, _DL_INT, "I8")
int16 = _row("int16", np.int16, _DL_INT, "I16")
uint16 = _row("uint16", np.uint16, _DL_UINT, "U16")
float16 = _row("float16", np.float16, _DL_FLOAT, "F16")
bfloat16 = _row("bfloat16", ml_dtypes.bfloat16, _DL_BFLOAT, "BF16")
int32 = _row("int32", np.int32, _DL_INT, "I32")
uint32 = _row("uint32", np.uint32, _DL_UINT, "U32")
float32 = _row("float32", np.float32, _DL_FLOAT, "F32")
float64 = _row("float64", np.float64, _DL_FLOAT, "F64")
int64 = _row("int64", np.int64, _DL_INT, "I64")
uint64 = _row("uint64", np.uint64, _DL_UINT, "U64")
float8_e4m3fn = _row("float8_e4m3fn", ml_dtypes.float8_e4m3fn, _DL_F8_E4M3FN, "F8_E4M3")
float8_e5m2 = _row("float8_e5m2", ml_dtypes.float8_e5m2, _DL_F8_E5M2, "F8_E5M2")
complex64 = _row("complex64", np.complex64, _DL_COMPLEX, "C64")

_ALL: tuple[DType, ...] = (
    bool_, uint8, int8, int16, uint16, float16, bfloat16, int32, uint32, float32, float64,
    int64, uint64, float8_e4m3fn, float8_e5m2, complex64,
)

_BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
_BY_NAME.update({"bool_": bool_, "half": float16, "float": float32, "double": float64})
_BY_NUMPY: dict[np.dtype, DType] = {d.numpy: d for d in _ALL}
_BY_SAFETENSORS: dict[str, DType] = {d.safetensors: d for d in _ALL}
_BY_DLPACK: dict[tuple[int, int], DType] = {(d.dlpack_code, d.itemsize * 8): d for d in _ALL}


def names() -> list[str]:
    """The canonical dtype names, in table order."""
    return [d.name for d in _ALL]


DEFAULT = float32  # what dtype=None means, in every factory


def dtype(x: Any) -> DType:
    """Resolve ``x`` to a DType: a name (``"float32"``), a NumPy type code (``"f4"``), a
    safetensors code (``"F32"``), a DType, a NumPy dtype or type (``np.float32``), or
    None (the default, float32).

    Raises:
        ValueError: ``x`` names no dtype Ignis knows; the message lists the valid names.
    """
    if isinstance(x, DType):
        return x
    if x is None:
        return DEFAULT
    if isinstance(x, str):
        d = _BY_NAME.get(x) or _BY_SAFETENSORS.get(x)
        if d is not None:
            return d
    if not isinstance(x, (bool, int, float)):  # np.dtype() reads 0 or 1.0 as a type; those are not dtypes
        try:
            d = _BY_NUMPY.get(np.dtype(x))
        except (TypeError, ValueError, SyntaxError):
            d = None
        if d is not None:
            return d
    raise ValueError(f"unknown dtype {x!r}; valid dtypes are: {', '.join(names())}")


def from_safetensors(code: str) -> DType:
    """The DType of a safetensors dtype code ("F32", "BF16", ...)."""
    d = _BY_SAFETENSORS.get(code)
    if d is None:
        raise ValueError(f"unknown safetensors dtype {code!r}; "
                         f"valid codes are: {', '.join(_BY_SAFETENSORS)}")
    return d


def from_dlpack(code: int, bits: int, lanes: int = 1) -> DType:
    """The DType of a DLPack ``(code, bits, lanes)``."""
    d = _BY_DLPACK.get((code, bits))
    if d is None or lanes != 1:
        raise ValueError(f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}); "
                         f"supported: {', '.join(names())}")
    return d
