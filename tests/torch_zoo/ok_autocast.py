"""Correct: mixed precision (autocast to bfloat16) forward, backward and optimizer steps,
with a side stream computing an exponential moving average of the weights."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 1)).cuda()
ema = [p.detach().clone() for p in model.parameters()]
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
side = torch.cuda.Stream()
x = torch.randn(32, 128, device="cuda")
y = torch.randn(32, 1, device="cuda")
for step in range(10):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch._foreach_lerp_(ema, [p.detach() for p in model.parameters()], 0.1)
    torch.cuda.current_stream().wait_stream(side)   # the next step writes the weights again
print("ok", round(loss.item(), 4))
