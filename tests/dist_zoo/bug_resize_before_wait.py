"""Bug: an asynchronous all_reduce, then its tensor's storage resized to nothing (the way
FSDP frees memory) before work.wait(). The Work keeps the tensor, not its memory: the
memory goes back to the allocator while NCCL still reads and writes it, and the next
tensor of that size may get it at once."""
import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
t = torch.full((1 << 20,), float(rank + 1), device="cuda")
base = t.data_ptr()
work = dist.all_reduce(t, async_op=True)
t.untyped_storage().resize_(0)
fresh = torch.ones(1 << 20, device="cuda")
print(f"ZOO rank {rank} freed memory handed out again at once: {fresh.data_ptr() == base}")
work.wait()
finish(rank, fresh.sum().item())
