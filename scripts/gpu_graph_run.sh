#!/usr/bin/env bash
# CUDA graphs, torch.compile and Triton on the GPU machine, from the repository root, in one call:
#   bash scripts/gpu_graph_run.sh
# build; tests/test_torch_graphs_gpu.py (the graph zoo; its output in zoo.log); on two GPUs also the
# FSDP2 program under the guard with some of its parts switched off (guard_variants.txt).
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -2 "$out_dir/build.txt"
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=src IGNIS_BACKEND=cuda
variants() {
    for v in - ready_limit=0 quarantine_count=0 ready_limit=0,quarantine_count=0 canary_bytes=0; do
        port=$((29600 + RANDOM % 1000))
        (timeout 200 python3 -m torch.distributed.run --nproc_per_node 2 --master-port $port \
            scripts/diag_guard_variants.py "$v" tests/dist_zoo/ok_fsdp2.py 2>&1 | grep -E "ZOO|problem|Error" \
            | sed "s/^/[$v] /") &
        sleep 1
    done
    wait
}
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    (cd . && PYTHONPATH=src:tests/dist_zoo variants > "$out_dir/guard_variants.txt" 2>&1) &
fi
IGNIS_ZOO_LOG="$out_dir/zoo.log" timeout 500 python3 -m pytest tests/test_torch_graphs_gpu.py -q -p no:cacheprovider \
    --timeout=480 > "$out_dir/graphs.log" 2>&1
echo "graph zoo rc=$? $(tail -1 "$out_dir/graphs.log")  at $(( $(date +%s) - t0 )) s"
wait
cat "$out_dir/guard_variants.txt" 2>/dev/null
grep -E "^(FAILED|ERROR)" "$out_dir/graphs.log"
echo "total: $(( $(date +%s) - t0 )) s"
