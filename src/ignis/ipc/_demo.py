"""The IPC demo (``ig.ipc.demo``).

This process is the producer: it fills an array in a ``VmmResource`` and
sends it over a Unix socket pair to a consumer process (started with the
``spawn`` method, on the same backend). The consumer maps it zero-copy,
checks every element, writes a marker into the first elements, finishes its
write and answers; the producer then sees the marker in its own array (same
memory, both ways). Each step prints one line.

Rules: a failed check or an Ignis error becomes one "FAILED: ..." line and
exit status 1; the consumer is always reaped, and everything made is freed.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import sys
import time
from typing import IO, Any, Callable

import numpy as np

from ..array import empty
from ..backends import get_backend, set_backend
from ..errors import IgnisError
from ..memory import VmmResource
from ..runtime import Device
from ..units import format_bytes
from .share import close, finish
from .transport import recv, send

__all__ = ["run"]

MARKER = -7.0
MARKED = 1024          # elements the consumer overwrites


class _Failed(Exception):
    pass


def _line(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise _Failed("the consumer hung up without answering")
        buf += chunk
    return json.loads(buf)


def _consumer(sock: socket.socket, backend: str, n: int) -> None:
    """The consumer process: map, check, write back, answer, then unmap."""
    if get_backend().name != backend:
        set_backend(backend)
    try:
        t0 = time.perf_counter()
        b = recv(sock)
        opened_ms = (time.perf_counter() - t0) * 1000
        host = b.to_numpy()
        wrong = int(np.count_nonzero(host != np.arange(n, dtype=np.float32)))
        b[:MARKED].fill_(MARKER)
        finish(b)
        sock.sendall(json.dumps({"wrong": wrong, "opened_ms": opened_ms, "ptr": b.device_ptr}).encode() + b"\n")
        _line(sock)  # the producer has looked; now unmap
        close(b)
        sock.sendall(b'{"closed": true}\n')
    except Exception as e:  # reported to the producer, which prints it
        sock.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode() + b"\n")
    finally:
        sock.close()


def run(out: "IO[str] | None" = None, *, nbytes: int = 16 << 20, timeout: float = 120.0) -> int:
    """Run the demo, printing to ``out`` (default stdout). Returns 0 on success, 1 on failure."""
    out = sys.stdout if out is None else out

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        _run(say, nbytes, timeout)
    except _Failed as e:
        say(f"FAILED: {e}")
        return 1
    except (IgnisError, ValueError, OSError, MemoryError, EOFError) as e:
        say(f"FAILED: {type(e).__name__}: {e}")
        return 1
    say("ipc demo passed: the consumer read the producer's array zero-copy, and the producer saw its write")
    return 0


def _run(say: Callable[[str], None], nbytes: int, timeout: float) -> None:
    dev = Device(0)
    backend = dev.backend.name
    caps = dev.capabilities
    if not (caps.get("vmm") and caps.get("posix_fd_ipc")):
        say(f"ipc demo skipped: device 0 ({dev.name}) lacks VMM or POSIX fd handles")
        return
    n = nbytes // 4
    mr = VmmResource(dev)
    a = empty((n,), "float32", mr=mr, tag="ipc-demo")
    proc = None
    ours, theirs = socket.socketpair()
    try:
        a.from_host(np.arange(n, dtype=np.float32))
        say(f"ipc demo on device 0 ({dev.name}, {backend} backend)")
        say(f" 1. producer (pid {multiprocessing.current_process().pid}): {format_bytes(nbytes)} float32 in a "
            f"VmmResource (granularity {format_bytes(mr.granularity)}), filled with 0, 1, 2, ...")
        ctx = multiprocessing.get_context("spawn")  # never fork a process that has driver threads
        proc = ctx.Process(target=_consumer, args=(theirs, backend, n), daemon=True)
        proc.start()
        theirs.close()
        ours.settimeout(timeout)
        say(f" 2. started the consumer (pid {proc.pid}) with the spawn method")
        t0 = time.perf_counter()
        desc = send(ours, a)
        send_ms = (time.perf_counter() - t0) * 1000
        say(f" 3. exported the block (generation {desc.generation}) and sent its fd over the socket with "
            f"SCM_RIGHTS in {send_ms:.2f} ms")
        reply = _line(ours)
        if "error" in reply:
            raise _Failed(f"consumer: {reply['error']}")
        if reply["wrong"]:
            raise _Failed(f"the consumer read {reply['wrong']} of {n} elements different from the producer's")
        say(f" 4. consumer mapped it in {reply['opened_ms']:.2f} ms at {reply['ptr']:#x} and checked all {n} "
            f"elements; it wrote {MARKER} into the first {MARKED}")
        head = a[:MARKED].to_numpy()
        if not np.all(head == MARKER):
            raise _Failed("the producer does not see the consumer's write: the memory is not shared")
        say(f" 5. producer reads {MARKER} in its own array: the same memory, both ways, no copy")
        ours.sendall(b'{"looked": true}\n')
        if "error" in (reply := _line(ours)):
            raise _Failed(f"consumer: {reply['error']}")
        a.free()
        say(" 6. consumer unmapped its view; producer freed the array")
    finally:
        ours.close()
        theirs.close()
        if proc is not None:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if not a.freed:
            a.free()
