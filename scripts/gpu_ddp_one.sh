#!/usr/bin/env bash
# What DDP adds to a step under --sanitize, on one GPU (issue 32's DDP target, studied where no
# two-GPU machine is lent): ResNet-18 alone and under DDP on a process group of one rank
# (bench_models' ``resnet-ddp1``), plain and under --sanitize in lockstep; then where the DDP
# step's added time goes (scripts/diag_model_cost.py's variants), from the repository root:
#   bash scripts/gpu_ddp_one.sh [rounds] [models]      (device call: carry .whl)
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export PYTHONPATH=src
timeout 330 python3 benchmarks/bench_models.py --lockstep --rounds "${1:-10}" --block 5 \
    --models "${2:-resnet,resnet-ddp1}" --contenders "ignis --sanitize" 2>&1 | grep -v '^\[transformers\]' \
    | tee "$out_dir/lockstep.txt"
echo "lockstep: $(( $(date +%s) - t0 )) s"
if [ -z "${DDP_SKIP_DIAG:-}" ]; then
    timeout 200 python3 scripts/diag_model_cost.py resnet-ddp1 "${DIAG_STEPS:-20}" "${DIAG_ROUNDS:-2}" \
        > "$out_dir/diag-resnet-ddp1.txt" 2>&1
    tail -16 "$out_dir/diag-resnet-ddp1.txt"
fi
echo "all: $(( $(date +%s) - t0 )) s"
