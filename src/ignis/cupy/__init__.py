"""``ignis.cupy``: Ignis's debug guard as CuPy's allocator (extra: CuPy itself).

    import ignis.cupy
    ignis.cupy.use_guard()          # before the arrays you want guarded
    # or, unmodified: ignis run --guard script.py   (PyTorch and CuPy both)

Every CuPy allocation then comes from the same guard PyTorch's tensors use
under ``ignis.torch.use_guard()`` (a ``DebugGuardResource`` over Ignis's
pool, one per device): canaries before and after each array, poison on
allocation and on free, a quarantine before reuse, checked on the device in
batches. CuPy arrays and kernels (``RawKernel``, ``ElementwiseKernel``,
reductions, cuBLAS...) that write past either end of an array, or into an
array already freed, damage the canaries or the poison and are reported with
the array's size, tag ``"cupy"``, allocation site and the bytes found.
Never-written memory reads as the poison byte (0xA5 by default).

What CuPy cannot give: a per-kernel launch hook. Races between streams in
CuPy kernels are therefore seen by the sanitizer only where the program
declares the access: run the kernel with ``ig.launch`` on arrays shared through
DLPack (``ig.from_dlpack(cupy_array)``), or declare it with the tracked-use API
(``ignis.torch.use(tensor, access, stream=...)`` for a tensor). Out-of-bounds
writes and writes after free in CuPy kernels are found all the same, since they
damage the guard bytes and the poison, and never-written memory reads as the
poison byte.
CuPy frees have no stream of their own: an array is freed in order on the
stream that was current when it was allocated; use it on another stream only
with your own synchronization before you drop it.

Importing this package imports neither CuPy nor PyTorch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["use_guard", "check", "reports", "summary"]


def use_guard(**options: Any) -> None:
    """Install the guard as CuPy's allocator (``cupy.cuda.set_allocator``). Options as
    ``ignis.torch.use_guard`` (one set per process: PyTorch and CuPy share the guard)."""
    from ..torch._guard import use_cupy_guard
    use_cupy_guard(**options)


def check(*, raise_: bool = True) -> list:
    """Check every guarded array now; return (or raise the first of) the problems found
    since the previous check. The same as ``ignis.torch.check()``."""
    from ..torch._guard import check as _check
    return _check(raise_=raise_)


def reports() -> list:
    """The problems the guard found so far (grouped; those not sent to the sanitizer)."""
    from ..torch._guard import reports as _reports
    return _reports()


def summary() -> str:
    """What the guards checked and found, as text (the same as ``ignis.torch``'s guard summary)."""
    from ..torch._guard import summary as _summary
    return _summary()
