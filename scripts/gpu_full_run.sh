#!/usr/bin/env bash
# The whole GPU check in one call, from the repository root (a two-GPU machine for the
# distributed tests): the wheel check (a wheel built elsewhere, in .whl/ignis/) beside every
# test file in its own process (scripts/gpu_run_files.sh -P 8).
#   bash scripts/gpu_full_run.sh
# Brings back: gpu_wheel_check.log, build.txt, status.txt, logs.tgz (under ${OUT:-out}).
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi -L
if ls .whl/ignis/*.whl >/dev/null 2>&1; then
    (timeout 400 bash scripts/gpu_wheel_check.sh .whl/ignis > /dev/null 2>&1
     echo "wheel check rc=$? at $(( $(date +%s) - t0 )) s") &
fi
timeout 560 bash scripts/gpu_run_files.sh -P 8
echo "test files rc=$? at $(( $(date +%s) - t0 )) s"
wait
grep -E "FAILED|OK|driver functions|two-stream" "$out_dir/gpu_wheel_check.log" 2>/dev/null | head -12
