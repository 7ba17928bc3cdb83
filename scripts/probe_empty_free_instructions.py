"""``ig.empty`` + free pairs on the emulated backend, for an instruction count of the memory
layer's CPU path (the pool's allocate, the block, the array, the free). Run it under callgrind
twice, with N pairs and with none, and divide the difference of the totals by N: the count is
exact, so two trees compare without the host's noise (the emulated backend's calls are the same
in both):

    for n in 0 20000; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python scripts/probe_empty_free_instructions.py $n 2>&1 | grep "refs"; done
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
