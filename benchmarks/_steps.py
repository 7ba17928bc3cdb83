"""Shared by the training-step benchmarks: time a step the way each of them does."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


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


def lockstep_rounds(names: Sequence[str], rounds: int, block: int,
                    run_block: Callable[[str, int], list[float]],
                    on_round: Callable[[int, dict], None] | None = None) -> tuple[dict, dict]:
    """The lockstep benchmarks' turns: ``rounds`` rounds in which every contender of ``names``
    (``"plain"`` among them) runs a block of ``block`` timed steps (CSAN a quarter of it, at
    least one), ``run_block(name, n)`` returning their times in ms, the order reversed every
    other round. Returns each contender's step times, and its per-round ratios of the block's
    median to plain's; ``on_round(r, medians)`` hears each round's medians."""
    times: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        med = {}
        for n in (names if r % 2 == 0 else list(names)[::-1]):
            got = run_block(n, block if n != "csan" else max(1, block // 4))
            times[n] += got
            med[n] = statistics.median(got)
        for n in names:
            ratios[n].append(med[n] / med["plain"])
        if on_round is not None:
            on_round(r, med)
    return times, ratios


def stop_contenders(procs: dict, errs: dict) -> None:
    """A lockstep benchmark's end, however it came: kill the contenders' processes still running
    and close their error files."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for f in errs.values():
        f.close()
