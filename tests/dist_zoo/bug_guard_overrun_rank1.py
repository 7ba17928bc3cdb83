"""Bug on rank 1 only: a custom kernel writes 64 floats past the end of a 4 KiB tensor, while
both ranks train with DDP. The guard reports it on rank 1 with the tensor's allocation site."""
import os
import sys

import cupy
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "guard_zoo"))
from zoo_common import write_kernel  # noqa: E402

from dist_common import finish, setup  # noqa: E402

rank = setup()
model = DDP(nn.Linear(64, 64).cuda())
loss = model(torch.randn(8, 64, device="cuda")).sum()
loss.backward()
victim = torch.zeros(1024, device="cuda")  # SITE:victim
if rank == 1:
    write_kernel()((1,), (64,), (cupy.from_dlpack(victim), cupy.int64(1024), cupy.int32(64), cupy.float32(7.0)))
torch.cuda.synchronize()
del victim
finish(rank, loss.item())
