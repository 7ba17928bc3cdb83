"""A write through a stale tensor after its memory was freed: the program keeps the
raw pointer, frees the tensor, then writes through a tensor made over the pointer."""

import cupy
import torch

t = torch.ones(1024, device="cuda")  # SITE:t
ptr = t.data_ptr()
del t  # freed: the guard poisons it and keeps it in its quarantine
stale = cupy.ndarray((1024,), cupy.float32, cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, 4096, None), 0))
torch.from_dlpack(stale)[:8].fill_(42.0)  # the bug: a stale tensor written after the free
torch.cuda.synchronize()
print("ZOO done")
