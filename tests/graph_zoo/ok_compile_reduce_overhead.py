"""Correct: torch.compile(mode="reduce-overhead") (CUDA graph trees): an inference loop, and a
training loop whose compiled model's forward and backward run as graphs (each step marked)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
cmodel = torch.compile(model, mode="reduce-overhead")

total = 0.0
with torch.no_grad():
    for i in range(6):
        out = cmodel(torch.randn(32, 64, device="cuda"))
        total += out.relu().sum().item()

opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(5):
    torch.compiler.cudagraph_mark_step_begin()
    opt.zero_grad(set_to_none=False)
    loss = cmodel(torch.randn(32, 64, device="cuda")).square().mean()
    loss.backward()
    opt.step()
print("ZOO result", total, loss.item())
