"""Bug for the guard: a Triton kernel with a wrong mask writes 64 floats past the end of a
4 KiB tensor, inside a CUDA graph replay."""
import torch

from zoo_triton import launch

x = torch.ones(1024, device="cuda")
y = torch.zeros(1024, device="cuda")  # SITE:y
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    launch(x, y)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    launch(x, y, extra=64)
g.replay()
torch.cuda.synchronize()
print("ZOO result", y.sum().item())
