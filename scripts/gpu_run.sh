#!/usr/bin/env bash
# Run the test suite on the GPU machine, from the repository root:
#   bash scripts/gpu_run.sh [extra pytest args...]
# e.g. bash scripts/gpu_run.sh tests/test_cuda_backend.py -k rebuild
# No network is needed. Writes junit.xml and pytest.log into ${OUT:-out}
# and exits with pytest's status.
set -uo pipefail

export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
out_dir="${OUT:-out}"
mkdir -p "$out_dir"

echo "== devices"
nvidia-smi -L || echo "nvidia-smi -L failed (status $?)"

echo "== build the compiled hot path in place (Cython; without it import ignis fails)"
bash scripts/gpu_build.sh 2>&1 | grep -v -i "beta\|warnings.warn" || true

echo "== versions"
python3 - <<'PY'
import sys
print("python", sys.version.split()[0])
try:
    import cuda.bindings
    print("cuda-bindings", cuda.bindings.__version__)
except Exception as exc:  # report and go on: pytest will show the failure
    print("cuda-bindings not importable:", type(exc).__name__, exc)
try:
    from ignis.backends import get_backend
    b = get_backend()
    print("ignis backend", b.name, b.versions())
except Exception as exc:
    print("ignis backend failed:", type(exc).__name__, exc)
PY

echo "== pytest"
# Run tests/ unless the arguments name test paths themselves.
targets=(tests)
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then targets=(); break; fi
done
# The thread method of pytest-timeout also fires when the main thread is stuck
# inside a driver call; the outer timeout keeps the whole run inside the
# device tool's 10-minute limit so that $OUT still comes back.
timeout -k 15 "${IGNIS_RUN_TIMEOUT:-560}" \
    python3 -X faulthandler -m pytest "${targets[@]}" -q -x -p no:cacheprovider \
        --timeout="${IGNIS_TEST_TIMEOUT:-180}" --timeout-method=thread \
        --junitxml="$out_dir/junit.xml" "$@" 2>&1 | tee "$out_dir/pytest.log"
status=${PIPESTATUS[0]}
echo "== pytest exit status $status"
exit "$status"
