"""Correct: the capture pattern of PyTorch's CUDA graphs documentation: warm-up on a side
stream, capture, then new data copied into the captured input and the graph replayed."""
import torch

x = torch.zeros(1024, device="cuda")
w = torch.ones(1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = x * w + 1
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * w + 1
total = 0.0
for i in range(5):
    x.copy_(torch.full((1024,), float(i), device="cuda"))
    g.replay()
    total += y.sum().item()
print("ZOO result", total)
