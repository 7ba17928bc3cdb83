#!/usr/bin/env bash
# The PyTorch front end's op observer on the GPU, in one call on a two-GPU machine (carry .whl):
# the build, the PyTorch test files (each in its own process, four at a time, the distributed
# ones on both GPUs), then bench_models in lockstep on GPU 0 with the checker thread off (the
# default) and on (IGNIS_OBSERVER_CHECKER=1) as contenders beside plain and CSAN, then issue 32's
# DDP step in lockstep (bench_ddp --lockstep), each with nothing else running.
#   bash scripts/gpu_checker_run.sh [MODEL_ROUNDS] [DDP_ROUNDS]
# NO_TESTS=1: the benchmarks only; NO_MODELS=1: no bench_models (scripts/gpu_backlog_run.sh).
# Brings back: build.txt, status.txt, logs.tgz, models_lockstep.txt, bench_ddp_lockstep.txt.
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src OUT_DIR="$out_dir"
nvidia-smi -L
# shellcheck source=scripts/gpu_run_one.sh
source scripts/gpu_run_one.sh
[ -n "${NO_TESTS:-}" ] || ls tests/test_torch_checker.py tests/test_torch_backlog.py tests/test_torch_distributed_gpu.py \
   tests/test_torch_graphs_gpu.py tests/test_torch_gpu.py tests/test_torch_wild_gpu.py tests/test_torch_guard.py \
   tests/test_torch_ops.py tests/test_torch_trace.py tests/test_sanitizer.py \
    | timeout 330 xargs -P 4 -I{} bash -c 'run_one {}' | sort | tee "$out_dir/status.txt"
touch "$out_dir/status.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
[ -n "${NO_TESTS:-}" ] || (cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./test_*.log)
if [ -z "${NO_MODELS:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/bench_models.py --lockstep --rounds "${1:-30}" --block 5 \
        --contenders "ignis --sanitize,ignis --sanitize IGNIS_OBSERVER_CHECKER=1,csan" 2>&1 \
        | grep -v '^\[transformers\]' | tee "$out_dir/models_lockstep.txt" | grep -vE "^round [0-9]+:" | tail -24
    echo "models: $(( $(date +%s) - t0 )) s"
fi
timeout 200 python3 benchmarks/bench_ddp.py --lockstep --rounds "${2:-20}" --block 5 2>&1 \
    | tee "$out_dir/bench_ddp_lockstep.txt" | grep -vE "^round [0-9]+:" | tail -12
echo "all: $(( $(date +%s) - t0 )) s"
! grep -qv "^0 " "$out_dir/status.txt"
