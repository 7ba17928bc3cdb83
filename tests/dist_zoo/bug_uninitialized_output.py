"""Bug: the output buffer of an all_gather read before the collective filled it."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
shard = torch.full((4096,), float(rank), device="cuda")
whole = torch.empty(2 * 4096, device="cuda")
stale = whole.max()
dist.all_gather_into_tensor(whole, shard)
finish(rank, stale.item() * 0.0 + whole.sum().item())
