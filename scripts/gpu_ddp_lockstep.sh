#!/usr/bin/env bash
# Issue 32's DDP step in lockstep on two GPUs: `benchmarks/bench_ddp.py --lockstep`, TIMES times
# (each time a fresh set of process groups: the spread between process states shows), ROUNDS
# rounds of blocks of BLOCK steps. Brings back each time's output and build.txt (under ${OUT:-out}).
#   bash scripts/gpu_ddp_lockstep.sh [ROUNDS] [BLOCK] [TIMES]
set -uo pipefail
rounds="${1:-30}"; block="${2:-5}"; times="${3:-2}"
out_dir="${OUT:-out}"; mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=src
nvidia-smi -L
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1 || { echo "build failed"; tail -5 "$out_dir/build.txt"; exit 1; }
for t in $(seq "$times"); do
    echo "== bench_ddp --lockstep, time $t"
    timeout 400 python3 benchmarks/bench_ddp.py --lockstep --rounds "$rounds" --block "$block" 2>&1 \
        | tee "$out_dir/bench_ddp_lockstep_$t.txt" | grep -vE "^round [0-9]+:" | tail -12
done
