#!/usr/bin/env bash
# One device call (two GPUs): the PyTorch test files each in its own process, then where a real
# model's step under --sanitize and --guard spends its added time (issue 34): diag_model_cost.py
# per model, then (with .perfkit/ carried, see scripts/gpu_perf_torch.sh) sampling profiles of the
# ResNet-18 step plain, under the sanitizer and under the guard.
#   bash scripts/gpu_where_time_goes.sh        (device call: carry .whl and .perfkit)
# WTG_FILES: the test files (default: the PyTorch ones); WTG_SKIP_TESTS=1 / WTG_SKIP_DIAG=1 /
# WTG_SKIP_PERF=1 leave a part out; WTG_FILE_TIMEOUT: seconds per test file (default 240).
# shellcheck source=scripts/gpu_preamble.sh
BUILD_TAIL=2
source scripts/gpu_preamble.sh
export PYTHONPATH=src
if [ -z "${WTG_SKIP_TESTS:-}" ]; then
    files=${WTG_FILES:-"test_torch_gpu test_torch_ops test_torch_graphs test_torch_graphs_gpu test_torch_guard test_cupy_guard test_torch_distributed_gpu test_torch_distributed"}
    run_one() {
        timeout -k 10 "${WTG_FILE_TIMEOUT:-240}" python3 -X faulthandler -m pytest "tests/$1.py" -q -p no:cacheprovider --timeout=120 \
            --timeout-method=thread > "$OUT_DIR/$1.log" 2>&1
        echo "$? $1 $(grep -E '[0-9]+ (passed|failed)' "$OUT_DIR/$1.log" | tail -1)"
    }
    export -f run_one
    export OUT_DIR="$out_dir"
    printf '%s\n' $files | xargs -P 4 -I{} bash -c 'run_one {}' | sort | tee "$out_dir/status.txt"
    (cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./*.log)
    echo "tests: $(( $(date +%s) - t0 )) s"
fi
if [ -z "${WTG_SKIP_DIAG:-}" ]; then
    for m in ${DIAG_MODELS:-resnet gpt2}; do
        timeout 200 python3 scripts/diag_model_cost.py "$m" "${DIAG_STEPS:-20}" "${DIAG_ROUNDS:-2}" > "$out_dir/diag-$m.txt" 2>&1
        tail -16 "$out_dir/diag-$m.txt"
    done
    echo "diag: $(( $(date +%s) - t0 )) s"
fi
if [ -z "${WTG_SKIP_PERF:-}" ] && [ -x .perfkit/perf ]; then
    perf() { LD_LIBRARY_PATH="$PWD/.perfkit/lib" .perfkit/perf "$@"; }
    mkdir -p "$out_dir/perf"
    for r in ${PERF_RUNS:-plain:resnet ignis:resnet guard:resnet}; do
        IFS=: read -r v w <<< "$r"
        data="$out_dir/perf/$v-$w.data"
        perf record -q -F 2999 -e cpu-clock -D "${PERF_DELAY_MS:-12000}" -g -o "$data" \
            python3 scripts/perf_torch_sanitizer.py "$v" "$w" "${PERF_SECS:-6}" 2>&1 | tail -1
        perf report -i "$data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -150 > "$out_dir/perf/$v-$w.txt"
        perf report -i "$data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 > "$out_dir/perf/$v-$w-dso.txt"
        perf report -i "$data" --children --sort sym --stdio -g none --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep -v '^$' | head -250 > "$out_dir/perf/$v-$w-incl.txt"
        rm -f "$data"
    done
    (cd "$out_dir" && tar czf perf.tgz perf && rm -rf perf)
    echo "perf: $(( $(date +%s) - t0 )) s"
fi
