#!/usr/bin/env bash
# bench_hotpath --quick, this tree against .ab_old's (see gpu_coll_ab.sh) in turns, each process
# pinned to the same cores (taskset), N times over (default 3); from the repository root, one GPU:
#   bash scripts/gpu_hotpath_ab.sh [N]   (device call: carry .whl and .ab_old)
# HP_FIRST=old runs the old tree first in each turn (the order's own effect, if any, then
# falls on the other tree).
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1 IGNIS_BACKEND=cuda
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"
echo "build: $(( $(date +%s) - t0 )) s"
turns=""
pair="new old"; [ "${HP_FIRST:-new}" = old ] && pair="old new"
for _ in $(seq "${1:-3}"); do turns="$turns $pair"; done
for turn in $turns; do
    src="$PWD/src"; [ "$turn" = old ] && src="$PWD/.ab_old/src"
    PYTHONPATH="$src" timeout 100 taskset -c 4-7 python3 benchmarks/bench_hotpath.py --quick \
        > "$out_dir/hp.txt" 2>&1
    echo "== $turn (rc $?)"; grep -E "µs" "$out_dir/hp.txt"
done
echo "all: $(( $(date +%s) - t0 )) s"
