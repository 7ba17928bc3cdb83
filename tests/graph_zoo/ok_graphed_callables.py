"""Correct: make_graphed_callables on a small model, forward and backward, in a training loop."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sample = torch.randn(16, 64, device="cuda")
graphed = torch.cuda.make_graphed_callables(model, (sample,))
loss_fn = nn.CrossEntropyLoss()
for step in range(5):
    x = torch.randn(16, 64, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")
    opt.zero_grad(set_to_none=False)
    loss = loss_fn(graphed(x), y)
    loss.backward()
    opt.step()
print("ZOO result", loss.item())
