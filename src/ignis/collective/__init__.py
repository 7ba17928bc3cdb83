"""Collectives (layer 5): NCCL communicators with enforced ownership.

::

    import ignis as ig
    comm = ig.collective.init_process_group()      # RANK, WORLD_SIZE, ... (ignis launch -n 2 train.py)
    g = ig.zeros(1 << 20, "float32", device=comm.device)
    comm.all_reduce(g)                             # in place, on comm.stream; returns at once
    g.to_numpy()                                   # waits for the all-reduce on the device, not the host

Each operation acquires its arrays for the ``"collective"`` owner and
releases them once its work is ordered on the communicator's stream (see
``communicator``). On the cuda backend the engine is NCCL (nccl4py, CuPy's
bindings, or libnccl through ctypes); on the emulated backend the same API
runs between processes over loopback TCP, so the logic, the ownership rules
and the bootstrap are tested without GPUs. A rank that dies, closes, hangs or
calls another operation (or the same one with another root) makes the others
raise ``CollectiveError`` (naming it and the operation) instead of hanging.
An operation returns once it is queued; if it fails later, every array it was
to write is poisoned: each later access to it (host copy, clone, kernel,
``use()``, DLPack export, the next collective) raises ``CollectiveError``
naming the operation, the ranks and the cause, instead of handing back stale
bytes. Nothing else is: the device, its streams and other arrays go on.
"""

from __future__ import annotations

from .communicator import Communicator
from .errors import CollectiveError, CollectiveTimeoutError
from .launch import launch
from .ops import ReduceOp
from .process_group import (DEFAULT_TIMEOUT, GroupEnv, destroy_process_group, get_communicator,
                            init_process_group, is_initialized, read_env)

__all__ = ["Communicator", "ReduceOp", "CollectiveError", "CollectiveTimeoutError", "init_process_group",
           "get_communicator", "destroy_process_group", "is_initialized", "read_env", "GroupEnv", "launch",
           "DEFAULT_TIMEOUT"]
