"""Correct: torch.compile(mode="reduce-overhead") (CUDA graph trees): an inference loop, and a
training loop (the compiled forward and its backward run as graphs; each step marked; the
gradients set to None between steps, as graph outputs are not to be accumulated into)."""
import torch
import torch.nn as nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
infer = torch.compile(net, mode="reduce-overhead")
total = 0.0
with torch.no_grad():
    for i in range(6):
        out = infer(torch.randn(32, 64, device="cuda"))
        total += out.relu().sum().item()

model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(mode="reduce-overhead")
def forward_loss(x):
    return model(x).square().mean()


for i in range(5):
    torch.compiler.cudagraph_mark_step_begin()
    loss = forward_loss(torch.randn(32, 64, device="cuda"))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    last = loss.item()
print("ZOO result", total, last)
