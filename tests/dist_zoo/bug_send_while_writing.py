"""Bug: a side stream writes a tensor, and the tensor is sent without waiting for that stream:
the process group orders its stream after the current stream only."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
side = torch.cuda.Stream()
msg = torch.empty(1 << 20, device="cuda")
with torch.cuda.stream(side):
    msg.copy_(torch.full((1 << 20,), float(rank + 7), device="cuda"))
buf = torch.empty(1 << 20, device="cuda")
if rank == 0:
    dist.send(msg, dst=1)
    dist.recv(buf, src=1)
else:
    dist.recv(buf, src=0)
    dist.send(msg, dst=0)
torch.cuda.synchronize()
finish(rank, buf.sum().item())
