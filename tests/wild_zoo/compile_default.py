"""torch.compile in its default mode (Inductor's generated Triton kernels, no CUDA graphs): a small
attention model's training steps with AdamW, then a compiled inference function."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v))
        return x + self.ff(self.norm(x))


model = Net().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step_model = torch.compile(model)
x = torch.randn(8, 32, 64, device="cuda")
for _ in range(3):
    loss = step_model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


@torch.compile
def score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.softmax(a @ b.T / 8.0, dim=-1).sum(dim=0)


s = score(torch.randn(128, 64, device="cuda"), torch.randn(96, 64, device="cuda"))
print("ZOO result", f"{loss.item():.6g}", f"{s.sum().item():.6g}")
