"""Waiting without synchronize(): a non_blocking copy to pinned memory polled with
Event.query() until done, then read on the host; a side stream polled with Stream.query();
an Event's wait on another stream; work ordered by Event.synchronize()."""
import torch

torch.manual_seed(0)
dev = torch.randn(1 << 16, device="cuda")
host = torch.empty(1 << 16, pin_memory=True)
done = torch.cuda.Event()
for _ in range(3):
    dev.mul_(1.5)
    host.copy_(dev, non_blocking=True)
    done.record()
    while not done.query():   # the host polls until the copy is done
        pass
    first = host[:1024].sum().item()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    other = dev * 2
while not side.query():
    pass
host.copy_(other)              # (a synchronous copy: side's work is done, the host saw it)
ev = torch.cuda.Event()
with torch.cuda.stream(side):
    other.add_(1)
    ev.record()
torch.cuda.current_stream().wait_event(ev)
total = other.sum()
ev.synchronize()
print("ZOO result", f"{first:.6g}", f"{host.sum().item():.6g}", f"{total.item():.6g}")
