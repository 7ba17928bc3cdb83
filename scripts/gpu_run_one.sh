# Sourced by the gpu_*.sh scripts that run test files each in its own pytest process:
# `run_one FILE` runs FILE (its log in $OUT_DIR/NAME.log) and prints "STATUS NAME SUMMARY", so a
# crash at interpreter exit names its file. RUN_ONE_LIMIT: seconds for the file (default 300);
# RUN_ONE_TEST_LIMIT: seconds for one test (default 200). Exported for xargs' shells.
#   OUT_DIR=out RUN_ONE_LIMIT=420 source scripts/gpu_run_one.sh
run_one() {
    f="$1"; name=$(basename "$f" .py)
    timeout -k 10 "${RUN_ONE_LIMIT:-300}" python3 -X faulthandler -m pytest "$f" -q -p no:cacheprovider \
        --timeout="${RUN_ONE_TEST_LIMIT:-200}" --timeout-method=thread > "$OUT_DIR/$name.log" 2>&1
    echo "$? $name $(grep -E '[0-9]+ (passed|failed)' "$OUT_DIR/$name.log" | tail -1)"
}
export -f run_one
export OUT_DIR RUN_ONE_LIMIT RUN_ONE_TEST_LIMIT
