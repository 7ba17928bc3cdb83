"""A custom kernel (CuPy RawKernel, through DLPack) writes 64 floats past the end of
a 4 KiB torch tensor, and 16 floats before the start of another. Compute Sanitizer
stays silent (the writes land inside the caching allocator's segment); the guard
reports both with the tensor's size, allocation site and the bytes found."""

import cupy
import torch

from zoo_common import write_kernel

k = write_kernel()
a = torch.zeros(1024, device="cuda")  # SITE:a
b = torch.zeros(1024, device="cuda")  # its neighbour
k((1,), (64,), (cupy.from_dlpack(a), cupy.int64(1024), cupy.int32(64), cupy.float32(7.0)))
torch.cuda.synchronize()
print("ZOO neighbour intact:", bool((b == 0).all()))
c = torch.zeros(256, device="cuda")  # SITE:c
k((1,), (16,), (cupy.from_dlpack(c), cupy.int64(-16), cupy.int32(16), cupy.float32(3.0)))
torch.cuda.synchronize()
del a, c
torch.cuda.synchronize()
print("ZOO done")
