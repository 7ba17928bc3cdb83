#!/usr/bin/env bash
# A session's closing GPU call on two GPUs, from the repository root (carry .whl, with a wheel of
# the final code in .whl/ignis/; .ab_old/ for an A/B, see gpu_coll_ab.sh): build; the wheel check
# beside bench_hotpath --quick (this tree and .ab_old's in turns); bench_allreduce
# (64-256 MiB and the per-call row); bench_ddp. Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1
t0=$(date +%s)
nvidia-smi -L | head -2
bash scripts/gpu_build_ab.sh "$out_dir"
echo "build: $(( $(date +%s) - t0 )) s"
if ls .whl/ignis/*.whl >/dev/null 2>&1; then
    (OUT="$out_dir" timeout 300 bash scripts/gpu_wheel_check.sh .whl/ignis > "$out_dir/wheel_check.txt" 2>&1
     echo "wheel check rc=$?") &
fi
export PYTHONPATH=src IGNIS_BACKEND=cuda
for turn in new old new old; do  # --quick, the two trees in turns (new only without .ab_old)
    [ "$turn" = old ] && [ ! -d .ab_old/src ] && continue
    src="$PWD/src"; [ "$turn" = old ] && src="$PWD/.ab_old/src"
    CUDA_VISIBLE_DEVICES=1 PYTHONPATH="$src" timeout 100 python3 benchmarks/bench_hotpath.py --quick \
        > "$out_dir/bench_hotpath_$turn.txt" 2>&1
    echo "== bench_hotpath, $turn tree (rc $?)"; tail -14 "$out_dir/bench_hotpath_$turn.txt"
    cat "$out_dir/bench_hotpath_$turn.txt" >> "$out_dir/bench_hotpath_all.txt"
done
wait
grep -E "FAILED|passed|driver functions|two-stream" "$out_dir/gpu_wheel_check.log" "$out_dir/wheel_check.txt" 2>/dev/null | head -8
bash scripts/gpu_dist_bench.sh "$out_dir"
echo "all: $(( $(date +%s) - t0 )) s"
