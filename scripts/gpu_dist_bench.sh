#!/usr/bin/env bash
# The two-GPU benchmarks of the distributed work, from the repository root, this tree built:
#   bash scripts/gpu_dist_bench.sh OUT_DIR
# bench_allreduce (64-256 MiB and its per-call row), then bench_ddp (ROUNDS rounds, default 2).
set -uo pipefail
out_dir="$1"
timeout 150 python3 benchmarks/bench_allreduce.py --min-mib 64 --max-mib 256 --trials 3 \
    > "$out_dir/bench_allreduce.txt" 2>&1
echo "bench_allreduce rc=$?"; tail -6 "$out_dir/bench_allreduce.txt"
timeout 240 python3 benchmarks/bench_ddp.py --rounds "${ROUNDS:-2}" > "$out_dir/bench_ddp.txt" 2>&1
echo "bench_ddp rc=$?"; tail -9 "$out_dir/bench_ddp.txt"
