#!/usr/bin/env bash
# Whether the call matcher's reaction to each peer message slows the first collective calls after
# comm.barrier() (bench_allreduce's per-call row): scripts/diag_allreduce_cost.py's first row,
# each batch started at once after comm.barrier() (DIAG_COMM_BARRIER=2), with the matcher woken by
# news as always and with it woken only by its clock (DIAG_NOWAKE=1), in turns. Two GPUs:
#   bash scripts/gpu_matcher_diag.sh
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1 || echo "the compiled modules did not build"
export PYTHONPATH=src IGNIS_BACKEND=cuda
for turn in woken clock woken clock; do
    extra=""; [ "$turn" = clock ] && extra="DIAG_NOWAKE=1"
    env DIAG_QUICK=1 DIAG_COMM_BARRIER=2 $extra timeout 100 python3 scripts/diag_allreduce_cost.py \
        > "$out_dir/diag_$turn.txt" 2>&1
    echo "== $turn (rc $?)"; grep -E "raw|#" "$out_dir/diag_$turn.txt" | head -6
done
