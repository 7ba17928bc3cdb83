"""Shared by the distributed zoo programs: one process per GPU, NCCL, a fixed seed."""
import os

import torch
import torch.distributed as dist


def setup() -> int:
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    torch.manual_seed(0)
    return rank


def finish(rank: int, loss: float) -> None:
    print(f"ZOO rank {rank} loss {loss:.6f}")
    dist.barrier()
    dist.destroy_process_group()
