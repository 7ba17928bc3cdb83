"""Build hook for the optional C fast path (``ignis._speedups``); everything else
is in pyproject.toml. Without a C compiler the build skips it and the package
runs in pure Python. For a source checkout: ``python3 setup.py build_ext --inplace``."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ignis._speedups", ["src/ignis/_speedups.c"], optional=True)])
