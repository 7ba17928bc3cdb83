#!/usr/bin/env bash
# Build Ignis's compiled modules in place, from a tree's root, on the GPU machine:
#   bash scripts/gpu_build.sh [build_ext options, e.g. -j 16]   (the other gpu_*.sh scripts call it)
# The build needs Cython >= 3.3.1 and setuptools >= 77 (pyproject.toml's build-system): the GPU
# machine's Cython 3.3.0 built the plain-Python modules (setup.py's PURE_PYTHON_MODULES) into code
# that crashed under Python 3.12 (the same tree built by 3.3.1 passed), and a setuptools older
# than 77 refuses pyproject.toml (`project.license` is an SPDX string). Where this machine's is
# older, the wheel of it carried in the repository root's .whl/ (ignored by git: pass it in the
# device call's carry) is installed aside, in /tmp/ignis-build-tools, and used for this build only.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/gpu_build_tools.sh
source "$root/scripts/gpu_build_tools.sh"
python3 -c "import Cython, setuptools; print('building with Cython', Cython.__version__, 'and setuptools', setuptools.__version__)"
python3 setup.py -q build_ext --inplace "$@" || exit 1
# The PyTorch front end's op observer (built against this machine's torch, cached): once
# here, so that tests running in parallel do not each build it.
PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" python3 - <<'PY'
try:
    import torch  # noqa: F401
except ImportError:
    raise SystemExit(0)
from ignis.torch._native import observer, observer_error
print("op observer:", "ready" if observer() is not None else f"not built: {observer_error()}")
PY
