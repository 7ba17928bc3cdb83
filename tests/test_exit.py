"""Interpreter exit with Ignis memory still held by other libraries: a consumer drops
the tensors it imported through DLPack during the interpreter's final garbage
collection, after Ignis's modules were cleared. The process must exit cleanly: no
crash, no "Error in sys.excepthook", no ignored exceptions."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from helpers import IMPORT_ROOT
from ignis.backends import get_backend

SCRIPT = r"""
import sys
import numpy as np
import ignis as ig

consumer = sys.argv[1]


def imported(x):
    if consumer == "numpy":
        return np.from_dlpack(x)
    if consumer == "torch":
        import torch
        return torch.from_dlpack(x)
    import cupy
    return cupy.from_dlpack(x)


KEEP = imported(ig.empty(16, "float32"))  # a module global: dropped when modules are cleared


class Holder:
    pass


h = Holder()
h.self = h  # a reference cycle: only the final collection frees what it holds
h.tensor = imported(ig.zeros(8, "float32"))
h.capsule = ig.empty(4, "float32").__dlpack__()  # never consumed
h.array = ig.empty(32)
h.view = ig.empty((4, 4))[1:3]
print("ready", flush=True)
"""


def _consumer() -> str:
    backend = get_backend().name
    if backend == "emulated":
        return "numpy"  # the emulator exports CPU tensors
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    pytest.skip("needs PyTorch or CuPy to import device tensors")


def test_exit_with_exported_tensors_still_held():
    consumer = _consumer()
    env = dict(os.environ, IGNIS_BACKEND=get_backend().name)
    env["PYTHONPATH"] = IMPORT_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT, consumer], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0 and "ready" in p.stdout, (p.returncode, p.stderr[-3000:])
    for bad in ("Error in sys.excepthook", "Exception ignored", "Fatal Python error", "Traceback"):
        assert bad not in p.stderr, p.stderr[-3000:]



# What interpreter exit does to a module (in an order that depends on what was imported):
# every global becomes None. An atexit handler registered first runs last, after Ignis's
# own; the streams kept in ``builtins`` die after it, while the interpreter finalizes.
CLEARED = r"""
import atexit
import builtins
import sys

import ignis as ig


def clear_globals():
    d = vars(sys.modules["ignis.runtime.stream"])
    for k in list(d):
        if not k.startswith("__"):
            d[k] = None


atexit.register(clear_globals)
builtins._ignis_late = [ig.Device(0).create_stream(), ig.Device(0).create_stream()]  # still open
print("ready", flush=True)
"""


def _clean_exit(args: list, env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    for bad in ("Error in sys.excepthook", "Exception ignored", "Fatal Python error", "Traceback"):
        assert bad not in p.stderr, p.stderr[-3000:]
    return p


def test_a_stream_that_dies_after_its_module_was_cleared_exits_cleanly():
    """A compiled finalizer runs after its module's globals were cleared when something outside
    Ignis keeps its object to the end: it must test finalization itself (a C call), not through
    ``sys`` (None by then: "Error in sys.excepthook" at the end of a full test run)."""
    env = dict(os.environ, IGNIS_BACKEND=get_backend().name)
    env["PYTHONPATH"] = IMPORT_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = _clean_exit([sys.executable, "-X", "faulthandler", "-c", CLEARED], env)
    assert "ready" in p.stdout


def test_a_pytest_session_ends_with_its_summary_line():
    """The reported case: the model test after another test file, in one pytest process."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    p = _clean_exit([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     os.path.join(here, "test_array.py") + "::test_untracked_resource_only_on_own_stream",
                     os.path.join(here, "test_memory_model.py")], env)
    assert p.stdout.rstrip().splitlines()[-1].startswith("3 passed"), p.stdout[-2000:]
