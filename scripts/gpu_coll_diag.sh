#!/usr/bin/env bash
# The collective engine's open items on a two-GPU machine, from the repository root, in one call:
#   bash scripts/gpu_coll_diag.sh
# build; where the host time of a small all-reduce goes (scripts/diag_allreduce_cost.py); the
# mismatched-call tests of tests/test_collective.py on real NCCL, verbose; bench_allreduce's
# per-call figures. Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -3 "$out_dir/build.txt"
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
timeout 150 python3 scripts/diag_allreduce_cost.py > "$out_dir/diag.txt" 2>&1
echo "diag rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "^\[rank 0\] (#|every|matcher|\.\.\.)" "$out_dir/diag.txt"
[ -n "${IGNIS_SKIP_COLL:-}" ] || timeout 330 python3 -m pytest tests/test_collective.py -q -p no:cacheprovider --timeout=60 -rA \
    -k "${IGNIS_COLL_K:-test_gpu_}" > "$out_dir/coll.log" 2>&1
echo "collective rc=$? $(tail -1 "$out_dir/coll.log")  at $(( $(date +%s) - t0 )) s"
if [ -n "${IGNIS_BENCH_ALLREDUCE:-}" ]; then
    timeout 200 python3 benchmarks/bench_allreduce.py --min-mib 64 --max-mib 256 --trials 3 \
        > "$out_dir/bench_allreduce.txt" 2>&1
    echo "bench_allreduce rc=$?"; tail -4 "$out_dir/bench_allreduce.txt"
fi
echo "total: $(( $(date +%s) - t0 )) s"
