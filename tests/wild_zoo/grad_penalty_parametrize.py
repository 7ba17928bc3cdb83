"""Double backward (a WGAN-GP gradient penalty through torch.autograd.grad with
create_graph=True), and parametrized weights: spectral norm (its power iteration updates
buffers in place) and weight norm."""
import torch
import torch.nn as nn
from torch.nn.utils import parametrizations as P

torch.manual_seed(0)
critic = nn.Sequential(P.spectral_norm(nn.Linear(16, 64)), nn.LeakyReLU(0.2),
                       P.weight_norm(nn.Linear(64, 1))).cuda()
opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
real = torch.randn(32, 16, device="cuda")
fake = torch.randn(32, 16, device="cuda")
for _ in range(3):
    eps = torch.rand(32, 1, device="cuda")
    mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(critic(mix).sum(), mix, create_graph=True)
    penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
    loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
    opt.zero_grad()
    loss.backward()
    opt.step()
critic.eval()
with torch.no_grad():
    score = critic(real).mean()
print("ZOO result", f"{loss.item():.6g}", f"{score.item():.6g}")
