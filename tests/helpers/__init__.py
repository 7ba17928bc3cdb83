"""Helpers shared by the tests: byte-level device I/O through the backend protocol.

Host buffers are pinned: a copy to or from pageable memory is synchronous on
CUDA (the driver stages it), which would hide the ordering the tests check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import ignis as ig
from ignis.memory import PinnedBuffer, PinnedHostResource

# Where the ignis these tests import lives (the source tree built in place, or the installed
# package): what a child process puts first on PYTHONPATH to import the same ignis. The
# source tree of a fresh clone installed with pip has no compiled modules.
IMPORT_ROOT = str(Path(ig.__file__).resolve().parents[1])

_pools: dict[int, PinnedHostResource] = {}


def _pool() -> PinnedHostResource:
    b = ig.get_backend()
    if id(b) not in _pools:
        _pools[id(b)] = PinnedHostResource(b)
    return _pools[id(b)]


def pinned(nbytes: int, fill: int = 0) -> np.ndarray:
    """A pinned uint8 array of ``nbytes`` (kept alive by the returned array)."""
    buf = _pool().allocate(nbytes)
    arr = buf.array
    arr[:] = fill
    _keep[id(arr)] = buf
    return arr


_keep: dict[int, PinnedBuffer] = {}


def write(ptr: int, data: bytes | np.ndarray, stream: "ig.Stream") -> np.ndarray:
    """Queue a host->device copy of ``data`` to ``ptr`` on ``stream``. Returns the
    pinned host buffer, which must stay alive until the stream has passed the copy."""
    src = np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    host = pinned(src.nbytes)
    host[:] = src
    stream.device.backend.memcpy_htod_async(ptr, host.ctypes.data, host.nbytes, stream.handle)
    return host


def read_into(out: np.ndarray, ptr: int, stream: "ig.Stream") -> None:
    """Queue a device->host copy of ``out.nbytes`` bytes from ``ptr`` into ``out``
    (make ``out`` with ``pinned()`` for a truly asynchronous copy)."""
    stream.device.backend.memcpy_dtoh_async(out.ctypes.data, ptr, out.nbytes, stream.handle)


def read(ptr: int, nbytes: int, stream: "ig.Stream") -> bytes:
    """Copy ``nbytes`` from ``ptr`` to the host on ``stream`` and wait for it."""
    out = pinned(nbytes)
    read_into(out, ptr, stream)
    stream.synchronize()
    return out.tobytes()


def sleep_on(stream: "ig.Stream", seconds: float) -> None:
    """Hold ``stream`` for ``seconds`` (a host function that sleeps). On CUDA, host
    functions of all streams run on one driver thread, so this delays other
    streams' host functions too (not their copies)."""
    stream.launch_host_func(lambda: time.sleep(seconds))


def read_after_slow_write(mr: "ig.DeviceMemoryResource", blk: "ig.DeviceBlock", a: "ig.Stream",
                          b: "ig.Stream") -> tuple[np.ndarray, np.ndarray]:
    """A slow write of 0x07 bytes to ``blk`` (4096 bytes) on stream ``a``, then a tracked
    read of it on stream ``b``, waited for. Returns (what ``b`` read, the write's source,
    to keep alive until ``a`` has passed it); all sevens when tracking ordered the read."""
    sleep_on(a, 0.2)
    keep = write(blk.ptr, b"\x07" * 4096, a)
    mr.finish_block_use(blk, a, ig.Access.WRITE)
    mr.prepare_block_use(blk, b, ig.Access.READ)
    out = pinned(4096)
    read_into(out, blk.ptr, b)
    mr.finish_block_use(blk, b, ig.Access.READ)
    b.synchronize()
    return out, keep


def python_calls(fn) -> int:
    """Python functions called by ``fn`` (not counting ``fn`` itself)."""
    calls = -1

    def prof(frame, event, arg):
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


@contextmanager
def current_resource(mr, dev=None):
    """``mr`` as the device's current resource for the block; then what was there (a
    default stays a default, so it is still remade after a context rebuild)."""
    from ignis.memory import current
    dev = ig.Device(0) if dev is None else dev
    was_explicit = (id(dev.backend), dev.ordinal) in current._explicit
    prev = ig.set_current_resource(mr, dev)
    try:
        yield mr
    finally:
        ig.set_current_resource(prev if was_explicit else None, dev)


def run_threads(target, n: int, timeout: float) -> None:
    """Run ``target(i)`` for i in range(n), each on its own thread, and wait for them
    (at most ``timeout`` seconds each)."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


_zoo_log_lock = threading.Lock()


def run_logged(cmd: list[str], title: str, *, env: dict, cwd: str, timeout: float = 400) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd)`` with its output captured; with ``IGNIS_ZOO_LOG=FILE`` set, the
    output is appended there under ``title`` (the zoo runs of the GPU test files, several at a
    time: one lock)."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    log = os.environ.get("IGNIS_ZOO_LOG")
    if log:
        with _zoo_log_lock, open(log, "a") as f:
            f.write(f"\n\n######## $ {title} -> exit {p.returncode} ({time.perf_counter() - t:.1f} s)\n"
                    f"{p.stdout}\n{p.stderr}")
    return p


def run_zoo_program(zoo: str, program: str, *flags: str, engine: str = "observer",
                    timeout: float = 400) -> subprocess.CompletedProcess:
    """Run ``program`` of the zoo directory ``zoo`` on the GPU, plain (no ``flags``) or under
    ``ignis run *flags``, with the PyTorch front end's ``engine``; its own directory on the path
    (``run_logged``: its output logged where ``IGNIS_ZOO_LOG`` says)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([IMPORT_ROOT, zoo, os.environ.get("PYTHONPATH", "")]),
               IGNIS_BACKEND="cuda", IGNIS_TORCH_ENGINE=engine)
    cmd = [sys.executable] + (["-m", "ignis", "run", *flags] if flags else []) + [os.path.join(zoo, program)]
    return run_logged(cmd, f"IGNIS_TORCH_ENGINE={engine} ignis run {' '.join(flags)} {program}", env=env, cwd=zoo,
                      timeout=timeout)


def zoo_result(p: subprocess.CompletedProcess) -> list[float]:
    """The numbers a zoo program printed on its ``ZOO result`` line."""
    m = re.search(r"ZOO result (.*)", p.stdout)
    assert m, p.stdout[-2000:] + p.stderr[-4000:]
    return [float(v) for v in m.group(1).split()]
