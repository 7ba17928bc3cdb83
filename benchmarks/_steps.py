"""Shared by the training-step benchmarks: time a step the way each of them does."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def step_times_ms(step: Callable[[], None], steps: int, warm: int) -> list[float]:
    """The times of ``steps`` calls of ``step`` in ms, each followed by a device
    synchronization, after ``warm`` untimed ones."""
    import torch
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def median_step_ms(step: Callable[[], None], steps: int, warm: int) -> float:
    """The median of ``step_times_ms``."""
    return statistics.median(step_times_ms(step, steps, warm))
