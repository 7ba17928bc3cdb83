"""Is an exported block still live? A tiny per-process exporter service.

Design:
- Every export registers its block (weakly) under its generation in this
  process's registry, and names this process's liveness service in the
  descriptor: an abstract-namespace Unix socket ``ignis-ipc/<pid>/<random>``
  served by one daemon thread, started on the first export (and again in a
  forked child, whose pid differs).
- An importer asks with 9 bytes (``b"Q"`` + the generation, little-endian
  u64) and gets one byte: ``b"L"`` (live) or ``b"F"`` (freed, or never
  exported here). It first checks with SO_PEERCRED that the service belongs
  to the pid the descriptor names; otherwise it does not ask. It keeps the
  connection for later queries (one thread serves it on the exporter's
  side), so a query costs one round trip, not a connect and a thread start.
- ``query`` returns True / False, or None when nobody can answer: the
  exporter exited (its socket is gone), a timeout, or no service named.

What this cannot detect (documented in ``ig.ipc``): a free that happens
after the answer (the answer is a snapshot, not a lease); and, once the
exporter has exited, whether it freed the block first. In both cases the
mapping itself stays valid (the driver keeps the physical memory while it is
mapped); only the exporter's intent is unknown.
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
import struct
import threading
import weakref
from typing import TYPE_CHECKING

from ..memory.types import BlockState

if TYPE_CHECKING:
    from ..memory.block import DeviceBlock
    from .handle import IpcDescriptor

__all__ = ["register", "is_live", "query", "peer_credentials"]

_REQUEST = struct.Struct("<cQ")
_registry: dict[int, weakref.ref] = {}
_lock = threading.Lock()
_service: "_Service | None" = None


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected Unix socket."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def is_live(generation: int) -> bool:
    """True while the block exported under ``generation`` by this process is live."""
    ref = _registry.get(generation)
    block = ref() if ref is not None else None
    return block is not None and block.state is BlockState.LIVE and block.generation == generation


def register(block: "DeviceBlock") -> str:
    """Remember ``block`` as exported; returns the liveness service's name."""
    gen = int(block.generation)
    with _lock:
        _registry[gen] = weakref.ref(block, lambda _r, g=gen: _registry.pop(g, None))
        svc = _service
        if svc is None or svc.pid != os.getpid():
            svc = _start()
    return svc.name


def _start() -> "_Service":
    global _service
    _service = _Service()
    atexit.register(_stop_at_exit, _service)
    return _service


def _stop_at_exit(svc: "_Service") -> None:
    """atexit: stop accepting and hang up on importers, so no service thread is still
    running while the interpreter is torn down."""
    if svc.pid != os.getpid():
        return
    try:
        svc.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    svc.sock.close()
    with _conns_lock:
        conns = list(_conns.values())
        _conns.clear()
    for conn, _ in conns:
        try:
            conn.close()
        except OSError:
            pass


class _Service:
    """One listening socket; one daemon thread per connected importer, serving
    its queries until it hangs up (importers keep their connection open)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"ignis-ipc/{self.pid}/{secrets.token_hex(8)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + self.name)
        self.sock.listen(64)
        threading.Thread(target=self._accept, name="ignis-ipc-liveness", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="ignis-ipc-liveness-peer",
                             daemon=True).start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        try:
            while True:
                req = _recv_exact(conn, _REQUEST.size)
                if req is None:
                    return
                op, gen = _REQUEST.unpack(req)
                if op != b"Q":
                    return  # not our protocol: hang up
                conn.sendall(b"L" if is_live(gen) else b"F")
        except OSError:
            pass
        finally:
            conn.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# service name -> (connection, the exporter's pid as SO_PEERCRED gave it), kept open
_conns: dict[str, tuple[socket.socket, int]] = {}
_conns_lock = threading.Lock()


def _connect(name: str, timeout: float) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect("\0" + name)
        return sock, peer_credentials(sock)[0]
    except BaseException:
        sock.close()
        raise


def query(desc: "IpcDescriptor", timeout: float = 1.0) -> bool | None:
    """Ask the exporter whether ``desc``'s block is still live (see the module docstring).
    The connection to each exporter is kept for later queries."""
    if desc.pid == os.getpid():
        return is_live(desc.generation)
    if not desc.service:
        return None
    with _conns_lock:  # queries are short; one at a time keeps each connection in step
        entry = _conns.pop(desc.service, None)
        for kept in (entry is not None, False):  # a kept connection may have died: reconnect once
            try:
                if entry is None:
                    entry = _connect(desc.service, timeout)
                sock, pid = entry
                if pid != desc.pid:
                    sock.close()
                    return None  # not the exporter's service: its answer would prove nothing
                sock.settimeout(timeout)
                sock.sendall(_REQUEST.pack(b"Q", desc.generation))
                answer = sock.recv(1)
            except OSError:  # gone (ECONNREFUSED / ENOENT / EPIPE), or too slow (socket.timeout)
                answer = b""
            if answer in (b"L", b"F"):
                _conns[desc.service] = entry
                return answer == b"L"
            if entry is not None:
                entry[0].close()
                entry = None
            if not kept:
                return None
    return None
