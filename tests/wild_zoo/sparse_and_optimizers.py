"""Sparse embedding gradients with SparseAdam, an EmbeddingBag, and the other optimizer paths:
Adam with capturable state on the GPU (per-tensor, not foreach), AdamW fused with a GradScaler,
and RMSprop with foreach."""
import torch
import torch.nn as nn

torch.manual_seed(0)
emb = nn.Embedding(1000, 32, sparse=True).cuda()
bag = nn.EmbeddingBag(1000, 32, mode="mean").cuda()
head = nn.Linear(64, 1).cuda()
sparse_opt = torch.optim.SparseAdam(list(emb.parameters()), lr=1e-2)
dense_opt = torch.optim.Adam(list(bag.parameters()) + list(head.parameters()), lr=1e-2, capturable=True,
                             foreach=False)
idx = torch.randint(0, 1000, (16, 5), device="cuda")
y = torch.randn(16, 1, device="cuda")
for _ in range(3):
    feats = torch.cat([emb(idx).mean(1), bag(idx)], dim=1)
    loss = nn.functional.mse_loss(head(feats), y)
    sparse_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    sparse_opt.step()
    dense_opt.step()

net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).cuda()
fused = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
scaler = torch.amp.GradScaler()
rms_net = nn.Linear(32, 1).cuda()
rms = torch.optim.RMSprop(rms_net.parameters(), lr=1e-3, foreach=True)
x = torch.randn(64, 32, device="cuda")
t = torch.randn(64, 1, device="cuda")
for _ in range(3):
    with torch.autocast("cuda", dtype=torch.float16):
        l2 = nn.functional.mse_loss(net(x).float(), t)
    fused.zero_grad()
    scaler.scale(l2).backward()
    scaler.step(fused)
    scaler.update()
    l3 = nn.functional.mse_loss(rms_net(x), t)
    rms.zero_grad()
    l3.backward()
    rms.step()
print("ZOO result", f"{loss.item():.6g}", f"{l2.item():.6g}", f"{l3.item():.6g}")
