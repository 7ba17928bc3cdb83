#!/usr/bin/env bash
# Build this tree and, when there is one, .ab_old's (another tree, for an A/B: see gpu_coll_ab.sh)
# side by side, from the repository root:  bash scripts/gpu_build_ab.sh OUT_DIR
# Logs: OUT_DIR/build.txt and OUT_DIR/build_old.txt.
set -uo pipefail
out_dir="$(cd "$1" && pwd)"
bash scripts/gpu_build.sh -j 8 > "$out_dir/build.txt" 2>&1 &
if [ -d .ab_old/src ]; then
    (cd .ab_old && bash ../scripts/gpu_build.sh -j 8 > "$out_dir/build_old.txt" 2>&1) &
fi
wait
