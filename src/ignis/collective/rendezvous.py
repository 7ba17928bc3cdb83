"""Bootstrap and liveness: a small TCP rendezvous hosted by rank 0.

Design:
- Rank 0 listens on ``MASTER_ADDR:MASTER_PORT``; every other rank connects
  (retrying until the time-out: rank 0 may start later) and sends one JSON
  line ``{"t": "join", "rank", "world_size", "blob"}``. When all ranks have
  joined, rank 0 sends every rank the table of blobs (an all-gather of small
  JSON objects: NCCL's unique id travels in rank 0's blob, the loopback
  transport's listening addresses in everybody's).
- The connections stay open afterwards as a liveness channel. Rank 0 reads
  each one; a connection that ends without a ``bye`` line means that rank
  died, and rank 0 tells every other rank (``{"t": "dead", "rank": k}``) and
  itself. A rank whose connection to rank 0 ends without rank 0's ``bye``
  learns that rank 0 died. Each rank's ``on_failure(rank, why)`` is called at
  most once.
- A clean ``close()`` says ``bye`` first, so nobody mistakes it for a death.
  Rank 0 closing ends the liveness service for the others (they are told, and
  carry on; their own transports still see peers that vanish).

Rules:
- Everything received is checked: a rank out of range, a repeated rank, a
  different world size or a rank that never joins fails the rendezvous on
  every rank with a ``CollectiveError`` that names the ranks and the address.
- Under MPI (``mpi4py``), ``MpiRendezvous`` does the same all-gather through
  ``MPI_Allgather`` and leaves liveness to the MPI launcher.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from typing import Any, Callable

from .errors import CollectiveError, CollectiveTimeoutError

__all__ = ["Rendezvous", "MpiRendezvous", "is_loopback"]

_MAX_LINE = 1 << 20


def is_loopback(host: str) -> bool:
    """True if ``host`` (a name or an address) resolves to a loopback address.

    ``"localhost"`` is; ``""`` and names that do not resolve are not.

    Args:
        host: a host name or IP address.
    """
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class _Lines:
    """Newline-delimited JSON over a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""
        self._send_lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            self.sock.sendall(data)

    def recv(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The next message, or None at end of stream. ``socket.timeout`` past ``deadline``."""
        while b"\n" not in self._buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("rendezvous read timed out")
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                return None
            self._buf += chunk
            if len(self._buf) > _MAX_LINE:
                raise CollectiveError("rendezvous message too long (is another program using this port?)",
                                      kind="init")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            msg = json.loads(line)
        except ValueError:
            raise CollectiveError(f"malformed rendezvous message {line[:80]!r} (is another program using this "
                                  "port?)", kind="init") from None
        if not isinstance(msg, dict):
            raise CollectiveError(f"malformed rendezvous message {line[:80]!r}", kind="init")
        return msg

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Rendezvous:
    """The TCP rendezvous of one process group (see the module docstring).

    ``Rendezvous(...)`` binds (rank 0) or connects (others); ``exchange(blob)``
    returns every rank's blob; ``watch(on_failure)`` starts liveness monitoring;
    ``close()`` says goodbye."""

    def __init__(self, addr: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        self.addr, self.port, self.rank, self.world_size, self.timeout = addr, port, rank, world_size, timeout
        self.local_ip = "127.0.0.1"
        self._server: socket.socket | None = None
        self._peers: dict[int, _Lines] = {}     # rank 0: one per other rank
        self._master: _Lines | None = None      # others: the connection to rank 0
        self._said_bye: set[int] = set()
        self._closed = False
        self._on_failure: Callable[[int, str], None] | None = None
        self._lock = threading.Lock()
        if world_size == 1:
            return
        if rank == 0:
            self._listen()
        else:
            self._connect()

    # -- setup -----------------------------------------------------------------
    def _where(self) -> str:
        return f"{self.addr}:{self.port}"

    def _fail(self, detail: str, kind: str = "init", timeout: bool = False) -> CollectiveError:
        cls = CollectiveTimeoutError if timeout else CollectiveError
        return cls(detail, op="init_process_group", this_rank=self.rank, kind=kind)

    def _listen(self) -> None:
        loopback = is_loopback(self.addr)
        host = self.addr if loopback else ""
        try:
            self._server = socket.create_server((host, self.port), backlog=max(16, self.world_size))
        except OSError as e:
            raise self._fail(f"rank 0 cannot listen on {self._where()} ({e.strerror or e}); is MASTER_PORT "
                             "in use by another job? (ignis launch picks a free port)") from None
        if loopback:
            self.local_ip = socket.gethostbyname(self.addr)
        else:
            try:
                self.local_ip = socket.gethostbyname(self.addr)
            except OSError:
                self.local_ip = socket.gethostbyname(socket.gethostname())

    def _connect(self) -> None:
        deadline = time.monotonic() + self.timeout
        delay = 0.02
        last: Exception | None = None
        while True:
            try:
                sock = socket.create_connection((self.addr, self.port),
                                                timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                break
            except OSError as e:
                last = e
            if time.monotonic() + delay > deadline:
                raise self._fail(f"could not reach rank 0's rendezvous at {self._where()} within "
                                 f"{self.timeout:g} s ({last}); is rank 0 running, and are MASTER_ADDR and "
                                 "MASTER_PORT the same on every rank?", timeout=True)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_ip = sock.getsockname()[0]
        self._master = _Lines(sock)

    # -- the all-gather ------------------------------------------------------------
    def exchange(self, blob: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``blob``, in rank order (a collective: every rank calls it once)."""
        if self.world_size == 1:
            return [blob]
        deadline = time.monotonic() + self.timeout
        if self.rank == 0:
            return self._serve_join(blob, deadline)
        assert self._master is not None
        try:
            self._master.send({"t": "join", "rank": self.rank, "world_size": self.world_size, "blob": blob})
            msg = self._master.recv(deadline)
        except socket.timeout:
            raise self._fail(f"rank 0 did not complete the rendezvous at {self._where()} within "
                             f"{self.timeout:g} s (some rank did not join)", timeout=True) from None
        except OSError as e:
            raise self._fail(f"rendezvous with rank 0 at {self._where()} broke: {e}") from None
        if msg is None:
            raise self._fail(f"rank 0 closed the rendezvous at {self._where()} before it completed "
                             "(it died, or it failed the rendezvous)", kind="peer_died")
        if msg.get("t") == "error":
            raise self._fail(str(msg.get("msg")))
        blobs = msg.get("blobs")
        if msg.get("t") != "table" or not isinstance(blobs, list) or len(blobs) != self.world_size:
            raise self._fail(f"unexpected rendezvous answer {str(msg)[:200]} from {self._where()} (is another "
                             "program using this port?)")
        return blobs

    def _serve_join(self, blob: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
        assert self._server is not None
        blobs: list[Any] = [None] * self.world_size
        blobs[0] = blob
        joined: dict[int, _Lines] = {}
        try:
            while len(joined) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in range(1, self.world_size) if r not in joined]
                    raise self._fail(f"rank(s) {missing} did not join the rendezvous at {self._where()} within "
                                     f"{self.timeout:g} s (world size {self.world_size}); did they start, with "
                                     "the same MASTER_ADDR/MASTER_PORT?", timeout=True)
                self._server.settimeout(left)
                try:
                    conn, _ = self._server.accept()
                except socket.timeout:
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                lines = _Lines(conn)
                try:
                    msg = lines.recv(min(deadline, time.monotonic() + 10.0))
                except (socket.timeout, OSError, CollectiveError):
                    lines.close()  # a stray connection; not one of ours
                    continue
                if not msg or msg.get("t") != "join":
                    lines.close()
                    continue
                r, n = msg.get("rank"), msg.get("world_size")
                if n != self.world_size:
                    lines.close()
                    raise self._fail(f"rank {r} says WORLD_SIZE={n} but rank 0 has WORLD_SIZE={self.world_size}; "
                                     "every rank must be started with the same WORLD_SIZE")
                if not isinstance(r, int) or not 0 < r < self.world_size:
                    lines.close()
                    raise self._fail(f"a process joined with RANK={r!r}, outside 1..{self.world_size - 1}")
                if r in joined:
                    lines.close()
                    raise self._fail(f"two processes joined as rank {r}; every rank needs its own RANK")
                joined[r] = lines
                blobs[r] = msg.get("blob")
        except CollectiveError as e:
            for lines in joined.values():
                try:
                    lines.send({"t": "error", "msg": f"rank 0: {e.detail}"})
                except OSError:
                    pass
                lines.close()
            raise
        table = {"t": "table", "blobs": blobs}
        for r, lines in joined.items():
            try:
                lines.send(table)
            except OSError as e:
                raise self._fail(f"rank {r} left during the rendezvous ({e})", kind="peer_died") from None
        self._peers = joined
        return blobs

    # -- liveness --------------------------------------------------------------
    def watch(self, on_failure: Callable[[int, str], None]) -> None:
        """Call ``on_failure(rank, why)`` (once, from a daemon thread) when a rank dies."""
        if self.world_size == 1 or self._on_failure is not None:
            return
        self._on_failure = on_failure
        if self.rank == 0:
            for r, lines in self._peers.items():
                threading.Thread(target=self._read_rank, args=(r, lines), daemon=True,
                                 name=f"ignis-rdzv-rank{r}").start()
        else:
            threading.Thread(target=self._read_master, daemon=True, name="ignis-rdzv-master").start()

    def _report(self, rank: int, why: str) -> None:
        cb = self._on_failure
        if cb is not None and not self._closed:
            cb(rank, why)

    def _read_rank(self, r: int, lines: _Lines) -> None:
        while True:
            try:
                msg = lines.recv()
            except (OSError, CollectiveError):
                msg = None
            if msg is None:
                break
            if msg.get("t") == "bye":
                self._said_bye.add(r)
        if r in self._said_bye or self._closed:
            return
        why = f"rank {r}'s connection to the rendezvous closed without a goodbye: the process died"
        with self._lock:
            others = [(k, o) for k, o in self._peers.items() if k != r]
        for _, other in others:
            try:
                other.send({"t": "dead", "rank": r, "why": why})
            except OSError:
                pass
        self._report(r, why)

    def _read_master(self) -> None:
        assert self._master is not None
        while True:
            try:
                msg = self._master.recv()
            except (OSError, CollectiveError):
                msg = None
            if msg is None:
                self._report(0, "rank 0's rendezvous connection closed without a goodbye: rank 0 died")
                return
            t = msg.get("t")
            if t == "bye":
                return
            if t == "dead":
                r = msg.get("rank")
                self._report(r if isinstance(r, int) else -1, str(msg.get("why", f"rank {r} died")))

    # -- shutdown ------------------------------------------------------------------
    def close(self) -> None:
        """Say goodbye and close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        conns = list(self._peers.values()) + ([self._master] if self._master is not None else [])
        for lines in conns:
            try:
                lines.send({"t": "bye"})
            except OSError:
                pass
            lines.close()
        if self._server is not None:
            self._server.close()


class MpiRendezvous:
    """The same all-gather over MPI (``mpi4py``); liveness is the MPI launcher's job."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm
        self.rank = comm.Get_rank()
        self.world_size = comm.Get_size()
        self.local_ip = socket.gethostbyname(socket.gethostname())

    def exchange(self, blob: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``blob``, in rank order (``allgather``; every rank calls it once).

        Args:
            blob: this rank's JSON-like dict.
        """
        return list(self._comm.allgather(blob))

    def watch(self, on_failure: Callable[[int, str], None]) -> None:
        """Nothing: under MPI, the launcher watches the ranks.

        Args:
            on_failure: ignored.
        """
        return None

    def close(self) -> None:
        """Nothing to close (the MPI communicator is the caller's)."""
        return None
