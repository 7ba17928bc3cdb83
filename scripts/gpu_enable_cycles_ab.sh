#!/usr/bin/env bash
# scripts/diag_enable_cycles.py on this tree and on .ab_old's (another tree, e.g. the one before a
# fix: git archive REV | tar -x -C .ab_old), in turns, one GPU; from the repository root:
#   bash scripts/gpu_enable_cycles_ab.sh [model] [cycles] [turns]   (device call: carry .whl, .ab_old)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1 IGNIS_BACKEND=cuda NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
bash scripts/gpu_build_ab.sh "$out_dir"; tail -1 "$out_dir/build.txt"; tail -1 "$out_dir/build_old.txt" 2>/dev/null
echo "build: $(( $(date +%s) - t0 )) s"
for t in $(seq "${3:-2}"); do
    for tree in old new; do
        src=src; [ "$tree" = old ] && src=.ab_old/src
        [ -d "$src" ] || continue
        DIAG_SRC="$src" timeout 200 python3 scripts/diag_enable_cycles.py "${1:-resnet-ddp1}" "${2:-30}" 3 2>&1 \
            | grep -v '^\[transformers\]\|destroy_process_group' > "$out_dir/cycles-$tree-$t.txt"
        echo "$tree turn $t: $(head -c 600 "$out_dir/cycles-$tree-$t.txt" | grep -m1 cycles)"
    done
done
echo "all: $(( $(date +%s) - t0 )) s"
