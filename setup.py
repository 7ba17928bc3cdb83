"""Build hook for Ignis's compiled modules; everything else is in pyproject.toml.

The hot path (streams, the kernel launch, blocks, the cross-stream tracking record,
the pool, the array layer's ``launch``, the debug guard's allocate and free and
its PyTorch allocator entry points, NvArray) is written once, in Cython (``.pyx`` with
typed fields in ``.pxd``), and compiled; there is no pure-Python copy of it.
The array type (``NvArray``: its creation, free and tracked use) is compiled the same
way. For a source checkout: ``python3 setup.py build_ext --inplace``."""

import re
import sys

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
    "ignis.backends.direct",
    "ignis.runtime.stream",
    "ignis.runtime.kernel",
    "ignis.memory.hooks",
    "ignis.memory.block",
    "ignis.memory.resource",
    "ignis.memory.pool",
    "ignis.array.nvarray",
    "ignis.array.launch",
    "ignis.memory.guard_base",
    "ignis.safety.frames",
    "ignis.safety.records",
    "ignis.memory.guard_alloc",
    "ignis.torch._guard_fast",
    "ignis.backends._cudriver",
]

# ignis.backends._cudriver (the cuda backend's driver entry points for the hot paths) declares
# the few driver functions it calls in plain C types and takes them from the driver
# (libcuda.so.1) at run time: it needs no CUDA headers and no cuda-bindings to build, and one
# build works with any CUDA 12 or newer driver. It opens the driver with dlopen and loads it
# once under a pthread lock. Built everywhere, like every module here: a failed compile fails
# the build (and so `pip install`), never leaving an installation without it.
LIBRARIES = {"ignis.backends._cudriver": ["dl", "pthread"]} if sys.platform.startswith("linux") else {}

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
# access, the PyTorch front end's per-op step, a collective's enqueue path (checks,
# tracked use, NCCL call, the call matcher's log and thread), and the ownership contract (every
# hold of a tracked-access block tracks its array for the audit). The .py is the one source; the
# extension built from it is what ``import`` loads.
PURE_PYTHON_MODULES = [
    "ignis.safety.sanitizer",
    "ignis.torch._frontend",
    "ignis.collective.communicator",
    "ignis.collective.nccl",
    "ignis.collective.matching",
    "ignis.safety.contract",
]

extensions = [Extension(name, ["src/" + name.replace(".", "/") + ".pyx"], libraries=LIBRARIES.get(name, []))
              for name in CYTHON_MODULES]
extensions += [Extension(name, ["src/" + name.replace(".", "/") + ".py"]) for name in PURE_PYTHON_MODULES]


setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES, include_path=["src"], build_dir="build/cython", quiet=True))
