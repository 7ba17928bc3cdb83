#!/usr/bin/env bash
# benchmarks/bench_models.py in lockstep (the contenders' processes alive at once, in turns of
# short blocks of steps) after a build; from the repository root, one GPU:
#   bash scripts/gpu_models_lockstep.sh [rounds] [block] [models]     (device call: carry .whl)
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
PYTHONPATH=src python3 benchmarks/bench_models.py --lockstep --rounds "${1:-30}" --block "${2:-5}" \
    --models "${3:-resnet,gpt2}" 2>&1 | grep -v '^\[transformers\]' | tee "$out_dir/lockstep.txt"
echo "all: $(( $(date +%s) - t0 )) s"
