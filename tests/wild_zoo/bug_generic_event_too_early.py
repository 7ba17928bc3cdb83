"""Bug: the generic Event polled was recorded before the non_blocking copy it should cover, so
the host reads the pinned buffer while the copy may still be writing it."""
import torch

dev = torch.randn(1 << 20, device="cuda")
host = torch.empty(1 << 20, pin_memory=True)
done = torch.Event(device="cuda")
done.record(torch.accelerator.current_stream())   # too early: before the copy
host.copy_(dev, non_blocking=True)
while not done.query():
    pass
total = host.sum()            # reads the pinned buffer while the copy may still run
torch.cuda.synchronize()
print("ZOO result", f"{total.item():.6g}")
