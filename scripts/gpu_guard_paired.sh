#!/usr/bin/env bash
# The guard's pair against the caching allocator with paired rounds (bench_guard.py
# --pair-only), for this tree and, optionally, another tree's library under this tree's
# benchmark, in turns on one card:
#   bash scripts/gpu_guard_paired.sh [OLD_DIR] [turns]
# OLD_DIR: another tree (`git archive REV | tar -x -C OLD_DIR`, carried untracked), built here.
# GUARD_OPTS (JSON use_guard options) adds a turn of this tree with those options.
set -uo pipefail
old="${1:-}"; turns="${2:-2}"
export IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
here="$(pwd)"
for t in . ${old:+"$old"}; do (cd "$t" && bash "$here/scripts/gpu_build.sh" > /dev/null 2>&1) || echo "build failed: $t"; done
nvidia-smi -L || true
for turn in $(seq 1 "$turns"); do
    echo "== new, turn $turn"
    PYTHONPATH=src python3 benchmarks/bench_guard.py --pair-only --pair-rounds "${ROUNDS:-15}" | grep "^torch.empty"
    if [ -n "$old" ]; then
        echo "== old, turn $turn"
        PYTHONPATH="$old/src" python3 benchmarks/bench_guard.py --pair-only --pair-rounds "${ROUNDS:-15}" | grep "^torch.empty"
    fi
    if [ -n "${GUARD_OPTS:-}" ]; then
        echo "== new with $GUARD_OPTS, turn $turn"
        PYTHONPATH=src python3 benchmarks/bench_guard.py --pair-only --pair-rounds "${ROUNDS:-15}" --guard-opts "$GUARD_OPTS" | grep "^torch.empty"
    fi
done
