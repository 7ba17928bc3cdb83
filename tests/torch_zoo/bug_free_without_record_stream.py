"""Bug: a tensor is dropped while another stream still reads it, without record_stream.
The caching allocator hands its block to the next tensor at once, whose write lands
under the pending read: the plain run prints a wrong sum. CSAN is silent (it forgets a
tensor when it is freed)."""
import torch

side = torch.cuda.Stream()


def step():
    x = torch.ones(1 << 22, device="cuda")        # allocated on the default stream
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)              # the side stream is busy for a while...
        y = x * 2                                  # ...then reads x
    del x                                          # freed on the default stream: no record_stream(side)
    z = torch.zeros(1 << 22, device="cuda")        # reuses x's block, written before the read ran
    torch.cuda.current_stream().wait_stream(side)
    return y, z


y, z = step()
print("sum", float(y.sum()), "expected", 2 * y.numel())
