"""Correct: a user Triton kernel writes y on a side stream; the default stream waits for it
before reading y."""
import torch

from zoo_triton import launch

x = torch.arange(4096, device="cuda", dtype=torch.float32)
y = torch.empty_like(x)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    launch(x, y)
torch.cuda.current_stream().wait_stream(side)
y.record_stream(side)
print("ZOO result", y.sum().item())
