#!/usr/bin/env bash
# Compare the hot path of this tree with another tree's on the GPU machine, contenders in
# turns in one job on the same card:   bash scripts/gpu_compare.sh OLD_DIR [turns] [bench...]
# OLD_DIR holds the other tree (for example `git archive REV | tar -x -C OLD_DIR`, carried as
# an untracked folder). Each tree is built in place; each bench runs `--quick`, this tree
# first, then OLD_DIR, `turns` times (default 2). Writes <tree>_<bench>_<turn>.txt into ${OUT:-out}.
# BENCH_ARGS adds arguments to every bench (e.g. BENCH_ARGS=--breakdown for bench_torch_sanitizer).
set -uo pipefail
old="$1"; turns="${2:-2}"; shift; [ $# -gt 0 ] && shift
benches=("$@"); [ ${#benches[@]} -eq 0 ] && benches=(alloc array)
export IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
out_dir="$(realpath -m "${OUT:-out}")"
mkdir -p "$out_dir"
new="$(pwd)"
for tree in "$new" "$old"; do
    (cd "$tree" && bash "$new/scripts/gpu_build.sh" > "$out_dir/build_$(basename "$tree").txt" 2>&1) \
        || { echo "build failed in $tree"; exit 1; }
done
nvidia-smi -L || true
for turn in $(seq 1 "$turns"); do
    for tree in "$new" "$old"; do
        label=$([ "$tree" = "$new" ] && echo new || echo old)
        for b in "${benches[@]}"; do
            (cd "$tree" && PYTHONPATH=src timeout -k 10 200 python3 "benchmarks/bench_$b.py" --quick ${BENCH_ARGS:-} \
                > "$out_dir/${label}_${b}_${turn}.txt" 2>&1) || echo "$label bench_$b turn $turn failed"
        done
    done
done
# The lines that carry each bench's figures, per tree and turn (SUMMARY: a grep -E pattern).
(cd "$out_dir" && grep -E "${SUMMARY:-added per op|slowdown|card:|per pair|training step, ms}" ./{new,old}_*.txt)
(cd "$out_dir" && tar czf compare.tgz ./*.txt && rm -f ./*.txt)  # the device tool brings back few files
