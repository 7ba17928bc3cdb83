"""N alloc/free pairs of the guard through PyTorch's C entry points, on the emulated backend, for
counting the host instructions of the framework allocators' compiled allocate and free (any
tree: it uses only what both old and new trees have):

    for n in 500 1500; do IGNIS_BACKEND=emulated PYTHONPATH=TREE/src valgrind --tool=callgrind \
        '--toggle-collect=*guard_alloc_alloc_c' '--toggle-collect=*guard_alloc_free_c' \
        python3 scripts/probe_guard_pair_instructions.py $n 4096; done

The difference of the two counts over 1000 is one pair's instructions.
"""
import ctypes
import sys

import ignis as ig
from ignis.torch import _guard as tg
from ignis.torch import _guard_fast as _fast
n, size = int(sys.argv[1]), int(sys.argv[2])
lib = ctypes.CDLL(_fast.__file__)
c_alloc = lib.ignis_torch_alloc; c_alloc.restype = ctypes.c_void_p
c_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
c_free = lib.ignis_torch_free; c_free.restype = None
c_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
tg._reset(); tg._configure({})
_fast.torch_guard_bind(tg._alloc, tg._free)
g = tg.guard_resource(0)
s = ig.Device(0).create_stream()
for _ in range(20):
    p = c_alloc(size, 0, s.handle); c_free(p, size, 0, s.handle)
s.synchronize()
for _ in range(n):
    p = c_alloc(size, 0, s.handle); c_free(p, size, 0, s.handle)
s.synchronize()
tg._reset()
