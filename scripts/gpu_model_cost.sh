#!/usr/bin/env bash
# Where a real model's step under --sanitize spends its added time (issue 34), on the GPU machine:
# a build, scripts/diag_model_cost.py for each model in its own process, then (with .perfkit/
# carried, see scripts/gpu_perf_torch.sh) sampling profiles of the ResNet step plain, with the
# trace active, and under ignis.torch.
#   bash scripts/gpu_model_cost.sh            (logs: $OUT/diag-<model>.txt, $OUT/perf.tgz)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -2 "$out_dir/build.txt"
export PYTHONPATH=src OPENBLAS_NUM_THREADS=1
for m in ${DIAG_MODELS:-resnet gpt2}; do
    timeout 300 python3 scripts/diag_model_cost.py "$m" "${DIAG_STEPS:-20}" "${DIAG_ROUNDS:-3}" > "$out_dir/diag-$m.txt" 2>&1
    cat "$out_dir/diag-$m.txt" | tail -20
done
if [ -x .perfkit/perf ] && [ -z "${NO_PERF:-}" ]; then
    PERF_RUNS="${PERF_RUNS:-plain:resnet trace:resnet ignis:resnet}" PERF_DELAY_MS="${PERF_DELAY_MS:-12000}" \
        PERF_CALLS=1 bash scripts/gpu_perf_torch.sh "${PERF_SECS:-8}" > "$out_dir/perf-log.txt" 2>&1
    tail -5 "$out_dir/perf-log.txt"
fi
