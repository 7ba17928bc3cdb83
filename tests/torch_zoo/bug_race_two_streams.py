"""Bug: a side stream reads a tensor the default stream is still writing (no wait_stream).
CSAN flags it, Compute Sanitizer does not; the sum it prints may be wrong."""
import torch

side = torch.cuda.Stream()
x = torch.zeros(1 << 22, device="cuda")
torch.cuda.synchronize()

torch.cuda._sleep(20_000_000)        # keep the default stream busy (an unchecked raw kernel)
x.fill_(1.0)                         # written on the default stream
with torch.cuda.stream(side):
    total = x.sum()                  # read on the side stream: not ordered after the fill
torch.cuda.synchronize()
print("sum", float(total), "expected", x.numel())
