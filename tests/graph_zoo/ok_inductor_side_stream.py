"""Correct: an Inductor-compiled model, its input prefetched on a side stream and handed over
with wait_stream and record_stream."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 16)).cuda()
fwd = torch.compile(model)
side = torch.cuda.Stream()
host = [torch.randn(64, 256).pin_memory() for _ in range(3)]
total = 0.0
for step in range(6):
    with torch.cuda.stream(side):
        x = host[step % 3].to("cuda", non_blocking=True)
    torch.cuda.current_stream().wait_stream(side)
    x.record_stream(torch.cuda.current_stream())
    total += fwd(x).sum().item()
print("ZOO result", total)
