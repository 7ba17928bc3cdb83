#!/usr/bin/env bash
# The session's last GPU call, from the repository root, on two GPUs: build; the front ends' zoos
# and test files again (in parallel); the wheel check (a wheel in .whl/ignis/); then the
# benchmarks, each with its own limit, most important first: bench_models (ResNet-18, GPT-2:
# plain, CSAN, --sanitize, --guard), bench_ddp (with CSAN), bench_graphs, bench_allreduce.
# Each writes its file under ${OUT:-out}; the logs of the tests go into logs.tgz.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
nvidia-smi -L | head -2
if ls .whl/ignis/*.whl >/dev/null 2>&1; then
    (timeout 300 bash scripts/gpu_wheel_check.sh .whl/ignis > /dev/null 2>&1; echo "wheel check rc=$?") &
fi
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
one() {
    f="$1"; name=$(basename "$f" .py)
    IGNIS_ZOO_LOG="$out_dir/$name.zoo.log" timeout 300 python3 -X faulthandler -m pytest "$f" -q -p no:cacheprovider \
        --timeout=280 > "$out_dir/$name.log" 2>&1
    echo "$name rc=$? $(tail -1 "$out_dir/$name.log")"
}
for f in tests/test_torch_distributed_gpu.py tests/test_torch_graphs_gpu.py tests/test_torch_distributed.py \
         tests/test_torch_graphs.py tests/test_torch_trace.py tests/test_torch_guard.py; do one "$f" & done
wait
echo "tests: $(( $(date +%s) - t0 )) s"
(cd "$out_dir" && tar czf logs.tgz ./*.log && rm -f ./test_*.log)
b() { name="$1"; limit="$2"; shift 2
      timeout "$limit" python3 "$@" > "$out_dir/$name.txt" 2>&1; echo "$name rc=$? at $(( $(date +%s) - t0 )) s"; }
b bench_models 200 benchmarks/bench_models.py --rounds 1 --steps 15
b bench_ddp 130 benchmarks/bench_ddp.py --rounds 1 --steps 20
b bench_graphs 110 benchmarks/bench_graphs.py --rounds 1 --steps 20
b bench_allreduce 90 benchmarks/bench_allreduce.py --max-mib 256 --trials 3
for f in bench_models bench_ddp bench_graphs bench_allreduce; do echo "== $f"; tail -14 "$out_dir/$f.txt"; done
echo "total: $(( $(date +%s) - t0 )) s"
