#!/usr/bin/env bash
# Build Ignis's compiled modules in place, from a tree's root, on the GPU machine:
#   bash scripts/gpu_build.sh [build_ext options, e.g. -j 16]   (the other gpu_*.sh scripts call it)
# setup.py needs Cython >= 3.3.1: the GPU machine's Cython 3.3.0 built the plain-Python
# modules (setup.py's PURE_PYTHON_MODULES) into code that crashed under Python 3.12 (the
# same tree built by 3.3.1 passed). Where this machine's Cython is older, a Cython wheel
# carried in the repository root's .whl/ (ignored by git: pass it in the device call's
# carry) is installed aside, in /tmp/ignis-cython, and used for this build only.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cython_ok() {
    python3 - <<'PY'
import re, sys
try:
    import Cython
except ImportError:
    sys.exit(1)
m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?$", Cython.__version__)
sys.exit(0 if m and tuple(int(x or 0) for x in m.groups()) >= (3, 3, 1) else 1)
PY
}
if ! cython_ok; then
    whl=$(ls "$root"/.whl/[cC]ython-*.whl 2>/dev/null | head -1)
    if [ -n "$whl" ]; then
        python3 -m pip install -q --no-deps --target /tmp/ignis-cython "$whl" 2>&1 | grep -v "root" || true
        export PYTHONPATH="/tmp/ignis-cython${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu_build.sh: this machine's Cython is older than 3.3.1 and no Cython wheel is in .whl/" >&2
    fi
fi
python3 -c "import Cython; print('building with Cython', Cython.__version__)"
python3 setup.py -q build_ext --inplace "$@"
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
