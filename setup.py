"""Build hook for Ignis's compiled modules; everything else is in pyproject.toml.

The hot path (streams, the kernel launch, blocks, the cross-stream tracking record,
the pool, the array layer's ``launch``, the debug guard's allocate and free and
its PyTorch allocator entry points, NvArray) is written once, in Cython (``.pyx`` with
typed fields in ``.pxd``), and compiled; there is no pure-Python copy of it.
The array type (``NvArray``: its creation, free and tracked use) is compiled the same
way. For a source checkout: ``python3 setup.py build_ext --inplace``."""

import glob
import os
import re
import sys
import sysconfig

import Cython
from Cython.Build import cythonize
from setuptools import Extension, setup

# Cython 3.3.0 built the plain-Python modules below (PURE_PYTHON_MODULES) into code that
# crashed under Python 3.12 on the GPU machine; the same tree built by 3.3.1 passed.
_cy = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", Cython.__version__)
if not _cy or tuple(int(x or 0) for x in _cy.groups()) < (3, 3, 1):
    sys.exit(f"ignis needs Cython >= 3.3.1 to build (found {Cython.__version__}): pip install 'Cython>=3.3.1'")

# Modules compiled from .pyx (one extension each), by dotted name.
CYTHON_MODULES = [
    "ignis.runtime.stream",
    "ignis.runtime.kernel",
    "ignis.memory.block",
    "ignis.memory.resource",
    "ignis.memory.pool",
    "ignis.array.nvarray",
    "ignis.array.launch",
    "ignis.memory.guard_base",
    "ignis.safety.frames",
    "ignis.torch._guard_fast",
]

DIRECTIVES = {
    "language_level": 3,
    # Annotations document; they do not type (an ``int`` annotation must not turn a
    # clear ValueError for a float into Cython's TypeError). Types come from cdef.
    "annotation_typing": False,
    "embedsignature": True,
    "binding": True,
}

# Modules written as plain Python and compiled as they are (Cython's pure-Python mode,
# typed where it pays by an augmenting .pxd beside them): the sanitizer's checking of an
# access and the PyTorch front end's per-op step. The .py is the one source; the
# extension built from it is what ``import`` loads.
PURE_PYTHON_MODULES = [
    "ignis.safety.sanitizer",
    "ignis.torch._frontend",
]

extensions = [Extension(name, ["src/" + name.replace(".", "/") + ".pyx"]) for name in CYTHON_MODULES]
extensions += [Extension(name, ["src/" + name.replace(".", "/") + ".py"]) for name in PURE_PYTHON_MODULES]


# -- the CUDA driver entry points of the hot paths (ignis.backends._cudriver) -------------------
# Compiled against cuda-bindings' C-level driver API (``cuda/bindings/cydriver.pxd``) and the
# CUDA headers it declares from (``cuda.h``), so built only where both are found; elsewhere
# skipped with one line saying why. The emulated backend needs nothing of it; the cuda backend
# refuses to start without it, saying how to rebuild. C++: newer cydriver.pxd files include
# <type_traits>. Optional: a cuda.h too old for the cydriver.pxd found (one that lacks a type it
# names) fails this module's compile only, with setuptools' warning saying so.

def _cydriver_pxd() -> tuple[str | None, str]:
    """The directory of cuda-bindings' cydriver.pxd and cuda-bindings' version, or None and why not."""
    import importlib.metadata
    import importlib.util
    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, "cuda-bindings is not installed in the build environment"
    for d in spec.submodule_search_locations:
        if os.path.isfile(os.path.join(d, "cydriver.pxd")):
            try:
                return d, importlib.metadata.version("cuda-bindings")
            except importlib.metadata.PackageNotFoundError:
                return d, "?"
    return None, "cuda-bindings has no cydriver.pxd (it is older than 12 or its Cython declarations are missing)"


def _cuda_version(header: str) -> int:
    """CUDA_VERSION of ``header`` (13000 for 13.0; 0 when unreadable)."""
    try:
        with open(header, encoding="utf-8", errors="replace") as f:
            m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", f.read(), re.M)
    except OSError:
        return 0
    return int(m.group(1)) if m else 0


def _cuda_includes() -> list[str]:
    """Directories holding cuda.h: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then pip's CUDA
    wheels (site-packages nvidia/*/include, e.g. nvidia/cu13/include)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    dirs = [os.path.join(r, "include") for r in roots if r]
    for entry in [*sys.path, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs += sorted(os.path.dirname(h) for h in glob.glob(os.path.join(entry, "nvidia", "*", "include", "cuda.h")))
    found: list[str] = []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in found and os.path.isfile(os.path.join(d, "cuda.h")):
            found.append(d)
    return found


def _cudriver_modules() -> list[Extension]:
    """The module, cythonized (an empty list where it is skipped)."""
    name = "ignis.backends._cudriver"
    skip = f"ignis: not building {name} (the cuda backend's driver entry points): "
    pxd, version = _cydriver_pxd()
    if pxd is None:
        print(skip + version + "; install cuda-bindings and the CUDA headers, then rebuild")
        return []
    found = _cuda_includes()
    if not found:
        print(skip + "cuda.h not found in $CUDA_HOME/include, $CUDA_PATH/include, /usr/local/cuda/include or "
              "site-packages nvidia/*/include; install the CUDA toolkit's headers (or pip's nvidia-cuda-runtime "
              "wheel) or set CUDA_HOME, then rebuild")
        return []
    # cydriver.pxd names the types of its own CUDA release: prefer a cuda.h at least that new.
    major_minor = re.match(r"(\d+)\.(\d+)", version)
    want = int(major_minor.group(1)) * 1000 + int(major_minor.group(2)) * 10 if major_minor else 0
    include = next((d for d in found if _cuda_version(os.path.join(d, "cuda.h")) >= want), found[0])
    have = _cuda_version(os.path.join(include, "cuda.h"))
    if have < want:
        print(f"ignis: {name}: {include}/cuda.h is CUDA {have // 1000}.{have % 1000 // 10}, older than "
              f"cuda-bindings {version}; if its compile fails, install headers of CUDA >= "
              f"{want // 1000}.{want % 1000 // 10} (or a cuda-bindings as old as the headers) and rebuild")
    ext = Extension(name, ["src/" + name.replace(".", "/") + ".pyx"], include_dirs=[include], language="c++")
    # A build directory per cuda-bindings version: the C++ made from one cydriver.pxd is never
    # taken as up to date for another (cythonize compares times, not contents).
    modules = cythonize([ext], compiler_directives=DIRECTIVES, include_path=["src"],
                        build_dir=f"build/cython/cuda-bindings-{re.sub(r'[^0-9A-Za-z.]', '_', version)}", quiet=True)
    for m in modules:
        m.optional = True  # set here: cythonize does not carry it over
    return modules


CUDRIVER_MODULES = _cudriver_modules()

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES, include_path=["src"], build_dir="build/cython", quiet=True)
      + CUDRIVER_MODULES)
