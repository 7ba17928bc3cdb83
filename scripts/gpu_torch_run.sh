#!/usr/bin/env bash
# The PyTorch front end's and the guard's test files on the GPU machine, in parallel, after a
# build (the compiled modules and the op observer), from the repository root:
#   bash scripts/gpu_torch_run.sh      (logs: $OUT/logs.tgz, the zoo's output: $OUT/zoo.log)
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -2 "$out_dir/build.txt"
export PYTHONPATH=src IGNIS_BACKEND=cuda IGNIS_ZOO_LOG="$out_dir/zoo.log"
for f in test_torch_gpu test_torch_ops test_torch_trace test_run test_torch_guard test_cupy_guard test_compiled_build; do
    (timeout 400 python3 -X faulthandler -m pytest "tests/$f.py" -q -p no:cacheprovider > "$out_dir/$f.log" 2>&1
     echo "$f rc=$? $(tail -1 "$out_dir/$f.log")") &
done
wait
(cd "$out_dir" && tar czf logs.tgz test_*.log && rm -f test_*.log)
