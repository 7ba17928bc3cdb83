#!/usr/bin/env bash
# bench_models' steps plain and under `ignis run --sanitize`, this tree against .ab_old's (another
# tree, see gpu_coll_ab.sh) in turns, each a process of its own pinned to the same cores; from
# the repository root, one GPU:   bash scripts/gpu_sanitize_ab.sh [models] [turns]
#   (device call: carry .whl and .ab_old; SAN_FIRST=old runs the old tree first in each turn;
#   SAN_DIAG=1 also times the sanitizer's entry points inside the steps, scripts/diag_free_cost.py)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 IGNIS_BACKEND=cuda
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"
echo "build: $(( $(date +%s) - t0 )) s"
models="${1:-resnet}"; turns="${2:-2}"
step() {  # tree model contender -> ms/step
    local src="$PWD/src"; [ "$1" = old ] && src="$PWD/.ab_old/src"
    local cmd=(python3 benchmarks/bench_models.py --child "$2" --steps 20 --warm 5)
    [ "$3" = sanitize ] && cmd=(python3 -m ignis run --sanitize benchmarks/bench_models.py --child "$2" --steps 20 --warm 5)
    PYTHONPATH="$src" timeout 120 taskset -c 4-7 "${cmd[@]}" > "$out_dir/s.txt" 2>&1
    grep -o 'BENCH_STEP_MS [0-9.]*' "$out_dir/s.txt" | cut -d' ' -f2
    grep 'BENCH_GC' "$out_dir/s.txt" | sed "s/^/    [$1 $2 $3] /" >> "$out_dir/gc.txt"
}
order="new old"; [ "${SAN_FIRST:-new}" = old ] && order="old new"
if [ -n "${SAN_DIAG:-}" ]; then
    for m in $models; do
        for tree in $order $order; do
            src="$PWD/src"; [ "$tree" = old ] && src="$PWD/.ab_old/src"
            echo "== diag_free_cost $m $tree"
            PYTHONPATH="$src" timeout 150 taskset -c 4-7 python3 scripts/diag_free_cost.py "$m" 20 2>&1 \
                | grep -E "per step under|frees:|ops:"
        done
    done
fi
for m in $models; do
    for ((i = 0; i < turns; i++)); do
        for tree in $order; do
            echo "$m $tree: plain $(step $tree $m plain) ms, --sanitize $(step $tree $m sanitize) ms"
        done
    done
done
echo "the cyclic collector in the timed steps:"; cat "$out_dir/gc.txt"
echo "all: $(( $(date +%s) - t0 )) s"
