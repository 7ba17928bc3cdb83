#!/usr/bin/env bash
# Sampling profiles (perf, cpu-clock) on the GPU machine, after a build: bench_torch_sanitizer's
# workloads plain and under ignis.torch, and torch.empty + free plain and under the guard
# (scripts/perf_torch_sanitizer.py). The machine has no perf: a perf binary and the libraries
# it needs travel in .perfkit/ (carried, not in the repository; ignored through .git/info/exclude):
#   mkdir -p .perfkit/lib && cp /usr/bin/perf .perfkit/ &&
#   for l in $(ldd /usr/bin/perf | awk '/=>/{print $3}'); do cp -L "$l" .perfkit/lib/; done
#   (leave out libc, libm, libstdc++ and libgcc_s: the machine's own are used)
#   bash scripts/gpu_perf_torch.sh [seconds]      (reports: $OUT/perf.tgz, <variant>-<workload>.txt each)
#   PERF_RUNS="ignis:loop guard:pair:4096" PERF_DELAY_MS=6000 PERF_CALLS=1 bash scripts/gpu_perf_torch.sh 10
# PERF_DELAY_MS: start sampling that late (past the imports and the set-up); PERF_CALLS=1: call
# graphs (frame pointers) and a report of inclusive time per function as well.
set -uo pipefail
out_dir="${OUT:-out}"
secs="${1:-8}"
mkdir -p "$out_dir/perf"
bash scripts/gpu_build.sh -j 16 > "$out_dir/build.txt" 2>&1; tail -2 "$out_dir/build.txt"
export PYTHONPATH=src OPENBLAS_NUM_THREADS=1  # numpy's idle BLAS threads would fill the profile
perf() { LD_LIBRARY_PATH="$PWD/.perfkit/lib" .perfkit/perf "$@"; }
echo "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid)"
perf --version || exit 1
runs="plain:loop ignis:loop plain:train ignis:train plain:pair:4096 guard:pair:4096 plain:pair:1048576 guard:pair:1048576"
for r in ${PERF_RUNS:-$runs}; do
    IFS=: read -r v w b <<< "$r"
    name="$v-$w${b:+-$b}"
    data="$out_dir/perf/$name.data"
    perf record -q -F 2999 -e cpu-clock ${PERF_DELAY_MS:+-D $PERF_DELAY_MS} ${PERF_CALLS:+-g} -o "$data" python3 scripts/perf_torch_sanitizer.py $v $w $b "$secs"
    perf report -i "$data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30 > "$out_dir/perf/$name.txt"
    perf report -i "$data" --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -${PERF_LINES:-200} >> "$out_dir/perf/$name.txt"
    if [ -n "${PERF_CALLS:-}" ]; then
        perf report -i "$data" --children --sort sym --stdio -g none --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep -v '^$' | head -300 > "$out_dir/perf/$name-incl.txt"
        perf report -i "$data" --no-children --sort sym --stdio -g caller,0.5,callee --percent-limit 1 2>/dev/null | grep -v '^$' | head -1500 > "$out_dir/perf/$name-calls.txt"
    fi
    rm -f "$data"
done
(cd "$out_dir" && tar czf perf.tgz perf && rm -rf perf)
