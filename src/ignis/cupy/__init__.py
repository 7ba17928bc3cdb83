"""``ignis.cupy``: Ignis's debug guard as CuPy's allocator (extra: CuPy itself).

    import ignis.cupy
    ignis.cupy.use_guard()          # before the arrays you want guarded
    # or, unmodified: ignis run --guard script.py   (PyTorch and CuPy both)

Every CuPy allocation then comes from the same guard PyTorch's tensors use
under ``ignis.torch.use_guard()`` (a ``DebugGuardResource`` over Ignis's
pool, one per device: ``ignis.memory.guard_front``): canaries before and after each array, poison on
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

This package is the guard's CuPy adapter: it installs the front's compiled
allocate and free (``ignis.memory.guard_alloc``) as CuPy's allocator; everything
else is the front's. Importing it imports neither CuPy nor PyTorch.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..memory import guard_front as _front
from ..safety.frames import add_library_dir
from ..memory.guard_alloc import alloc as _alloc, free as _free, state as _s

__all__ = ["use_guard", "check", "reports", "summary"]


class _CupyHold:
    """What CuPy keeps for one allocation; frees it through the guard when CuPy lets go."""

    __slots__ = ("ptr", "size", "device", "handle")

    def __init__(self, ptr: int, size: int, device: int, handle: int) -> None:
        self.ptr, self.size, self.device, self.handle = ptr, size, device, handle

    def __del__(self) -> None:
        try:
            _free(self.ptr, self.size, self.device, self.handle)
        except Exception:
            pass


def _cupy_allocator(cupy: Any) -> Callable[[int], Any]:
    def allocate(nbytes: int) -> Any:
        dev = cupy.cuda.runtime.getDevice()
        if nbytes <= 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev), 0)
        stream = cupy.cuda.get_current_stream()
        handle = stream.ptr
        ptr = _alloc(nbytes, dev, handle, "cupy", None if handle == 0 else stream)
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, _CupyHold(ptr, nbytes, dev, handle), dev)
        return cupy.cuda.MemoryPointer(mem, 0)

    return allocate


def use_guard(**options: Any) -> None:
    """Install the guard as CuPy's allocator (``cupy.cuda.set_allocator``). Arrays allocated
    before keep their old allocator. Options as ``ignis.torch.use_guard`` (one set per
    process: PyTorch and CuPy share the guard)."""
    import cupy

    _front.configure(options)
    with _s.lock:
        if _s.cupy:
            return
        from ..backends import get_backend
        if not get_backend().cuda_driver:
            raise _front.GuardError(f"the guard under CuPy needs Ignis's cuda backend (the active backend is "
                                    f"{get_backend().name})")
        cupy.cuda.set_allocator(_cupy_allocator(cupy))
        _s.use_framework("cupy")
        add_library_dir(os.path.dirname(cupy.__file__))
        _front.print_at_exit()


def check(*, raise_: bool = True) -> list:
    """Check every guarded array now; return (or raise the first of) the problems found
    since the previous check. The same as ``ignis.torch.check()``."""
    return _front.check(raise_=raise_)


def reports() -> list:
    """The problems the guard found so far (grouped; those not sent to the sanitizer)."""
    return _front.reports()


def summary() -> str:
    """What the guards checked and found, as text (the same as ``ignis.torch``'s guard summary)."""
    return _front.summary()
