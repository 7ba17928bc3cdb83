"""Correct: communication overlapped with compute by hand. Each chunk's all-reduce is issued
on a communication stream after it waits for the compute stream's event; the compute stream
waits for the collective's Work before it reads the result; the next chunk computes meanwhile.
Also a broadcast from rank 0, all_gather_into_tensor and reduce_scatter_tensor with wait()."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
comm = torch.cuda.Stream()
chunks = [torch.full((1 << 16,), float(rank + i), device="cuda") for i in range(4)]
pending = []
for c in chunks:
    c.mul_(2.0)                                   # compute writes the chunk
    ready = torch.cuda.current_stream().record_event()
    with torch.cuda.stream(comm):
        comm.wait_event(ready)
        pending.append((c, dist.all_reduce(c, async_op=True)))
total = torch.zeros((), device="cuda")
for c, work in pending:
    work.wait()                                   # the current stream waits for the collective
    total += c.sum()
src = torch.arange(1024, device="cuda", dtype=torch.float32) if rank == 0 else torch.empty(1024, device="cuda")
dist.broadcast(src, src=0)
whole = torch.empty(2 * 1024, device="cuda")
dist.all_gather_into_tensor(whole, src)
part = torch.empty(512, device="cuda")
work = dist.reduce_scatter_tensor(part, whole[:1024].clone(), async_op=True)
work.wait()
total += whole.sum() + part.sum()
finish(rank, total.item())
