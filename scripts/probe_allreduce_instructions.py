"""N all-reduces of a 256-byte array through a communicator over the NCCL engine, whose NCCL API
is a stand-in that only takes the call (emulated backend, no call matcher): for counting the
host instructions that Ignis adds to one NCCL call (issue 32's per-call row), exactly:

    for n in 1000 3000; do IGNIS_BACKEND=emulated PYTHONPATH=src valgrind --tool=callgrind \\
        --callgrind-out-file=cg.$n '--toggle-collect=*Communicator_*all_reduce' \\
        python3 scripts/probe_allreduce_instructions.py $n [other]; done

The difference of the two totals over 2000 is one call's instructions. ``other``: the array lives
on another stream than the communicator's (its use is ordered by an event record and wait).
"""
import sys

import ignis as ig
from ignis.collective.communicator import Communicator, Health
from ignis.collective.nccl import NcclEngine


class Api:
    name, version = "stand-in", 22800

    def unique_id(self):
        return bytes(128)

    def init_rank(self, n, uid, rank):
        return ("comm", n, rank)

    def all_reduce(self, h, s, r, n, dt, op, st):
        pass

    def async_error(self, h):
        return None

    def abort(self, h):
        pass

    def destroy(self, h):
        pass


n = int(sys.argv[1])
other = len(sys.argv) > 2 and sys.argv[2] == "other"
dev = ig.Device(0)
health = Health(0)
stream = dev.create_stream()
api = Api()
engine = NcclEngine(api, 0, 2, dev, health, 60.0)
engine.init(api.unique_id(), stream)
comm = Communicator(engine, rank=0, world_size=2, device=dev, stream=stream, timeout=60.0, health=health)
a = ig.zeros(64, "float32", stream=dev.create_stream() if other else stream)
for _ in range(50):
    comm.all_reduce(a)
stream.synchronize()
for _ in range(n):
    comm.all_reduce(a)
stream.synchronize()
comm.close()
