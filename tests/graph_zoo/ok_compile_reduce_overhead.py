"""Correct: torch.compile(mode="reduce-overhead") (CUDA graph trees) of an inference loop and
of a training step."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).cuda()


@torch.compile(mode="reduce-overhead")
def infer(x):
    with torch.no_grad():
        return model(x).relu().sum(dim=1)


total = 0.0
for i in range(6):
    out = infer(torch.randn(32, 64, device="cuda"))
    total += out.clone().sum().item()

opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(mode="reduce-overhead")
def train_step(x):
    loss = model(x).square().mean()
    loss.backward()
    return loss


for i in range(5):
    opt.zero_grad(set_to_none=False)
    loss = train_step(torch.randn(32, 64, device="cuda"))
    opt.step()
print("ZOO result", total, loss.item())
