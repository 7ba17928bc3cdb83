#!/usr/bin/env bash
# On a machine with a GPU, PyTorch and CuPy, from the repository root: build the
# extension, run the guard's tests (zoo included) and its benchmark. Writes
# pytest.txt, zoo_*.txt and bench.{txt,json} into ${OUT:-out}.
#   bash tests/guard_zoo/gpu_check.sh [pytest-timeout-s] [bench-timeout-s]
set -uo pipefail
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
out="${OUT:-out}"; mkdir -p "$out"
python3 setup.py -q build_ext --inplace > "$out/build.txt" 2>&1 || { echo "BUILD FAILED"; tail -20 "$out/build.txt"; }
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, torch.cuda.get_device_name(0))"
echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo absent)"
for z in zoo_oob_torch zoo_uaf; do
  timeout 60 python3 -m ignis run --guard tests/guard_zoo/$z.py > "$out/$z.txt" 2>&1
  echo "== $z: status $?"; head -c 2500 "$out/$z.txt"; echo
done
timeout "${1:-150}" python3 -m pytest -q tests/test_torch_guard.py tests/test_cupy_guard.py -p no:cacheprovider \
  > "$out/pytest.txt" 2>&1; echo "== pytest status $?"; tail -c 5000 "$out/pytest.txt"
timeout "${2:-150}" python3 benchmarks/bench_guard.py --json "$out/bench.json" --steps 100 --memcheck-steps 10 \
  > "$out/bench.txt" 2>&1; echo "== bench status $?"; tail -c 3500 "$out/bench.txt"
