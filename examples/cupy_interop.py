#!/usr/bin/env python3
"""CuPy and Ignis: zero-copy in both directions, and Ignis's pool as CuPy's allocator.

1. Export: ``cupy.from_dlpack(array)`` gives a CuPy array over the NvArray's
   memory (CuPy's current stream waits for the array's pending writes); the
   export is counted, so ``array.free()`` is refused while CuPy holds it.
2. Import: ``ig.from_dlpack(cupy_array)`` gives an NvArray over CuPy's memory
   that keeps the CuPy array alive.
3. Allocator: ``cupy.cuda.set_allocator(ig.interop.cupy_allocator())`` (or,
   for one block of code, ``cupy.cuda.using_allocator(...)``) makes every
   CuPy allocation a block of Ignis's current pool (tag ``"cupy"``), ordered
   on CuPy's current stream, so ``ig.memory_stats()`` counts it.

CuPy runs on a GPU only: on the emulated backend, or without CuPy
installed, the example says why it skips and exits 0. Run from the
repository root::

    .venv/bin/python examples/cupy_interop.py

It prints each step and ``cupy interop OK`` (exit status 0).
"""

from __future__ import annotations

import sys

import numpy as np

import ignis as ig


def main() -> int:
    if ig.backend_name() == "emulated":
        print("cupy interop: skipped: CuPy needs a CUDA GPU, and the emulated backend is active "
              "(the same DLPack exchange runs with PyTorch's CPU build: examples/torch_interop.py)")
        return 0
    try:
        import cupy
    except ImportError:
        print("cupy interop: skipped: CuPy is not installed (pip install cupy-cuda12x)")
        return 0
    dev = ig.Device(0)
    print(f"cupy {cupy.__version__}, ignis on {dev.name}")
    ok = True

    # 1. Ignis -> CuPy
    x = ig.from_numpy(np.arange(8, dtype=np.float32))
    c = cupy.from_dlpack(x)
    c *= 2                                          # CuPy writes into Ignis memory, on its current stream
    cupy.cuda.get_current_stream().synchronize()
    ok &= bool(np.array_equal(x.to_numpy(), np.arange(8, dtype=np.float32) * 2))
    print(f"export: cupy.from_dlpack(x); after c *= 2, x holds {x.to_numpy()}")
    try:
        x.free()
        ok = False
        print("x was freed while CuPy still held its memory")
    except ig.MemoryContractViolation as e:
        print(f"free while CuPy holds it: refused: {str(e).splitlines()[0][:120]}...")
    del c
    x.free()

    # 2. CuPy -> Ignis
    src = cupy.arange(6, dtype=cupy.float32)
    y = ig.from_dlpack(src)
    y.fill_(3.0)
    y.stream.synchronize()
    ok &= bool((src == 3).all())
    print(f"import: ig.from_dlpack(cupy array) -> {y.shape} {y.dtype.name}; after y.fill_(3.0) CuPy sees "
          f"{src.tolist()}")
    del y

    # 3. Ignis's pool under CuPy
    before = ig.memory_stats(dev).get("allocated_bytes.tag:cupy.current", 0)
    with cupy.cuda.using_allocator(ig.interop.cupy_allocator()):
        big = cupy.ones((1024, 1024), dtype=cupy.float32)
        during = ig.memory_stats(dev).get("allocated_bytes.tag:cupy.current", 0)
        ok &= during - before >= big.nbytes
        print(f"allocator: a {big.nbytes >> 20} MiB CuPy array came from Ignis's pool "
              f"(tag 'cupy': {during - before} bytes)")
        del big                                     # goes back to the pool in stream order

    print("cupy interop OK" if ok else "cupy interop FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
