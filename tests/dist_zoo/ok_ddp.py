"""Correct: DistributedDataParallel with gradient-as-bucket-view, a communication hook, and
no_sync gradient accumulation, small buckets (several all-reduces per step), AdamW."""
import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_common import finish, setup

rank = setup()
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
ddp = DDP(model, bucket_cap_mb=0.1, gradient_as_bucket_view=True)
ddp.register_comm_hook(None, default_hooks.allreduce_hook)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
g = torch.Generator(device="cuda").manual_seed(1 + rank)
for step in range(6):
    opt.zero_grad(set_to_none=False)
    with ddp.no_sync():  # accumulate one micro-batch locally
        x = torch.randn(32, 128, device="cuda", generator=g)
        ddp(x).square().mean().backward()
    x = torch.randn(32, 128, device="cuda", generator=g)
    loss = ddp(x).square().mean()
    loss.backward()
    opt.step()
finish(rank, loss.item())
