"""Bug: an asynchronous all_reduce, and its buffer read on the compute stream before
work.wait(): the read may see the data before, during or after the reduction."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
t = torch.full((1 << 20,), float(rank + 1), device="cuda")
work = dist.all_reduce(t, async_op=True)
early = t.sum()
work.wait()
finish(rank, early.item())
