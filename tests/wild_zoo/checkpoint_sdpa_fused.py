"""A transformer block with scaled_dot_product_attention (the fused attention kernels) under
activation checkpointing (non-reentrant), bf16 autocast, gradient clipping and the fused Adam."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d: int = 128, h: int = 4) -> None:
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


torch.manual_seed(0)
blocks = nn.ModuleList(Block() for _ in range(3)).cuda()
opt = torch.optim.Adam(blocks.parameters(), lr=1e-3, fused=True)
x = torch.randn(4, 64, 128, device="cuda")
for _ in range(4):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = x
        for blk in blocks:
            h = checkpoint(blk, h, use_reentrant=False)
        loss = h.float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(blocks.parameters(), 1.0)
    opt.step()
print("ZOO result", f"{loss.item():.6g}")
