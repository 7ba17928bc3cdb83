#!/usr/bin/env bash
# Where a real training step's time goes on the host, plain and under the checks, on one GPU:
# scripts/diag_step_cpu.py's per-thread CPU and run-queue times, the contenders in turns, ROUNDS
# rounds per model (WHOS: plain, sanitize, guard, and rf: a RecordFunction callback that only
# counts, as the observer asks for inputs and outputs; sanitize0: --sanitize without the op
# observer's checker thread, IGNIS_OBSERVER_CHECKER=0); then, under --sanitize, the op
# observer's own timers in the steps (NO_TIMERS=1: not).
#   bash scripts/gpu_step_cpu.sh [MODELS] [ROUNDS] [STEPS]
set -uo pipefail
models="${1:-resnet gpt2}"; rounds="${2:-2}"; steps="${3:-30}"
out_dir="${OUT:-out}"; mkdir -p "$out_dir"
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi -L; nproc
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1 || { echo "build failed"; tail -5 "$out_dir/build.txt"; exit 1; }
run() {  # who model steps [timers]
    case "$1" in
        plain) python3 scripts/diag_step_cpu.py "$2" "$3" 5 ${4:-} ;;
        rf) python3 scripts/diag_step_cpu.py "$2" "$3" 5 rf ;;
        sanitize0) IGNIS_OBSERVER_CHECKER=0 python3 -m ignis run --sanitize scripts/diag_step_cpu.py "$2" "$3" 5 ${4:-} ;;
        *) python3 -m ignis run "--$1" scripts/diag_step_cpu.py "$2" "$3" 5 ${4:-} ;;
    esac 2>&1 | grep -E "^STEP|^  thread|^  observer|^  RecordFunction|problem|Error" | head -20
}
for m in $models; do
    for r in $(seq "$rounds"); do
        for who in ${WHOS:-plain sanitize guard}; do echo "== $m $who round $r"; IGNIS_RUN_MODE=$who run "$who" "$m" "$steps"; done
    done
    [ -n "${NO_TIMERS:-}" ] || { echo "== $m sanitize, the observer's timers"; IGNIS_RUN_MODE="sanitize timers" run sanitize "$m" "$steps" timers; }
done
