#!/usr/bin/env python3
"""A 2-rank all-reduce (and an all-gather) with ownership enforced.

Each rank fills a gradient with its own values, all-reduces it in place
(sum) and checks the result exactly; then all-gathers a small array. On a
GPU machine the engine is NCCL (one process per GPU); on the emulated backend
the same API runs between the processes over loopback TCP. While an
operation is being ordered its arrays belong to the ``"collective"`` owner:
inside ``with comm.group():`` a ``free()`` from your code is refused.

Run it with the launcher, from the repository root (it starts 2 processes with
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, as
``torchrun`` does, and prefixes their output with ``[rank R]``)::

    .venv/bin/ignis launch -n 2 examples/allreduce_two_ranks.py

Each rank prints its result and ``rank R: all-reduce OK``; the launcher
exits 0 when both ranks did. Started without the launcher, the script is a
group of one (the all-reduce is then a copy).
"""

from __future__ import annotations

import sys

import numpy as np

import ignis as ig

N = 1 << 16


def main() -> int:
    comm = ig.collective.init_process_group()     # reads RANK, WORLD_SIZE, ... (ignis launch sets them)
    r, world = comm.rank, comm.world_size
    print(f"rank {r} of {world}: device {comm.device.ordinal} ({comm.device.name}), engine {comm.backend}")
    ok = True
    try:
        # No device=: init_process_group made this rank's device (LOCAL_RANK) the current one.
        grad = ig.from_numpy(np.full(N, r + 1, dtype=np.float32), tag="grad")
        assert grad.device is comm.device
        comm.all_reduce(grad, op="sum")          # in place, on comm.stream; returns once ordered
        got = grad.to_numpy()                     # waits for the all-reduce on the device
        want = float(sum(range(1, world + 1)))
        ok &= bool(np.all(got == want))
        print(f"rank {r}: all_reduce(sum) of {N} float32 -> every element {got[0]:g} (expected {want:g}); "
              f"owner back to {grad.owner!r}")

        mine = ig.from_numpy(np.array([r * 10, r * 10 + 1], dtype=np.int32))
        everyone = comm.all_gather(mine)          # a new array of shape (world, 2)
        gathered = everyone.to_numpy().tolist()
        ok &= gathered == [[q * 10, q * 10 + 1] for q in range(world)]
        print(f"rank {r}: all_gather -> {gathered}")

        with comm.group():                        # the arrays stay acquired until the group is issued
            comm.all_reduce(grad)
            try:
                grad.free()
                ok = False
                print(f"rank {r}: grad was freed while the collective layer held it")
            except ig.MemoryContractViolation as e:
                print(f"rank {r}: free() inside the group refused: {str(e).splitlines()[0]}")
        comm.synchronize()
        for a in (grad, mine, everyone):
            a.free()
    finally:
        ig.collective.destroy_process_group()
    print(f"rank {r}: all-reduce {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
