"""The op observer (``_observer.cpp``): built against the installed torch at first use, cached.

A C++ extension of PyTorch has to match the torch it runs with (its headers and C++ ABI),
and torch is not a dependency of Ignis: so the observer is not built with the package but
here, the first time the front end wants it, with the C++ compiler torch's own extensions
use (``CXX``, else ``c++``), into ``$IGNIS_CACHE_DIR`` (default ``~/.cache/ignis``), one file
per torch version, Python, source and compile command. Later runs load the cached file. Without a compiler,
or when the build fails, ``observer()`` returns None and ``observer_error()`` says why: the
front end then refuses to start, saying so (both of its engines measure tensors with this
library: the observer's rule is the only one).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import threading

__all__ = ["observer", "observer_error", "observer_path", "compiler", "observer_timing", "TIMER_SLOTS"]

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_observer.cpp")
_lock = threading.Lock()
_lib: ctypes.PyDLL | None = None
_error: str | None = None
_tried = False


def compiler() -> list[str]:
    """The C++ compiler the observer is built with, as a command (``CXX``, else ``c++``)."""
    return shlex.split(os.environ.get("CXX") or "c++")


def _command() -> list[str]:
    """The compile command, less its output file."""
    import torch
    from torch.utils import cpp_extension as ce
    cxx = compiler()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    cmd = cxx + ["-O2", "-DNDEBUG", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
                 f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I" + sysconfig.get_paths()["include"]]
    cmd += ["-I" + d for d in ce.include_paths()]
    cmd += [_SOURCE]
    for d in ce.library_paths():
        cmd += ["-L" + d, "-Wl,-rpath," + d]
    return cmd + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def observer_path() -> str:
    """Where the observer built for this torch, Python, source and compile command is
    (or would be) cached."""
    import torch
    h = hashlib.sha256()
    with open(_SOURCE, "rb") as f:
        h.update(f.read())
    h.update("\0".join(_command()).encode())
    h.update(sysconfig.get_config_var("Py_GIL_DISABLED").__repr__().encode())
    root = os.environ.get("IGNIS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ignis")
    tag = f"torch{torch.__version__}-{sys.implementation.cache_tag}-{h.hexdigest()[:16]}".replace("+", "_")
    return os.path.join(root, "torch_observer", tag, "ignis_torch_observer.so")


def _build(path: str) -> None:
    cmd = _command()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        try:
            r = subprocess.run(cmd + ["-o", tmp], capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{cmd[0]} took over 15 minutes; set CXX to a working C++ compiler") from None
        if r.returncode != 0:
            raise RuntimeError(f"{cmd[0]} exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
        os.replace(tmp, path)  # whole or not at all, also against a concurrent build
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: str) -> ctypes.PyDLL:
    lib = ctypes.PyDLL(path)  # PyDLL: the GIL stays held in its calls (they take Python objects)
    lib.ignis_obs_start.argtypes = [ctypes.py_object] * 4 + [ctypes.c_int]
    lib.ignis_obs_start.restype = ctypes.c_int
    lib.ignis_obs_stop.argtypes = []
    lib.ignis_obs_stop.restype = None
    lib.ignis_obs_set_collective.argtypes = [ctypes.py_object]
    lib.ignis_obs_set_collective.restype = ctypes.c_int
    lib.ignis_obs_host_check.argtypes = [ctypes.c_int]
    lib.ignis_obs_host_check.restype = None
    lib.ignis_obs_synced.argtypes = []
    lib.ignis_obs_synced.restype = None
    lib.ignis_obs_any_global.argtypes = []
    lib.ignis_obs_any_global.restype = ctypes.c_int
    lib.ignis_obs_trace_start.argtypes = [ctypes.py_object, ctypes.py_object]
    lib.ignis_obs_trace_start.restype = ctypes.c_int
    lib.ignis_obs_trace_stop.argtypes = []
    lib.ignis_obs_trace_stop.restype = None
    lib.ignis_obs_trace_active.argtypes = []
    lib.ignis_obs_trace_active.restype = ctypes.c_int
    lib.ignis_obs_trace_fire.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int]
    lib.ignis_obs_trace_fire.restype = ctypes.c_int
    lib.ignis_obs_probe_start.argtypes = [ctypes.c_int]
    lib.ignis_obs_probe_start.restype = ctypes.c_int
    lib.ignis_obs_timing.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
    lib.ignis_obs_timing.restype = ctypes.c_int
    lib.ignis_obs_py_functions.argtypes = []
    lib.ignis_obs_py_functions.restype = ctypes.py_object
    lib.ignis_obs_drainer.argtypes = []
    lib.ignis_obs_drainer.restype = ctypes.py_object
    lib.ignis_obs_held.argtypes = []
    lib.ignis_obs_held.restype = ctypes.c_int
    lib.ignis_obs_checker.argtypes = []
    lib.ignis_obs_checker.restype = ctypes.c_int
    lib.ignis_obs_checker_stop.argtypes = []
    lib.ignis_obs_checker_stop.restype = None
    lib.ignis_obs_window_open.argtypes = [ctypes.py_object, ctypes.c_int, ctypes.py_object]
    lib.ignis_obs_window_open.restype = ctypes.c_int
    lib.ignis_obs_window_close.argtypes = []
    lib.ignis_obs_window_close.restype = None
    lib.ignis_obs_frameless_ops.argtypes = [ctypes.py_object, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int]
    lib.ignis_obs_frameless_ops.restype = ctypes.c_int
    for name in ("ignis_obs_take_cpu_ops", "ignis_obs_take_ops", "ignis_obs_errors", "ignis_obs_trace_take_events",
                 "ignis_obs_probe_stop", "ignis_obs_c_held"):
        fn = getattr(lib, name)
        fn.argtypes = []
        fn.restype = ctypes.c_ulonglong
    return lib


def observer() -> ctypes.PyDLL | None:
    """The loaded observer, built first if this torch has none cached; None (and
    ``observer_error()`` says why) if it cannot be built or loaded here."""
    global _lib, _error, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        try:
            path = observer_path()
            if os.path.exists(path):
                try:
                    _lib = _load(path)
                    return _lib
                except (OSError, AttributeError):  # a damaged or stale file in the cache: built again below
                    os.unlink(path)
            import torch
            print(f"ignis.torch: building the op observer for torch {torch.__version__} "
                  f"(once; cached in {os.path.dirname(path)})", file=sys.stderr)
            _build(path)
            _lib = _load(path)
        except Exception as e:  # no compiler, no headers, a torch without them: said at enable
            _error = f"{type(e).__name__}: {e}"
            _lib = None
        return _lib


# The observer's diagnostic timers, in the order of its TimerSlot.
TIMER_SLOTS = ("start", "end", "gil", "capture", "sanitizer", "trace")


def observer_timing(on: bool) -> dict[str, tuple[int, int]]:
    """A diagnostic: turn the op observer's timers on (``on``) or off, and take what they
    measured since the last call, restarting them: per slot, (ns, spans). ``start`` / ``end``:
    PyTorch's RecordFunction callbacks (every call, nested ones that return at once included);
    ``gil``: the GIL's taking in them; ``capture`` / ``sanitizer``: the user's stack and the
    sanitizer's call per checked op; ``trace``: the GPU trace events handled (frees among them),
    the GIL's taking included. RuntimeError where the observer cannot be built."""
    lib = observer()
    if lib is None:
        raise RuntimeError(f"ignis.torch: the op observer cannot be built here ({observer_error()})")
    out = (ctypes.c_ulonglong * (2 * len(TIMER_SLOTS)))()
    lib.ignis_obs_timing(1 if on else 0, out, len(TIMER_SLOTS))
    return {k: (out[2 * i], out[2 * i + 1]) for i, k in enumerate(TIMER_SLOTS)}


def observer_error() -> str | None:
    """Why ``observer()`` returned None (None if it did not, or was not tried yet)."""
    return _error
