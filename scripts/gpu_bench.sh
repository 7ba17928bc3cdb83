#!/usr/bin/env bash
# Run the benchmarks on the GPU machine, from the repository root, one process
# per script, each anchor in the same process or run as the script says:
#   bash scripts/gpu_bench.sh [alloc array sanitizer ipc safetensors]
# Writes <name>.txt (and <name>.json where the script writes one) into ${OUT:-out}.
# No network is needed.
set -uo pipefail

export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
bash scripts/gpu_build.sh > "$out_dir/build.txt" 2>&1 || echo "the compiled modules did not build (see build.txt)"
nvidia-smi -L || true

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(alloc array sanitizer ipc safetensors)
status=0
for name in "${names[@]}"; do
    extra=(--json "$out_dir/$name.json")
    [ "$name" = safetensors ] && extra=(--sweep)  # it prints its tables only
    echo "== bench_$name"
    timeout -k 10 "${IGNIS_BENCH_TIMEOUT:-300}" python3 "benchmarks/bench_$name.py" "${extra[@]}" \
        > "$out_dir/$name.txt" 2>&1 || { echo "bench_$name failed (status $?)"; status=1; }
    tail -n 40 "$out_dir/$name.txt"
done
exit $status
