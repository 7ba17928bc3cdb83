#!/usr/bin/env bash
# bench_allreduce's per-call row (its contenders in turns), this tree against another in turns
# on one two-GPU machine, from the repository root:
#   git archive <rev> src setup.py pyproject.toml | (mkdir -p .ab_old && tar -x -C .ab_old)
#   bash scripts/gpu_percall_ab.sh [TURNS]      (device call: carry .whl and .ab_old)
# Builds both trees; runs this tree's benchmarks/bench_allreduce.py (64 MiB, one trial, then the
# per-call row) against each tree's src, new, old, new, old, ... (TURNS pairs, default 2).
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi -L
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"
tail -1 "$out_dir/build.txt"; [ -d .ab_old/src ] && tail -1 "$out_dir/build_old.txt"
echo "build: $(( $(date +%s) - t0 )) s"
for i in $(seq 1 "${1:-2}"); do
    for turn in new old; do
        [ "$turn" = old ] && [ ! -d .ab_old/src ] && continue
        src="$PWD/src"; [ "$turn" = old ] && src="$PWD/.ab_old/src"
        PYTHONPATH="$src" timeout 120 python3 benchmarks/bench_allreduce.py --min-mib 64 --max-mib 64 --trials 1 \
            > "$out_dir/percall_${turn}_$i.txt" 2>&1
        echo "== $turn $i (rc $?, at $(( $(date +%s) - t0 )) s)"; grep -E "per call|communicator's stream|bookkeeping" "$out_dir/percall_${turn}_$i.txt"
    done
done
