"""Bug: all_gather_into_tensor with async_op, then its input overwritten on the compute
stream before work.wait(): the collective may send the new values."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
shard = torch.full((1 << 18,), float(rank), device="cuda")
whole = torch.empty(2 << 18, device="cuda")
work = dist.all_gather_into_tensor(whole, shard, async_op=True)
shard.fill_(-1.0)
work.wait()
finish(rank, whole.sum().item())
