"""Reduction operators and the dtype table of the collective layer.

Rules:
- Data movement (broadcast, all_gather, send, recv) takes every Ignis dtype:
  the bytes travel as ``uint8``.
- Reductions take the types NCCL reduces: int8, uint8, int32, uint32, int64,
  uint64, float16, bfloat16, float32, float64, and the float8 types (NCCL
  2.24 or later). ``complex64`` is reduced as pairs of float32 for sum and avg;
  its prod, max and min have no element-wise meaning and are refused, as are
  bool, int16 and uint16 (NCCL has no reduction for them).
- ``avg`` divides the sum by the number of ranks; integer types truncate
  toward zero (NCCL's ncclAvg).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from .. import dtypes as _dt
from ..dtypes import DType

__all__ = ["ReduceOp", "NCCL_DTYPES", "NCCL_UINT8", "Plan", "reduction_plan", "movement_plan"]


class ReduceOp(enum.Enum):
    """A reduction; the value (also ``code``, a plain attribute) is NCCL's ``ncclRedOp_t``."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4

    def __init__(self, code: int) -> None:
        # The value as a plain attribute: the enqueue path reads it on every call, and
        # ``Enum.value`` is a property computed in Python.
        self.code = code

    @classmethod
    def parse(cls, op: "ReduceOp | str") -> "ReduceOp":
        """The ``ReduceOp`` that ``op`` names.

        Args:
            op: a ``ReduceOp``, or its name in any case (``"sum"``, ``"MAX"``...).

        Raises:
            ValueError: ``op`` names no reduction; the message lists them.
        """
        found = _BY_NAME.get(op)  # a ReduceOp maps to itself
        if found is not None:
            return found
        if isinstance(op, str):
            found = _BY_NAME.get(op.strip().lower())
            if found is not None:
                return found
        raise ValueError(f"unknown reduction {op!r}; use one of: "
                         f"{', '.join(m.name.lower() for m in cls)} (or ig.collective.ReduceOp)")


_BY_NAME: dict = {**{m.name.lower(): m for m in ReduceOp}, **{m: m for m in ReduceOp}}

# ncclDataType_t codes (nccl.h).
NCCL_UINT8 = 1
NCCL_DTYPES: dict[DType, int] = {
    _dt.int8: 0, _dt.uint8: 1, _dt.int32: 2, _dt.uint32: 3, _dt.int64: 4, _dt.uint64: 5,
    _dt.float16: 6, _dt.float32: 7, _dt.float64: 8, _dt.bfloat16: 9,
    _dt.float8_e4m3fn: 10, _dt.float8_e5m2: 11,
}
FP8 = frozenset({_dt.float8_e4m3fn, _dt.float8_e5m2})
_FLOATS = frozenset({_dt.float16, _dt.bfloat16, _dt.float32, _dt.float64} | FP8)


class Plan(NamedTuple):
    """How an array travels: NCCL's datatype code, elements per array element,
    the NumPy type the emulator computes in, and whether avg truncates."""

    nccl_dtype: int
    per_element: int
    numpy: np.dtype
    is_float: bool


def reduction_plan(dt: DType, op: ReduceOp, what: str) -> Plan:
    """The plan for reducing ``dt`` with ``op``; ``ValueError`` when NCCL cannot."""
    code = NCCL_DTYPES.get(dt)
    if code is not None:
        return Plan(code, 1, dt.numpy, dt in _FLOATS)
    if dt is _dt.complex64 and op in (ReduceOp.SUM, ReduceOp.AVG):
        return Plan(NCCL_DTYPES[_dt.float32], 2, np.dtype(np.float32), True)
    names = ", ".join(d.name for d in NCCL_DTYPES)
    hint = ("; complex64 reduces only with sum or avg" if dt is _dt.complex64
            else "; cast to int32 or float32 first")
    raise ValueError(f"{what}: NCCL has no {op.name.lower()} reduction for {dt.name} "
                     f"(reductions take {names}){hint}")


def movement_plan(dt: DType) -> Plan:
    """Data movement: any dtype, as bytes."""
    return Plan(NCCL_UINT8, dt.itemsize, np.dtype(np.uint8), False)
