#!/usr/bin/env bash
# The call matcher after a change: the collective tests on two GPUs, then the first collective
# calls after comm.barrier() (scripts/diag_allreduce_cost.py's first row, DIAG_COMM_BARRIER=2) as
# the matcher runs now, and woken only by its clock (DIAG_NOWAKE=1) for comparison. Two GPUs:
#   bash scripts/gpu_matcher_check.sh      (device call: carry .whl)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1 || echo "the compiled modules did not build"
export PYTHONPATH=src IGNIS_BACKEND=cuda
for turn in now clock now; do
    extra=""; [ "$turn" = clock ] && extra="DIAG_NOWAKE=1"
    env DIAG_QUICK=1 DIAG_COMM_BARRIER=2 $extra timeout 100 python3 scripts/diag_allreduce_cost.py \
        > "$out_dir/diag_$turn.txt" 2>&1
    echo "== $turn (rc $?)"; grep -E "raw|#" "$out_dir/diag_$turn.txt" | head -6
done
echo "diag: $(( $(date +%s) - t0 )) s"
timeout -k 10 330 python3 -X faulthandler -m pytest tests/test_collective.py -q -p no:cacheprovider --timeout=200 \
    --timeout-method=thread > "$out_dir/test_collective.log" 2>&1
echo "test_collective rc $?: $(grep -E '[0-9]+ (passed|failed)' "$out_dir/test_collective.log" | tail -1)"
echo "all: $(( $(date +%s) - t0 )) s"
