#!/usr/bin/env bash
# The front end's per-op cost on the GPU (issues 32-34), in two calls that each fit a device
# command's limit, from the repository root (two GPUs for bench_ddp):
#   bash scripts/gpu_front_end_bench.sh a   (build; test_cuda_backend and test_torch_guard three
#                                            times over; bench_models, contenders in turns)
#   bash scripts/gpu_front_end_bench.sh b   (bench_graphs, bench_ddp, bench_torch_sanitizer)
# Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -1 "$out_dir/build.txt"
export PYTHONPATH=src
nvidia-smi -L
if [ "${1:-a}" = a ]; then
    for f in cuda_backend torch_guard torch_guard torch_guard; do
        (i=$RANDOM; IGNIS_BACKEND=cuda timeout -k 10 200 python3 -X faulthandler -m pytest "tests/test_$f.py" -q \
            -p no:cacheprovider --timeout=150 --timeout-method=thread > "$out_dir/test_$f-$i.log" 2>&1
         echo "$? test_$f $(grep -E '[0-9]+ (passed|failed)' "$out_dir/test_$f-$i.log" | tail -1)") &
    done
    wait
    echo "tests: $(( $(date +%s) - t0 )) s"
    timeout 420 python3 benchmarks/bench_models.py --rounds "${ROUNDS:-2}" > "$out_dir/bench_models.txt" 2>&1
    grep -v "^\[transformers\]" "$out_dir/bench_models.txt" | tail -22
else
    timeout 200 python3 benchmarks/bench_graphs.py --rounds "${ROUNDS:-2}" > "$out_dir/bench_graphs.txt" 2>&1
    tail -12 "$out_dir/bench_graphs.txt"
    timeout 240 python3 benchmarks/bench_ddp.py --rounds "${ROUNDS:-2}" > "$out_dir/bench_ddp.txt" 2>&1
    tail -12 "$out_dir/bench_ddp.txt"
    timeout 120 python3 benchmarks/bench_torch_sanitizer.py > "$out_dir/bench_torch_sanitizer.txt" 2>&1
    tail -14 "$out_dir/bench_torch_sanitizer.txt"
fi
echo "all: $(( $(date +%s) - t0 )) s"
