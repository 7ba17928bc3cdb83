"""``ignis launch -n N script.py [args]``: N local processes, one per device.

Design and rules:
- Each process gets ``RANK`` = ``LOCAL_RANK`` = its index, ``WORLD_SIZE`` =
  ``LOCAL_WORLD_SIZE`` = N, ``MASTER_ADDR`` (default 127.0.0.1) and
  ``MASTER_PORT`` (default: a free port), as ``torchrun`` sets them;
  ``init_process_group()`` reads them, and rank ``r`` works on Ignis device
  ``r``. ``IGNIS_EMULATED_DEVICES`` is raised to at least N, so the
  emulated backend has a device for every rank.
- ``script`` and ``args`` follow the interpreter (``sys.executable -u``), so
  ``launch(2, "-m", ["pkg.mod"])`` runs a module.
- Output: every line a rank prints (stdout and stderr) is forwarded to this
  process's stdout prefixed ``[rank R]``, as it comes.
- When a rank fails, the others get ``grace`` seconds to finish (and to
  report the failure themselves, which their collectives do within their
  time-out); then they are terminated (SIGTERM, then SIGKILL). The exit
  status is 0 when every rank exited 0, else the first failing rank's status
  (128 + signal number for a rank killed by a signal).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence

__all__ = ["launch", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _forward(rank: int, pipe: IO[bytes], out: IO[str], lock: threading.Lock) -> None:
    prefix = f"[rank {rank}] "
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()
    pipe.close()


def _status(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(n: int, script: str, args: Sequence[str] = (), *, master_addr: str = "127.0.0.1",
           master_port: int | None = None, env: Mapping[str, str] | None = None, grace: float = 30.0,
           out: IO[str] | None = None) -> int:
    """Run ``script`` in ``n`` local processes forming one process group; return the exit status.

    Args:
        n: number of ranks (processes).
        script: the Python file to run (or an interpreter option such as "-m" or "-c").
        args: arguments that follow ``script``.
        master_addr, master_port: rank 0's rendezvous address (default: loopback, a free port).
        env: extra environment variables for every rank.
        grace: seconds the other ranks get after one fails, before they are terminated.
        out: where rank output goes (default ``sys.stdout``).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"launch needs a positive number of processes, got {n!r}")
    out = sys.stdout if out is None else out
    port = free_port(master_addr) if master_port is None else master_port
    base = dict(os.environ)
    if env:
        base.update(env)
    try:
        emu = int(base.get("IGNIS_EMULATED_DEVICES", "") or 0)
    except ValueError:
        emu = 0
    base["IGNIS_EMULATED_DEVICES"] = str(max(emu, n, 2))
    base.update({"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": master_addr,
                 "MASTER_PORT": str(port)})
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    try:
        for rank in range(n):
            penv = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            p = subprocess.Popen([sys.executable, "-u", script, *args], env=penv, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            procs.append(p)
            t = threading.Thread(target=_forward, args=(rank, p.stdout, out, lock), daemon=True)
            t.start()
            readers.append(t)
        first_fail: tuple[int, int] | None = None
        fail_time = 0.0
        while True:
            codes = [p.poll() for p in procs]
            if first_fail is None:
                for rank, rc in enumerate(codes):
                    if rc is not None and rc != 0:
                        first_fail, fail_time = (rank, rc), time.monotonic()
                        break
            if all(rc is not None for rc in codes):
                break
            if first_fail is not None and time.monotonic() - fail_time > grace:
                with lock:
                    out.write(f"ignis launch: rank {first_fail[0]} failed; stopping the ranks still running "
                              f"after {grace:g} s\n")
                _stop(procs)
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        _stop(procs)
        raise
    finally:
        if any(p.poll() is None for p in procs):
            _stop(procs)
        for t in readers:
            t.join(5.0)
    codes = [p.returncode for p in procs]
    failed = [(r, rc) for r, rc in enumerate(codes) if rc != 0]
    if not failed:
        return 0
    if first_fail is None:
        first_fail = failed[0]
    summary = ", ".join(f"rank {r}: {'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)}" for r, rc in failed)
    with lock:
        out.write(f"ignis launch: {len(failed)} of {n} rank(s) failed ({summary})\n")
        out.flush()
    return _status(first_fail[1])
