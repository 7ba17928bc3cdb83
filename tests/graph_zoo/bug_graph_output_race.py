"""Bug: a graph replayed on a side stream, its output read on the default stream without
waiting for the replay."""
import torch

x = torch.ones(1 << 16, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x * 3
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 3
rep = torch.cuda.Stream()
rep.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(rep):
    g.replay()
total = y.sum()
torch.cuda.synchronize()
print("ZOO result", total.item())
