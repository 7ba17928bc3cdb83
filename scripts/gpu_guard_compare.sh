#!/usr/bin/env bash
# The guard's torch.empty + free pair against the caching allocator, this tree and another
# in turns on one card:   bash scripts/gpu_guard_compare.sh OLD_DIR [turns]
# OLD_DIR holds the other tree (`git archive REV | tar -x -C OLD_DIR`, carried untracked).
# GUARD_OPTS (JSON options for use_guard, e.g. '{"batch": 512}') adds a third contender:
# this tree with those options. Prints, per contender and turn, µs per pair at 4 KiB / 1 MiB
# (plain, guard) and the ratios; each contender's plain child runs just before its guard child.
set -uo pipefail
old="$1"; turns="${2:-3}"
export IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
here="$(pwd)"
for t in . "$old"; do (cd "$t" && bash "$here/scripts/gpu_build.sh" > /dev/null 2>&1) || echo "build failed: $t"; done
contenders=("new|.|" "old|$old|")
[ -n "${GUARD_OPTS:-}" ] && contenders+=("new+opts|.|$GUARD_OPTS")
for turn in $(seq 1 "$turns"); do
    for c in "${contenders[@]}"; do
        IFS='|' read -r label t opts <<< "$c"
        p=$(cd "$t" && PYTHONPATH=src timeout 120 python3 benchmarks/bench_guard.py --child pair plain | grep RESULT | cut -c8-)
        g=$(cd "$t" && PYTHONPATH=src timeout 120 python3 benchmarks/bench_guard.py --child pair guard ${opts:+"$opts"} | grep RESULT | cut -c8-)
        python3 -c "import json, sys; p, g = json.loads(sys.argv[1]), json.loads(sys.argv[2]); print(sys.argv[3], 'plain %.2f / %.2f  guard %.2f / %.2f  ratio %.2f / %.2f' % (p['4KiB'], p['1MiB'], g['4KiB'], g['1MiB'], g['4KiB'] / p['4KiB'], g['1MiB'] / p['1MiB']))" "$p" "$g" "$label turn $turn"
    done
done
