"""What training scripts call around their steps: the memory statistics and their peak reset,
the memory summary, empty_cache, mem_get_info, CUDA events timing a step, NVTX ranges, and
a non_blocking copy to the host read after its event."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
x = torch.randn(64, 256, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
host = torch.empty(10, pin_memory=True)
torch.cuda.reset_peak_memory_stats()
for i in range(4):
    torch.cuda.nvtx.range_push(f"step {i}")
    start.record()
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    end.record()
    torch.cuda.nvtx.range_pop()
    host.copy_(model[2].bias.detach(), non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    bias_sum = float(host.sum())
    end.synchronize()
    ms = start.elapsed_time(end)
stats = (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved())
assert all(v >= 0 for v in stats) and ms >= 0, (stats, ms)
assert isinstance(torch.cuda.memory_summary(), str)
torch.cuda.empty_cache()
free, total = torch.cuda.mem_get_info()
assert 0 < free <= total
print("ZOO result", f"{loss.item():.6g}", f"{bias_sum:.6g}")
