#!/usr/bin/env bash
# The collective enqueue path, this tree against another in turns on one two-GPU machine, from
# the repository root:
#   git archive <rev> src setup.py pyproject.toml | (mkdir -p .ab_old && tar -x -C .ab_old)
#   bash scripts/gpu_coll_ab.sh          (device call: carry .whl and .ab_old)
# Builds both trees; runs scripts/diag_allreduce_cost.py's first row (DIAG_QUICK) four times,
# new, old, new, old; then bench_allreduce and bench_ddp on this tree. Logs under ${OUT:-out}.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OPENBLAS_NUM_THREADS=1
nvidia-smi -L
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"
tail -1 "$out_dir/build.txt"; [ -d .ab_old/src ] && tail -1 "$out_dir/build_old.txt"
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
for turn in new old new old; do
    [ "$turn" = old ] && [ ! -d .ab_old/src ] && continue
    src="$PWD/src"; [ "$turn" = old ] && src="$PWD/.ab_old/src"
    DIAG_QUICK=1 DIAG_SRC="$src" timeout 90 python3 scripts/diag_allreduce_cost.py > "$out_dir/diag_$turn.txt" 2>&1
    echo "== $turn (rc $?)"; grep -E "^(\[rank 0\] )?(#|everything|  \()" "$out_dir/diag_$turn.txt"
    cat "$out_dir/diag_$turn.txt" >> "$out_dir/diag_all.txt"
done
echo "diag: $(( $(date +%s) - t0 )) s"
[ -n "${AB_ONLY:-}" ] || bash scripts/gpu_dist_bench.sh "$out_dir"
echo "all: $(( $(date +%s) - t0 )) s"
