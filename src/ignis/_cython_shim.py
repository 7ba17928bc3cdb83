"""What the modules compiled in Cython's pure-Python mode use of Cython at import time,
where Cython is not installed and they run as plain Python: its class decorators, which
then leave the class as it is."""

from __future__ import annotations

from types import SimpleNamespace


def _as_is(cls: type) -> type:
    return cls


cython = SimpleNamespace(no_gc=_as_is, cclass=_as_is, compiled=False)
