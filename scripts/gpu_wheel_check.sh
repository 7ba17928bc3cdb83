#!/usr/bin/env bash
# Check, on the GPU machine, that an Ignis wheel built elsewhere as pip builds it (an isolated
# build) gives a working compiled cuda backend. From the repository root:
#
#   bash scripts/gpu_wheel_check.sh WHEEL_DIR            # install the wheel in WHEEL_DIR for this Python
#   bash scripts/gpu_wheel_check.sh --build-here         # no such wheel: build one here first (see below)
#
# WHEEL_DIR holds wheels made with `pip wheel . --no-deps -w WHEEL_DIR` (one per Python version:
# the one whose tag is this interpreter's, e.g. cp312, is used). No registry is needed: the wheel
# goes into a fresh target folder with `pip install --no-deps --no-index --target`, and its
# dependencies (cuda-bindings, numpy, ml-dtypes) are the machine's. Then, from a folder outside
# the repository (so src/ is never imported):
#   1. the installed ignis and its ignis.backends._cudriver are the wheel's (a compiled module);
#   2. IGNIS_BACKEND=cuda starts the cuda backend; the entry points are loaded from the driver,
#      the backend hands them over, one of them reaches the driver, and an array written on one
#      stream and read on another comes back right;
#   3. the suite's backend tests (tests/test_cuda_backend.py, tests/test_cudriver.py, copied
#      beside it) pass against the installed wheel.
# --build-here (no wheel for this Python): builds one from this repository with this machine's
# setuptools (>= 77) and Cython (>= 3.3.1), or those carried in .whl/ (scripts/gpu_build_tools.sh),
# `pip wheel . --no-deps --no-build-isolation` (there is no registry here for an isolated build's
# requirements), and says so. Writes its log to
# ${OUT:-out}/gpu_wheel_check.log; exits non-zero at the first failing step.
set -uo pipefail

repo="$(pwd)"
[[ -f "$repo/setup.py" && -d "$repo/tests" ]] || { echo "run from the repository root" >&2; exit 2; }
out_dir="${OUT:-out}"
mkdir -p "$out_dir"
out_dir="$(cd "$out_dir" && pwd)"
log="$out_dir/gpu_wheel_check.log"
exec > >(tee "$log") 2>&1

py="${PYTHON:-python3}"
tag="$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
work="$(mktemp -d /tmp/ignis-wheel-check.XXXXXX)"
target="$work/site"
fail() { echo "FAILED: $*"; exit 1; }

echo "== machine"
nvidia-smi -L || echo "nvidia-smi -L failed (status $?)"
"$py" -c 'import sys, platform; print("python", sys.version.split()[0], platform.platform())'
echo "CUDA headers (cuda.h) on this machine: $(ls /usr/local/cuda*/include/cuda.h 2>/dev/null | tr '\n' ' ' || true)"
for h in /usr/local/cuda*/include/cuda.h; do
    [[ -f "$h" ]] && echo "  $h: $(grep -m1 -E '^#define CUDA_VERSION ' "$h")"
done
"$py" - <<'PY'
import importlib.metadata as md
for name in ("cuda-bindings", "numpy", "ml-dtypes", "setuptools", "Cython", "pytest"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY

echo "== the wheel"
if [[ "${1:-}" == "--build-here" ]]; then
    echo "no isolated build possible here (no registry for its build requirements): building with this"
    echo "machine's setuptools and Cython: pip wheel . --no-deps --no-build-isolation"
    # shellcheck source=scripts/gpu_build_tools.sh
    source "$repo/scripts/gpu_build_tools.sh" || fail "no Cython >= 3.3.1 and setuptools >= 77 to build with"
    "$py" -c "import Cython, setuptools; print('building with Cython', Cython.__version__, 'and setuptools', setuptools.__version__)"
    wheel_dir="$work/wheel"
    rm -rf "$repo/build"
    "$py" -m pip wheel "$repo" --no-deps --no-build-isolation -w "$wheel_dir" || fail "the wheel did not build"
else
    wheel_dir="${1:?usage: bash scripts/gpu_wheel_check.sh WHEEL_DIR | --build-here}"
fi
shopt -s nullglob
wheels=("$wheel_dir"/ignis-*-"$tag"-"$tag"-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || fail "want exactly one ignis wheel for $tag in $wheel_dir, found: ${wheels[*]:-none} \
(all: $(ls "$wheel_dir" 2>/dev/null | tr '\n' ' ')); build one for this Python, or use --build-here"
wheel="${wheels[0]}"
echo "$wheel ($(stat -c %s "$wheel") bytes)"
"$py" - "$wheel" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
print("WHEEL:", " | ".join(l for l in z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode().splitlines() if l))
print("compiled modules:", len([n for n in names if n.endswith(".so")]), "stubs:", len([n for n in names if n.endswith(".pyi")]))
assert any(n.startswith("ignis/backends/_cudriver.") and n.endswith(".so") for n in names), "no _cudriver in the wheel"
PY
[[ $? -eq 0 ]] || fail "the wheel lacks the compiled driver entry points"

echo "== install into a fresh target folder (no dependencies, no registry)"
"$py" -m pip install --no-deps --no-index --target "$target" "$wheel" || fail "pip install of the wheel"

echo "== the cuda backend from the installed wheel (outside the repository)"
cd "$work"
export PYTHONPATH="$target" IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
"$py" - "$target" <<'PY' || fail "the cuda backend did not start with the compiled driver entry points"
import ctypes, os, sys
target = os.path.realpath(sys.argv[1])
import ignis as ig
from ignis.backends import _cudriver, get_backend
for mod in (ig, _cudriver):
    path = os.path.realpath(mod.__file__)
    assert path.startswith(target + os.sep), f"{mod.__name__} imported from {path}, not the wheel in {target}"
assert _cudriver.__file__.endswith(".so"), _cudriver.__file__
print("ignis from", os.path.dirname(os.path.realpath(ig.__file__)))
print("_cudriver:", os.path.basename(_cudriver.__file__))
b = get_backend()
assert b.name == "cuda", b.name
print("backend:", b.name, b.versions())
funcs = _cudriver.load()
print("driver functions found with", _cudriver.resolved_via(), "for CUDA", _cudriver.CUDA_ABI_VERSION,
      {k: hex(v) for k, v in funcs.items()})
assert all(funcs.values()) and _cudriver.load_error() is None
dc = b.direct_calls()  # the backend's direct calls: the compiled hot paths take them
ep = _cudriver.entry_points()
assert dc.entry_points == ep and dc.raw == (ep["cuEventRecord"], ep["cuStreamWaitEvent"], ep["cuLaunchKernel"])
b.init_device(0)
b.set_current(0)
dev = ctypes.c_int(-1)
status = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(ep["cuCtxGetDevice"])(ctypes.byref(dev))
assert (status, dev.value) == (0, 0), (status, dev.value)
# an array written on one stream and read on another (tracking orders them)
from ignis.memory.resource import driver_calls
d = ig.Device(0)
s1, s2 = d.create_stream(), d.create_stream()
before = driver_calls()
a = ig.full(1 << 20, 3.0, stream=s1)
host = a.to_numpy(stream=s2)
after = driver_calls()
assert float(host.sum()) == 3.0 * (1 << 20), float(host.sum())
a.free()
d.synchronize()
s1.close(); s2.close()
print("an array written on one stream, read on another: OK; direct driver calls:",
      {k: after[k] - before[k] for k in after})
PY

echo "== the backend tests against the installed wheel"
cp -r "$repo/tests" "$work/tests"
cp "$repo/pyproject.toml" "$work/pyproject.toml"   # pytest's settings (tests/ on sys.path for helpers)
timeout -k 15 "${IGNIS_RUN_TIMEOUT:-480}" "$py" -X faulthandler -m pytest tests/test_cuda_backend.py tests/test_cudriver.py \
    -q -p no:cacheprovider --timeout="${IGNIS_TEST_TIMEOUT:-180}" --timeout-method=thread \
    --junitxml="$out_dir/gpu_wheel_check.junit.xml"
status=$?
echo "== pytest exit status $status (tests run from $work against $target)"
exit "$status"
