"""Device-agnostic code (torch.accelerator, torch.Event, torch.Stream): a non_blocking copy to
pinned memory polled with the generic Event.query() until done, then read on the host; a
generic side stream polled with Stream.query(), its result then used on the current stream."""
import torch

torch.manual_seed(0)
dev = torch.randn(1 << 16, device="cuda")
host = torch.empty(1 << 16, pin_memory=True)
done = torch.Event(device="cuda")
for _ in range(3):
    dev.mul_(1.5)
    host.copy_(dev, non_blocking=True)
    done.record(torch.accelerator.current_stream())
    while not done.query():   # the host polls until the copy is done
        pass
    first = host[:1024].sum().item()
side = torch.Stream(device="cuda")
side.wait_stream(torch.accelerator.current_stream())
with torch.cuda.stream(side):
    other = dev * 2
while not side.query():       # the host polls until the side stream's work is done
    pass
total = (other + dev).sum()   # the current stream reads side's result: the host saw it finish
print("ZOO result", f"{first:.6g}", f"{total.item():.6g}")
