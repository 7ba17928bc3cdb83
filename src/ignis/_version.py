"""The package version (foundation: imports nothing). ``ignis.__version__`` re-exports it."""

__version__ = "0.1.0"
