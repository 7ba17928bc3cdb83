#!/usr/bin/env bash
# The whole GPU check in one call, from the repository root (a two-GPU machine for the
# distributed tests): the wheel check (a wheel built elsewhere, in .whl/ignis/) beside every
# test file in its own process, eight at a time, the collective tests among them.
#   bash scripts/gpu_full_run.sh
# Brings back: gpu_wheel_check.log, build.txt, status.txt, logs.tgz (under ${OUT:-out}).
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi -L
if ls .whl/ignis/*.whl >/dev/null 2>&1; then
    (timeout 400 bash scripts/gpu_wheel_check.sh .whl/ignis > /dev/null 2>&1
     echo "wheel check rc=$? at $(( $(date +%s) - t0 )) s") &
fi
if ! bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; then
    # (every test file would fail at `import ignis`: the device time is not spent on that)
    echo "the compiled modules did not build; no test runs (build.txt):"; tail -4 "$out_dir/build.txt"
    wait; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda OUT_DIR="$out_dir" RUN_ONE_LIMIT=420
# shellcheck source=scripts/gpu_run_one.sh
source scripts/gpu_run_one.sh
# The longest first, so that they do not start last.
{ ls tests/test_collective.py tests/test_torch_distributed_gpu.py tests/test_torch_graphs_gpu.py tests/test_torch_gpu.py \
     tests/test_torch_guard.py; ls tests/test_*.py; } | awk '!seen[$0]++' \
    | timeout 520 xargs -P 8 -I{} bash -c 'run_one {}' | sort | tee "$out_dir/status.txt"
echo "test files: $(( $(date +%s) - t0 )) s"
wait
(cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./test_*.log)
grep -E "FAILED|OK|driver functions|two-stream" "$out_dir/gpu_wheel_check.log" 2>/dev/null | head -12
! grep -qv "^0 " "$out_dir/status.txt"
