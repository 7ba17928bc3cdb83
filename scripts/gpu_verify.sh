#!/usr/bin/env bash
# The front ends' GPU checks in one call, from the repository root (two GPUs for the distributed zoo):
#   bash scripts/gpu_verify.sh [bench]
# build; in parallel: the distributed zoo, the graph zoo, and the PyTorch/CuPy test files
# (test_torch_gpu, test_torch_guard, test_cupy_guard, test_run); then with "bench", bench_graphs.py.
# Logs under ${OUT:-out}: build.txt, <file>.log, dist_zoo.log, graph_zoo.log, bench_graphs.txt.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -1 "$out_dir/build.txt"
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
one() {  # one test file, its log, its status line
    f="$1"; shift
    name=$(basename "$f" .py)
    env "$@" timeout 420 python3 -X faulthandler -m pytest "$f" -q -p no:cacheprovider --timeout=400 \
        > "$out_dir/$name.log" 2>&1
    echo "$name rc=$? $(tail -1 "$out_dir/$name.log")"
}
one tests/test_torch_distributed_gpu.py IGNIS_ZOO_LOG="$out_dir/dist_zoo.log" &
one tests/test_torch_graphs_gpu.py IGNIS_ZOO_LOG="$out_dir/graph_zoo.log" &
for f in ${IGNIS_VERIFY_FILES:-tests/test_torch_gpu.py tests/test_torch_guard.py tests/test_cupy_guard.py tests/test_run.py}; do
    one "$f" IGNIS_ZOO_LOG="$out_dir/torch_zoo.log" &
done
wait
echo "tests: $(( $(date +%s) - t0 )) s"
grep -h -E "^(FAILED|ERROR)" "$out_dir"/*.log | head -30
if [ "${1:-}" = "bench" ]; then
    timeout 300 python3 benchmarks/bench_graphs.py --rounds 2 > "$out_dir/bench_graphs.txt" 2>&1
    echo "bench_graphs rc=$?"; tail -12 "$out_dir/bench_graphs.txt"
fi
echo "total: $(( $(date +%s) - t0 )) s"
