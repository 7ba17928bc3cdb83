#!/usr/bin/env bash
# bench_torch_sanitizer --quick, this tree against .ab_old's in turns (each process pinned to
# the same cores), three times over; from the repository root, one GPU:
#   bash scripts/gpu_sanitizer_ab.sh       (device call: carry .whl and .ab_old)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"
tail -1 "$out_dir/build.txt"; tail -1 "$out_dir/build_old.txt"
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi -L
for turn in new old new old new old; do
    src="$PWD/src"; [ "$turn" = old ] && src="$PWD/.ab_old/src"
    PYTHONPATH="$src" timeout 120 taskset -c 4-11 python3 benchmarks/bench_torch_sanitizer.py --quick \
        > "$out_dir/ts-$turn.txt" 2>&1
    echo "== $turn (rc $?)"; grep -E "µs/op|added per op|training step|slowdown|reports on" "$out_dir/ts-$turn.txt"
    cat "$out_dir/ts-$turn.txt" >> "$out_dir/ts-all.txt"
done
echo "all: $(( $(date +%s) - t0 )) s"
