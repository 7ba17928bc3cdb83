#!/usr/bin/env python3
"""PyTorch and Ignis sharing memory both ways through DLPack, zero-copy.

1. Export: ``torch.from_dlpack(array)`` gives a tensor over the array's
   memory. On a GPU it is a CUDA tensor, and the stream handshake makes
   PyTorch's current stream wait (on the device) for the array's pending
   writes; on the emulated backend it is a CPU tensor at the emulator's
   host address. A write through the tensor is seen by the array.
2. The export is counted: ``array.free()`` is refused while the tensor is
   alive (PyTorch could still use the memory); once it is dropped, free works.
3. Import: ``ig.from_dlpack(tensor)`` gives an NvArray over PyTorch's memory
   that keeps the tensor alive; Ignis writes into it, PyTorch sees it.

Runs with PyTorch's CPU build on the emulated backend, and with a CUDA build
on a GPU. Without PyTorch it says so and exits 0. Run from the repository
root::

    .venv/bin/python examples/torch_interop.py

It prints each step and ``torch interop OK`` (exit status 0).
"""

from __future__ import annotations

import sys

import numpy as np

import ignis as ig


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch interop: skipped: PyTorch is not installed (pip install torch)")
        return 0
    emulated = ig.backend_name() == "emulated"
    if not emulated and not torch.cuda.is_available():
        print("torch interop: skipped: the cuda backend is active but this PyTorch build has no CUDA")
        return 0
    dev = ig.Device(0)
    where = "cpu" if emulated else f"cuda:{dev.ordinal}"
    print(f"torch {torch.__version__}, ignis on {dev.name} ({ig.backend_name()} backend): "
          f"exported tensors live on {where}")
    ok = True

    # 1. Ignis -> PyTorch
    x = ig.from_numpy(np.arange(8, dtype=np.float32))
    t = torch.from_dlpack(x)                       # zero-copy; PyTorch's stream waits for x's upload
    t.mul_(2)                                      # PyTorch writes into Ignis memory
    if not emulated:
        torch.cuda.current_stream().synchronize()  # the write is on PyTorch's stream, not x's
    seen = x.to_numpy()
    ok &= bool(np.array_equal(seen, np.arange(8, dtype=np.float32) * 2))
    print(f"export: torch.from_dlpack(x) -> {tuple(t.shape)} {t.dtype} on {t.device}; after t.mul_(2) "
          f"x holds {seen}")

    # 2. the export is counted
    try:
        x.free()
        ok = False
        print("x was freed while PyTorch still held its memory")
    except ig.MemoryContractViolation as e:
        print(f"free while the tensor is alive: refused: {str(e).splitlines()[0][:150]}...")
    del t                                          # PyTorch lets go (the DLPack deleter runs)
    x.free()
    print("after `del t`: x.free() works")

    # 3. PyTorch -> Ignis
    src = torch.arange(6, dtype=torch.float32, device=where).reshape(2, 3)
    y = ig.from_dlpack(src)                        # an NvArray over PyTorch's memory; keeps src alive
    print(f"import: ig.from_dlpack(tensor) -> shape {y.shape} {y.dtype.name}, owns_memory={y.owns_memory}, "
          f"values {y.to_numpy().tolist()}")
    y.fill_(5.0)                                   # Ignis writes into PyTorch memory
    y.stream.synchronize()
    ok &= bool(torch.all(src == 5).item())
    print(f"after y.fill_(5.0): the tensor holds {src.tolist()}")
    del y

    print("torch interop OK" if ok else "torch interop FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
