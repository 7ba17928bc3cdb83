#!/usr/bin/env bash
# One GPU: the front end's GPU trace hook (the observer's TraceShim) checked and measured:
# a build, the PyTorch GPU test files (the bug zoo and correct programs with both engines,
# graphs and compiled code), then scripts/diag_model_cost.py on both models.
#   bash scripts/gpu_trace_hook_run.sh        (logs under ${OUT:-out})
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -1 "$out_dir/build.txt"
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
for f in ${HOOK_TESTS:-tests/test_torch_gpu.py tests/test_torch_graphs_gpu.py}; do
    name=$(basename "$f" .py)
    (timeout -k 10 330 python3 -X faulthandler -m pytest "$f" -q -p no:cacheprovider --timeout=200 \
        --timeout-method=thread > "$out_dir/$name.log" 2>&1; echo "$? $name $(grep -E '[0-9]+ (passed|failed)' "$out_dir/$name.log" | tail -1)") &
done
wait
echo "tests: $(( $(date +%s) - t0 )) s"
for m in ${DIAG_MODELS:-resnet gpt2}; do
    timeout 200 python3 scripts/diag_model_cost.py "$m" "${DIAG_STEPS:-20}" "${DIAG_ROUNDS:-3}" > "$out_dir/diag-$m.txt" 2>&1
    grep -v "^\[transformers\]" "$out_dir/diag-$m.txt" | tail -12
done
echo "all: $(( $(date +%s) - t0 )) s"
