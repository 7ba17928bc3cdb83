"""The CUDA driver's Python binding (``cuda-bindings``; None where it is not installed) and
the one place where the driver's statuses become errors (``_check``), shared by the cuda
backend (``cuda.py``) and its VMM operations (``vmm_cuda.py``)."""

from __future__ import annotations

from typing import Any

from ..errors import DriverError

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - cuda-python < 12.6 layout, or not installed
    try:
        from cuda import cuda as cu  # type: ignore[no-redef]
    except ImportError:
        cu = None  # type: ignore[assignment]

__all__: list[str] = []


def _describe(err: Any) -> str:
    """The driver's own description of ``err`` ("" when it has none)."""
    try:
        res = cu.cuGetErrorString(err)
    except Exception:
        return ""
    if res[0] or not res[1]:
        return ""
    text = res[1]
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def _error(err: Any, call: str, detail: str = "") -> DriverError:
    status = int(err)
    name = getattr(err, "name", None) or f"CUDA_ERROR_{status}"
    return DriverError(status, name, call, detail or _describe(err))


def _check(res: tuple, call: str) -> tuple:
    """Raise DriverError unless ``res`` (a binding's result tuple) is CUDA_SUCCESS."""
    if res[0]:
        raise _error(res[0], call)
    return res
