#!/usr/bin/env bash
# Run each test file in its own pytest process on the GPU machine (from the repository
# root), several at a time, and report each one's exit status: a crash at interpreter
# exit then names its file.   bash scripts/gpu_run_files.sh [-P N]
# Writes each file's log (bundled in logs.tgz) and status.txt into ${OUT:-out}.
set -uo pipefail
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
jobs=4
[ "${1:-}" = "-P" ] && jobs="$2"
bash scripts/gpu_build.sh > "$out_dir/build.txt" 2>&1 || echo "the compiled modules did not build (see build.txt)"
export OUT_DIR="$out_dir" RUN_ONE_TEST_LIMIT=120
# shellcheck source=scripts/gpu_run_one.sh
source scripts/gpu_run_one.sh
# The collective tests bind ports and spawn ranks: alone, first; the rest in parallel.
run_one tests/test_collective.py | tee "$out_dir/status.txt"
ls tests/test_*.py | grep -v test_collective.py | xargs -P "$jobs" -I{} bash -c 'run_one {}' | sort | tee -a "$out_dir/status.txt"
(cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./*.log)  # the device tool brings back 8 files at most
! grep -qv "^0 " "$out_dir/status.txt"
