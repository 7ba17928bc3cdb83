"""Correct: functional collectives (what FSDP2 and compiled programs use), each result read
after wait_tensor; point-to-point send/recv between the two ranks."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from dist_common import finish, setup

rank = setup()
x = torch.full((4096,), float(rank + 1), device="cuda")
r = fc.wait_tensor(fc.all_reduce(x, "sum", dist.group.WORLD))
g = fc.wait_tensor(fc.all_gather_tensor(x, 0, dist.group.WORLD))
s = fc.wait_tensor(fc.reduce_scatter_tensor(g, "sum", 0, dist.group.WORLD))
buf = torch.empty(4096, device="cuda")
if rank == 0:
    dist.send(x * 3, dst=1)
    dist.recv(buf, src=1)
else:
    dist.recv(buf, src=0)
    dist.send(x * 5, dst=0)
finish(rank, (r.sum() + g.sum() + s.sum() + buf.sum()).item())
