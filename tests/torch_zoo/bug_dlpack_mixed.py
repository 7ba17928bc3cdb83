"""Bug in a mixed program: Ignis writes an array on its stream, and PyTorch reads the
same memory (torch.from_dlpack) on its own stream without waiting for that write."""
import torch

import ignis as ig

a = ig.Device(0).create_stream()
x = ig.zeros(1 << 20, "float32", stream=a)
t = torch.from_dlpack(x)                 # shared memory: the handshake orders the zeros only
torch.cuda.synchronize()
ig.kernels.fill(x, 3.0, stream=a)        # Ignis writes on stream a
total = t.sum()                          # PyTorch reads on its stream: not ordered after the fill
torch.cuda.synchronize()
print("sum", float(total))
