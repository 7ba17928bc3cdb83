# Sourced by the GPU scripts that build Ignis (gpu_build.sh, gpu_wheel_check.sh --build-here):
# makes python3 find Cython >= 3.3.1 and setuptools >= 77. Where this machine's are older, the
# wheels carried in the repository root's .whl/ ([cC]ython-*.whl, setuptools-*.whl; ignored by
# git: pass .whl in the device call's carry) are installed aside, in /tmp/ignis-build-tools, which
# goes first on PYTHONPATH (pip's build steps inherit it). Says what it used; returns 1 where a
# tool stays too old.
_ignis_tool_ok() {  # $1: distribution name, $2: minimum version (e.g. 3.3.1)
    python3 - "$1" "$2" <<'PY'
import importlib.metadata as md, re, sys
try:
    have = tuple(int(x) for x in re.findall(r"\d+", md.version(sys.argv[1]))[:3])
except md.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if have >= tuple(int(x) for x in sys.argv[2].split(".")) else 1)
PY
}
_ignis_build_tools() {
    local root="$1" status=0 whl
    for spec in "Cython:3.3.1:[cC]ython" "setuptools:77:setuptools"; do
        local name="${spec%%:*}" rest="${spec#*:}"
        local want="${rest%%:*}" pattern="${rest#*:}"
        _ignis_tool_ok "$name" "$want" && continue
        whl=$(ls "$root"/.whl/$pattern-*.whl 2>/dev/null | head -1)
        if [ -n "$whl" ]; then
            python3 -m pip install -q --no-deps --no-index --target /tmp/ignis-build-tools "$whl" 2>&1 | grep -v "root" || true
            case ":${PYTHONPATH:-}:" in *:/tmp/ignis-build-tools:*) ;;
                *) export PYTHONPATH="/tmp/ignis-build-tools${PYTHONPATH:+:$PYTHONPATH}" ;; esac
        fi
        if ! _ignis_tool_ok "$name" "$want"; then
            echo "gpu_build_tools.sh: this machine's $name is older than ${want} and no $name wheel is in .whl/;" \
                "on the development host: pip download '$name>=$want' --no-deps --only-binary=:all:" \
                "--python-version 3.12 --platform manylinux2014_x86_64 -d .whl (then carry .whl)" >&2
            status=1
        fi
    done
    return $status
}
_ignis_build_tools "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
