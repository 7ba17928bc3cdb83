#!/usr/bin/env bash
# Correct programs under --sanitize with DDP on a process group of one rank (one GPU): the
# models of bench_models (``resnet-ddp1``, ``gpt2-ddp1``) for many steps under ``ignis run
# --sanitize``, each run's report kept; then the ResNet's step under diag_model_cost's
# ``ignis`` and ``ignis-stack0`` variants, in rounds. From the repository root:
#   bash scripts/gpu_ddp_reports.sh [steps]      (device call: carry .whl)
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export PYTHONPATH=src
for m in ${DDP_MODELS:-resnet-ddp1 resnet-ddp1 gpt2-ddp1}; do
    f="$out_dir/san-$m-$(date +%s%N).txt"
    timeout 200 python3 -m ignis run --sanitize benchmarks/bench_models.py --child "$m" --steps "${1:-150}" \
        --warm 5 2>&1 | grep -v '^\[transformers\]' > "$f"
    echo "$m rc=${PIPESTATUS[0]}: $(grep -E 'BENCH_STEP_MS|no problems found|problem' "$f" | head -3 | tr '\n' ' ')"
done
if [ -z "${DDP_SKIP_DIAG:-}" ]; then
    DIAG_VARIANTS="${DIAG_VARIANTS:-ignis-stack0,ignis}" timeout 240 python3 scripts/diag_model_cost.py resnet-ddp1 \
        40 3 2>&1 | grep -v '^\[transformers\]' > "$out_dir/diag-variants.txt"
    grep -E "reports|ignis" "$out_dir/diag-variants.txt" | head -20
fi
echo "all: $(( $(date +%s) - t0 )) s"
