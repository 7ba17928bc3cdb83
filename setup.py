"""Build hook for Ignis's compiled modules; everything else is in pyproject.toml.

The hot path (streams, the kernel launch, blocks, the cross-stream tracking record,
the pool, the array layer's ``launch``, the debug guard's allocate and free and
its PyTorch allocator entry points, NvArray) is written once, in Cython (``.pyx`` with
typed fields in ``.pxd``), and compiled; there is no pure-Python copy of it.
The array type (``NvArray``: its creation, free and tracked use) is compiled the same
way. For a source checkout: ``python3 setup.py build_ext --inplace``."""

from Cython.Build import cythonize
from setuptools import Extension, setup

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

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES, include_path=["src"], build_dir="build/cython", quiet=True))
