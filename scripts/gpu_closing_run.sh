#!/usr/bin/env bash
# The closing GPU call of a session that changed the backends' direct paths, from the repository
# root, on two GPUs (carry .whl with a wheel of the final code, and .ab_old for the A/B):
# scripts/gpu_wrapup_run.sh (build, the wheel check, bench_hotpath in turns against .ab_old,
# bench_allreduce and bench_ddp), then this tree's backend and launch test files.
#   bash scripts/gpu_closing_run.sh            Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
bash scripts/gpu_wrapup_run.sh
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
for f in tests/test_cudriver.py tests/test_launch.py tests/test_cuda_backend.py tests/test_faults.py; do
    name=$(basename "$f" .py)
    timeout 200 python3 -m pytest "$f" -q -p no:cacheprovider > "$out_dir/$name.log" 2>&1
    echo "$name rc=$? $(tail -1 "$out_dir/$name.log")"
done
