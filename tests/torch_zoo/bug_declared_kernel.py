"""Bug with a kernel the dispatcher cannot see (here CuPy's, as a Triton or extension
kernel would be): it writes a tensor on a side stream, declared with ignis.torch.use,
and the default stream reads the tensor without waiting."""
import cupy as cp
import torch

import ignis.torch

side = torch.cuda.Stream()
out = torch.zeros(1 << 20, device="cuda")
torch.cuda.synchronize()
with ignis.torch.use(out, "write", stream=side):
    with cp.cuda.ExternalStream(side.cuda_stream):
        cp.from_dlpack(out).fill(5.0)         # an invisible write on the side stream
print("sum", float(out.sum()))                # read on the default stream: no wait_stream
