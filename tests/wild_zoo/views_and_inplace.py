"""Views and in-place ops on shared storage: as_strided, unfold, index_put_ with accumulate,
scatter_add_, masked_fill_, narrow/copy_ between disjoint halves, resize_, set_ onto another
storage, a channels_last 3-D convolution with cudnn's autotuner, and non_blocking copies both
ways through pinned memory."""
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.backends.cudnn.benchmark = True
base = torch.zeros(1024, device="cuda")
win = base.as_strided((31, 64), (32, 1))          # overlapping windows
win[0].fill_(1.0)
u = base.unfold(0, 16, 8)
s1 = u.sum()
idx = torch.tensor([1, 5, 5, 9], device="cuda")
base.index_put_((idx,), torch.ones(4, device="cuda"), accumulate=True)
tgt = torch.zeros(10, device="cuda")
tgt.scatter_add_(0, torch.tensor([0, 1, 1, 2], device="cuda"), torch.ones(4, device="cuda"))
base.masked_fill_(base > 1.5, -1.0)
half_a, half_b = base.narrow(0, 0, 512), base.narrow(0, 512, 512)
half_b.copy_(half_a)
grow = torch.ones(8, device="cuda")
grow.resize_(64)
grow[8:].zero_()
other = torch.arange(16.0, device="cuda")
view = torch.empty(0, device="cuda")
view.set_(other.untyped_storage(), 0, (4, 4), (4, 1))
conv = nn.Conv3d(4, 8, 3, padding=1).cuda().to(memory_format=torch.channels_last_3d)
vol = torch.randn(2, 4, 8, 8, 8, device="cuda").to(memory_format=torch.channels_last_3d)
for _ in range(2):
    y = conv(vol)
    y.mean().backward()
host = torch.arange(4096.0).pin_memory()
dev = host.to("cuda", non_blocking=True)
dev.mul_(2)
back = torch.empty(4096).pin_memory()
back.copy_(dev, non_blocking=True)
torch.cuda.current_stream().synchronize()
vals = [s1, base.sum(), tgt.sum(), grow.sum(), view.sum(), y.sum(), conv.weight.grad.abs().sum(), back.sum()]
print("ZOO result", " ".join(f"{float(t):.6g}" for t in vals))
