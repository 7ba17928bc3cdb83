#!/usr/bin/env bash
# The performance rows of the front ends and the collectives in one call, from the repository
# root, on two GPUs (device call: carry .whl and .ab_old):   bash scripts/gpu_perf_run.sh
# 1. this tree and .ab_old's (another tree, the one before a change) built side by side;
# 2. bench_stack_capture from each tree (CPU only: one capture of the program's stack);
# 3. bench_models (ResNet-18, GPT-2: plain, CSAN, --sanitize, --guard; one round), this tree;
# 4. bench_allreduce and bench_ddp (two GPUs), this tree.
# Brings back each benchmark's output under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export IGNIS_BACKEND=cuda
t0=$(date +%s)
nvidia-smi -L
bash scripts/gpu_build_ab.sh "$out_dir"
echo "build: $(( $(date +%s) - t0 )) s"
for tree in new old; do
    src="$PWD/src"; [ "$tree" = old ] && src="$PWD/.ab_old/src"
    [ -d "$src" ] || continue
    echo "== bench_stack_capture ($tree tree)"
    PYTHONPATH="$src" timeout 60 python3 benchmarks/bench_stack_capture.py 2>&1 | tail -10
done
export PYTHONPATH=src
echo "== bench_models"
timeout 240 python3 benchmarks/bench_models.py --rounds 1 --steps 15 > "$out_dir/bench_models.txt" 2>&1
echo "bench_models rc=$?"; tail -14 "$out_dir/bench_models.txt"
bash scripts/gpu_dist_bench.sh "$out_dir"
echo "all: $(( $(date +%s) - t0 )) s"
