#!/usr/bin/env bash
# The op observer's backlog on the GPU, in one call on a two-GPU machine (carry .whl): the build,
# then the PyTorch test files (each in its own process, four at a time, the distributed ones on
# both GPUs), then issue 32's DDP step in lockstep (bench_ddp --lockstep), with nothing else running.
#   bash scripts/gpu_backlog_run.sh [DDP_ROUNDS] [DDP_BLOCK]
# Brings back: build.txt, status.txt, logs.tgz, bench_ddp_lockstep.txt (under ${OUT:-out}).
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=src OUT_DIR="$out_dir"
nvidia-smi -L
# shellcheck source=scripts/gpu_run_one.sh
source scripts/gpu_run_one.sh
ls tests/test_torch_distributed_gpu.py tests/test_torch_graphs_gpu.py tests/test_torch_gpu.py tests/test_torch_wild_gpu.py \
   tests/test_torch_guard.py tests/test_torch_ops.py tests/test_torch_backlog.py tests/test_torch_trace.py \
   tests/test_sanitizer.py \
    | timeout 330 xargs -P 4 -I{} bash -c 'run_one {}' | sort | tee "$out_dir/status.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
(cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./test_*.log)
timeout 240 python3 benchmarks/bench_ddp.py --lockstep --rounds "${1:-20}" --block "${2:-5}" 2>&1 \
    | tee "$out_dir/bench_ddp_lockstep.txt" | grep -vE "^round [0-9]+:" | tail -12
echo "all: $(( $(date +%s) - t0 )) s"
! grep -qv "^0 " "$out_dir/status.txt"
