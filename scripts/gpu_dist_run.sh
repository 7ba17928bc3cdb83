#!/usr/bin/env bash
# The distributed work on a two-GPU machine, from the repository root, in one call:
#   bash scripts/gpu_dist_run.sh [quick]
# build; the graph/Triton probe; the distributed zoo under torchrun (tests/test_torch_distributed_gpu.py);
# the GPU test files given in $IGNIS_DIST_FILES (each in its own process); the DDP step benchmark.
# Logs under ${OUT:-out}: build.txt, probe.txt, zoo.log, dist.log, files.txt, bench_ddp.txt.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -3 "$out_dir/build.txt"
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
(timeout 120 python3 scripts/probe_graphs_triton.py > "$out_dir/probe.txt" 2>&1; echo "probe rc=$?") &
IGNIS_ZOO_LOG="$out_dir/zoo.log" timeout 420 python3 -m pytest tests/test_torch_distributed_gpu.py -q -p no:cacheprovider \
    -x --timeout=400 > "$out_dir/dist.log" 2>&1
echo "dist zoo rc=$? $(tail -1 "$out_dir/dist.log")  at $(( $(date +%s) - t0 )) s"
wait
for f in ${IGNIS_DIST_FILES:-}; do
    timeout 200 python3 -m pytest "$f" -q -p no:cacheprovider --timeout=150 > "$out_dir/$(basename "$f" .py).log" 2>&1
    echo "$f rc=$? $(tail -1 "$out_dir/$(basename "$f" .py).log")" | tee -a "$out_dir/files.txt"
done
if [ "${1:-}" != "quick" ]; then
    timeout 300 python3 benchmarks/bench_ddp.py --rounds "${IGNIS_BENCH_ROUNDS:-1}" ${IGNIS_BENCH_FLAGS:-} \
        > "$out_dir/bench_ddp.txt" 2>&1
    echo "bench_ddp rc=$?"; tail -8 "$out_dir/bench_ddp.txt"
fi
echo "total: $(( $(date +%s) - t0 )) s"
