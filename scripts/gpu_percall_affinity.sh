#!/usr/bin/env bash
# Whether where the benchmark's processes run (which CPUs) moves bench_allreduce's per-call row,
# from the repository root on a two-GPU machine:  bash scripts/gpu_percall_affinity.sh
# Prints the GPUs' CPU and NUMA affinity (nvidia-smi topo -m) and the host's NUMA nodes, builds,
# then runs the row (64 MiB, one trial) bound to each NUMA node's CPUs in turns (taskset; the
# ranks inherit it), twice, and once unbound.
set -uo pipefail
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi topo -m
lscpu | grep -iE "^(CPU\(s\)|NUMA|Model name|Socket)"
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1 || echo "build failed (see build.txt)"
export PYTHONPATH=src
mapfile -t nodes < <(lscpu -p=NODE,CPU | grep -v '^#' | awk -F, '{a[$1]=a[$1] (a[$1] ? "," : "") $2} END {for (n in a) print n ":" a[n]}' | sort -n)
for i in 1 2; do
    for spec in "${nodes[@]}" "all:"; do
        node="${spec%%:*}" cpus="${spec#*:}"
        if [ "$node" = all ]; then run=(); else run=(taskset -c "$cpus"); fi
        "${run[@]}" timeout 60 python3 benchmarks/bench_allreduce.py --min-mib 64 --max-mib 64 --trials 1 \
            > "$out_dir/percall_node${node}_$i.txt" 2>&1
        echo "== node $node, turn $i (rc $?)"
        grep -E "per call|communicator's stream \(no" "$out_dir/percall_node${node}_$i.txt"
    done
done
