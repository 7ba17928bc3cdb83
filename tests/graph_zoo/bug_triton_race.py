"""Bug: a Triton kernel writes y on a side stream and the default stream reads y with nothing
ordering the two."""
import torch

from zoo_triton import launch

x = torch.arange(4096, device="cuda", dtype=torch.float32)
y = torch.zeros_like(x)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    launch(x, y)
total = y.sum()
torch.cuda.synchronize()
print("ZOO result", total.item())
