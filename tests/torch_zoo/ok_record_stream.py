"""Correct: the side stream waits for the producer (wait_stream), and the tensor it
reads is handed to the allocator with record_stream before it is dropped."""
import torch

side = torch.cuda.Stream()


def step(i):
    x = torch.full((1 << 20,), float(i), device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)
        y = x * 2
    x.record_stream(side)                          # the free waits for the side stream
    del x
    z = torch.zeros(1 << 20, device="cuda")        # may reuse x's block: safe now
    torch.cuda.current_stream().wait_stream(side)
    y.record_stream(torch.cuda.current_stream())
    return float((y + z).sum())


for i in range(5):
    assert step(i) == 2 * i * (1 << 20)
print("ok")
