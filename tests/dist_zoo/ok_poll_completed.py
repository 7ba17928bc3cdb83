"""Correct: an asynchronous all_reduce polled with work.is_completed() until it answers True,
then its buffer read and overwritten on the compute stream without work.wait(). Once
is_completed() is True the reduction has finished on the device, so nothing queued after it can
race with it. (A second one, not polled, is waited for as usual.)"""
import time

import torch
import torch.distributed as dist

from dist_common import finish, setup

rank = setup()
t = torch.full((1 << 20,), float(rank + 1), device="cuda")
work = dist.all_reduce(t, async_op=True)
while not work.is_completed():
    time.sleep(0.0002)
total = t.sum()
t.mul_(0.5)
u = torch.full((1 << 16,), 1.0, device="cuda")
w2 = dist.all_reduce(u, async_op=True)
w2.wait()
finish(rank, (total + t.sum() + u.sum()).item())
