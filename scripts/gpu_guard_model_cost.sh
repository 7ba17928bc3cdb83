#!/usr/bin/env bash
# Where the guard's added time on a real training step goes (issue 34: --guard at most 1.3x):
# bench_models' ResNet-18 and GPT-2 steps plain, under the guard with its defaults, and with one
# part of it changed at a time (scripts/diag_guard_variants.py), in turns; then a cProfile of the
# guard's default run (host functions by own time). From the repository root, one GPU:
#   bash scripts/gpu_guard_model_cost.sh       (device call: carry .whl)
# shellcheck source=scripts/gpu_preamble.sh
source scripts/gpu_preamble.sh
export PYTHONPATH=src
variants=(plain - sync_check_interval=None capture_stacks=False quarantine_count=0 ready_limit=0 canary_bytes=0)
run_variant() {  # model variant -> ms/step
    local model=$1 v=$2 cmd
    if [ "$v" = plain ]; then cmd=(python3 benchmarks/bench_models.py)
    else cmd=(python3 scripts/diag_guard_variants.py "$v" benchmarks/bench_models.py); fi
    timeout 120 "${cmd[@]}" --child "$model" --steps 20 --warm 5 > "$out_dir/v.txt" 2>&1
    echo "$model $v: $(grep -o 'BENCH_STEP_MS [0-9.]*' "$out_dir/v.txt" | cut -d' ' -f2) ms/step $(grep -o 'ignis guard: .*' "$out_dir/v.txt" | head -1)"
}
for round in 0 1; do
    for model in resnet gpt2; do
        [ "$model" = gpt2 ] && [ "$round" = 1 ] && continue
        list=("${variants[@]}"); [ "$round" = 1 ] && list=($(printf '%s\n' "${variants[@]}" | tac))
        for v in "${list[@]}"; do run_variant "$model" "$v"; done
    done
done
echo "variants: $(( $(date +%s) - t0 )) s"
timeout 120 python3 -c "
import cProfile, pstats, runpy, sys
sys.argv = ['scripts/diag_guard_variants.py', '-', 'benchmarks/bench_models.py', '--child', 'resnet', '--steps', '20', '--warm', '5']
cProfile.run(\"runpy.run_path('scripts/diag_guard_variants.py', run_name='__main__')\", '$out_dir/guard_resnet.prof')
p = pstats.Stats('$out_dir/guard_resnet.prof'); p.sort_stats('tottime').print_stats(25)
" > "$out_dir/profile.txt" 2>&1
grep -E "BENCH_STEP_MS|ncalls|^ +[0-9]" "$out_dir/profile.txt" | head -32
echo "all: $(( $(date +%s) - t0 )) s"
