#!/usr/bin/env bash
# The two-GPU checks that fit one short device call, from the repository root (two GPUs): the
# build; bench_allreduce at 64 MiB with its per-call row; the distributed zoo and the collective
# tests, each file in its own process; then bench_ddp (one round) while time is left.
#   bash scripts/gpu_dist_quick.sh      (device call: carry .whl)
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export PYTHONPATH=src NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
timeout 120 python3 benchmarks/bench_allreduce.py --min-mib 64 --max-mib 64 --trials 3 > "$out_dir/bench_allreduce.txt" 2>&1
echo "bench_allreduce rc=$?"; tail -5 "$out_dir/bench_allreduce.txt"
echo "at $(( $(date +%s) - t0 )) s"
run_one() {
    timeout -k 10 "${QUICK_FILE_TIMEOUT:-260}" python3 -X faulthandler -m pytest "tests/$1.py" -q -p no:cacheprovider \
        --timeout=200 --timeout-method=thread > "$OUT_DIR/$1.log" 2>&1
    echo "$? $1 $(grep -E '[0-9]+ (passed|failed)' "$OUT_DIR/$1.log" | tail -1)"
}
export -f run_one
export OUT_DIR="$out_dir"
printf '%s\n' test_torch_distributed_gpu test_collective | xargs -P 2 -I{} bash -c 'run_one {}' | sort | tee "$out_dir/status.txt"
echo "tests at $(( $(date +%s) - t0 )) s"
left=$(( ${QUICK_BUDGET:-540} - ($(date +%s) - t0) ))
if [ "$left" -gt 100 ]; then
    timeout $(( left - 10 )) python3 benchmarks/bench_ddp.py --rounds 1 > "$out_dir/bench_ddp.txt" 2>&1
    echo "bench_ddp rc=$?"; tail -9 "$out_dir/bench_ddp.txt"
fi
(cd "$out_dir" && tar czf logs.tgz ./*.log 2>/dev/null && rm -f ./test_*.log)
echo "all: $(( $(date +%s) - t0 )) s"
