"""Correct mixed program: Ignis writes, the PyTorch stream waits for Ignis's stream (an
event), PyTorch reads and writes the shared memory, and Ignis reads it after a sync."""
import torch

import ignis as ig

a = ig.Device(0).create_stream()
x = ig.zeros(1 << 20, "float32", stream=a)
t = torch.from_dlpack(x)
ig.kernels.fill(x, 3.0, stream=a)
torch.cuda.current_stream().wait_stream(torch.cuda.ExternalStream(a.handle))
t.mul_(2.0)
torch.cuda.synchronize()
assert (x.to_numpy(stream=a) == 6.0).all()
print("ok", float(t.sum()))
