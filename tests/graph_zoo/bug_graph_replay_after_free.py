"""Bug: a graph replayed after a tensor it captured was freed and its memory given to a new
tensor: the replay reads the new tensor's bytes."""
import torch

x = torch.ones(1 << 16, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x * 2
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 2
del x
z = torch.full((1 << 16,), 5.0, device="cuda")   # may land on x's old memory
g.replay()
torch.cuda.synchronize()
print("ZOO result", y.sum().item(), z.sum().item())
