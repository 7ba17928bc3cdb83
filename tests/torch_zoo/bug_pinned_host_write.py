"""Bug: the host refills a pinned staging buffer while the non_blocking copy of the
previous batch may still be reading it (a data loader's classic mistake)."""
import torch

staging = torch.empty(1 << 20, pin_memory=True)
batches = []
for i in range(3):
    staging.fill_(float(i))                                   # host write into pinned memory
    torch.cuda._sleep(20_000_000)                             # the stream is busy: the copy starts late
    batches.append(staging.to("cuda", non_blocking=True))     # async copy reads the buffer later
torch.cuda.synchronize()
print("batch means", [float(b.mean()) for b in batches])
