"""``ig.empty`` + free pairs on the emulated backend, for an instruction count of the memory
layer's CPU path (the pool's allocate, the block, the array, the free). Run it under callgrind
twice, with N pairs and with none, and divide the difference of the main thread's totals by N.
Count the main thread alone: the emulated backend's worker threads poll, so their counts vary
from run to run, while the main thread's are the same in every run (with a fixed hash seed),
so two trees compare without the host's noise:

    for n in 0 20000; do IGNIS_BACKEND=emulated PYTHONHASHSEED=0 valgrind --tool=callgrind \
        --separate-threads=yes --callgrind-out-file=cg.out \
        python scripts/probe_empty_free_instructions.py $n; grep summary cg.out-01; done
"""

from __future__ import annotations

import sys

import ignis as ig

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
empty = ig.empty
for _ in range(200):  # warm: the pool's segment, the caches
    empty(16384, dtype="float32").free()
for _ in range(n):
    empty(16384, dtype="float32").free()
