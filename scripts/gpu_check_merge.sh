#!/usr/bin/env bash
# A short GPU check after the last merges, from the repository root: build, then the files the
# merged work touched on the GPU side (the pytest plugin, arrays, the telemetry tour, the CLI, the
# cuda backend, the guard, the graph and Triton zoo) and `ignis bench --only ipc`.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
for f in tests/test_pytest_plugin.py tests/test_array.py tests/test_telemetry.py tests/test_cli.py \
         tests/test_cuda_backend.py tests/test_run.py tests/test_torch_guard.py tests/test_torch_gpu.py; do
    (name=$(basename "$f" .py)
     timeout 200 python3 -m pytest "$f" -q -p no:cacheprovider --timeout=180 > "$out_dir/$name.log" 2>&1
     echo "$name rc=$? $(tail -1 "$out_dir/$name.log")") &
done
(timeout 120 python3 -m ignis bench --only ipc > "$out_dir/bench_ipc.log" 2>&1; echo "ignis bench --only ipc rc=$?") &
wait
(cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./*.log)
echo "total: $(( $(date +%s) - t0 )) s"
