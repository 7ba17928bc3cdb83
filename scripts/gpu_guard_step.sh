#!/usr/bin/env bash
# Where the guard's added time goes in a real training step (issue 34: --guard at most 1.3x):
# scripts/diag_guard_step.py per model, plain and under the guard (host time in the allocator's
# entry points and the synchronize hook; the device's time by kind), in turns, two rounds; then
# bench_models.py in lockstep with guard variants (GUARD_VARIANTS, ';'-separated option sets).
#   bash scripts/gpu_guard_step.sh [rounds] [block]        (device call: carry .whl)
# GUARD_MODES: the diag's modes, in turns (default "plain guard"; e.g. guard:direct=0).
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export PYTHONPATH=src
for round in 0 1; do
    for model in ${GUARD_MODELS:-resnet gpt2}; do
        read -ra modes <<< "${GUARD_MODES:-plain guard}"
        [ "$round" = 1 ] && modes=($(printf '%s\n' "${modes[@]}" | tac))
        for mode in "${modes[@]}"; do
            [ -z "$mode" ] && continue
            timeout 120 python3 scripts/diag_guard_step.py "$model" "$mode" 30 > "$out_dir/diag.txt" 2>&1
            grep -E "step |per step|entry points|guard parts|driver calls|device per|host wait|problem" "$out_dir/diag.txt" | head -10
        done
    done
done
echo "diag: $(( $(date +%s) - t0 )) s"
[ -n "${GUARD_SKIP_LOCKSTEP:-}" ] && exit 0
variants=()
IFS=';' read -ra vs <<< "${GUARD_VARIANTS:--;capture_stacks=False;sync_check_interval=None}"
for v in "${vs[@]}"; do [ -n "$v" ] && variants+=(--variant "$v"); done
python3 benchmarks/bench_models.py --lockstep --no-csan --rounds "${1:-20}" --block "${2:-5}" \
    --models "$(echo ${GUARD_MODELS:-resnet gpt2} | tr " " ",")" "${variants[@]}" 2>&1 | grep -v '^\[transformers\]' \
    | tee "$out_dir/lockstep.txt"
echo "all: $(( $(date +%s) - t0 )) s"
