"""Correct: FSDP2 (fully_shard on each layer and the root), AdamW, a few steps."""
import torch
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from dist_common import finish, setup

rank = setup()
model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(4)], nn.Linear(256, 8)).cuda()
for layer in model[:4]:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator(device="cuda").manual_seed(1 + rank)
for step in range(5):
    x = torch.randn(16, 256, device="cuda", generator=g)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
finish(rank, loss.item())
