#!/usr/bin/env bash
# A session's closing GPU call on two GPUs, from the repository root (carry .whl, with a wheel of
# the final code in .whl/ignis/): build; the wheel check beside bench_hotpath; the small
# all-reduce's host time after torch.distributed's barrier and after comm.barrier() (the
# diagnostic's first row, DIAG_QUICK); bench_ddp. Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1
t0=$(date +%s)
nvidia-smi -L | head -2
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; echo "build: $(( $(date +%s) - t0 )) s"
if ls .whl/ignis/*.whl >/dev/null 2>&1; then
    (OUT="$out_dir" timeout 300 bash scripts/gpu_wheel_check.sh .whl/ignis > "$out_dir/wheel_check.txt" 2>&1
     echo "wheel check rc=$?") &
fi
export PYTHONPATH=src IGNIS_BACKEND=cuda
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/bench_hotpath.py > "$out_dir/bench_hotpath.txt" 2>&1
echo "bench_hotpath rc=$?"; tail -25 "$out_dir/bench_hotpath.txt"
wait
grep -E "FAILED|passed|driver functions|two-stream" "$out_dir/gpu_wheel_check.log" "$out_dir/wheel_check.txt" 2>/dev/null | head -8
for b in "" 1; do
    DIAG_QUICK=1 DIAG_COMM_BARRIER=$b timeout 90 python3 scripts/diag_allreduce_cost.py > "$out_dir/diag_cb$b.txt" 2>&1
    echo "== diag, comm.barrier ${b:-0} (rc $?)"; grep -E "^(\[rank 0\] )?(everything|  \()" "$out_dir/diag_cb$b.txt"
done
timeout 200 python3 benchmarks/bench_ddp.py --rounds "${ROUNDS:-2}" > "$out_dir/bench_ddp.txt" 2>&1
echo "bench_ddp rc=$?"; tail -9 "$out_dir/bench_ddp.txt"
echo "all: $(( $(date +%s) - t0 )) s"
