"""The emulated backend's transport: processes on one machine (or a few) over TCP.

Design:
- A full mesh: every pair of ranks shares one TCP connection (the higher
  rank connects to the lower one's listener, whose address came through the
  rendezvous). A reader thread per connection drains it into an inbox keyed
  by (peer, tag), so a send never waits for the receiver to be ready and the
  algorithms below cannot deadlock on socket buffers.
- Frames: ``b"IGC1"``, header length (u32), payload length (u64), a JSON
  header (tag, operation, dtype, count, root, reduction), the payload bytes.
- Operations run on the communicator's stream as host functions (the
  emulator's ``launch_host_func``), over NumPy views of the emulated device
  memory taken when the operation was enqueued: they are stream-ordered like
  NCCL kernels, and tracked uses order other streams after them.
- Algorithms (bandwidth like a ring, deterministic results): all_reduce is a
  direct reduce-scatter then all-gather (rank ``r`` reduces chunk ``r`` in
  rank order 0..n-1 and sends it to everybody); reduce sends to the root;
  broadcast, all_gather and reduce_scatter are direct exchanges. Rooted
  operations (broadcast, reduce) first exchange their headers between all
  ranks (``agree``): without it, ranks that name different roots may each
  act as the root, send, never receive, and keep their own data without an
  error (or all wait as roots until the time-out). Every rank
  reduces in the same order, so results are identical on all ranks. (NCCL
  orders its sums differently: low-precision results can differ in the last
  bit; its avg of floats pre-multiplies by 1/n, this divides the sum.)
- Tags: collective number and phase (``c12.0``) for collectives, a per-pair
  counter (``p3``) for send/recv. Every message says what its sender called,
  so ranks that call different operations, dtypes, counts or roots get a
  ``CollectiveError`` saying so instead of wrong bytes.

Rules:
- A peer whose connection ends (without a goodbye: it died; with one: it
  closed its communicator) fails every operation waiting for it at once; a
  peer that sends nothing for ``timeout`` seconds fails it with
  ``CollectiveTimeoutError``. Both name the peer and the operation. The
  first failure is kept by the communicator (``Health``); later operations
  raise at once.
- A call that fails ends as NCCL's kernels end after ``ncclCommAbort``: its
  host function returns, and the stream, the device and every other array go
  on (nothing of the failure travels along stream waits: the context is fine).
  Before the failure is published, every queued call's target arrays are
  poisoned (``Health``'s first hook): the one that failed, and those queued
  behind it. Work queued on other streams behind a failed call, before the
  failure was known, sees its targets' bytes as they are (as on a GPU); a host
  read of a target itself checks again after its wait and raises.
- The same mesh serves the NCCL engine as a side channel (``checker=True``):
  its call matcher (``matching``) ships call descriptors over it (``post``,
  ``take``, ``wait_news``, ``departed``), and a goodbye says how a rank left.
- The host functions never call the backend (as CUDA requires).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .communicator import poison
from .errors import CollectiveError, CollectiveTimeoutError
from .matching import mismatch_error
from .ops import ReduceOp

if TYPE_CHECKING:
    from ..runtime import Device, Stream
    from .communicator import Health, _Op

__all__ = ["LoopbackEngine"]

_FRAME = struct.Struct("<4sIQ")
_MAGIC = b"IGC1"
_BYE = "bye"
# How long a failed send waits for the reader to finish reading the peer (its goodbye, if any).
_DRAIN_S = 2.0
_EMPTY = np.empty(0, np.uint8)


class _Peer:
    __slots__ = ("rank", "sock", "send_lock", "eof", "bye", "reader")

    def __init__(self, rank: int, sock: socket.socket) -> None:
        self.rank = rank
        self.sock = sock
        self.send_lock = threading.Lock()
        self.eof = False
        self.bye = False
        self.reader: threading.Thread | None = None


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    n = len(view)
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except (ConnectionResetError, BrokenPipeError, OSError):
            return False
        if k == 0:
            return False
        got += k
    return True


class LoopbackEngine:
    """The emulated collective engine of one rank (made by ``process_group``)."""

    name = "emulated"

    poll = None  # no asynchronous errors to ask for: failures surface in the host functions
    issued = 0

    def __init__(self, rank: int, world_size: int, device: "Device", health: "Health", timeout: float, *,
                 checker: bool = False) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.health = health
        self.timeout = timeout
        self._peers: dict[int, _Peer] = {}
        self._inbox: dict[tuple[int, str], tuple[dict, np.ndarray]] = {}
        self._cond = threading.Condition()
        self._listener: socket.socket | None = None
        self._closed = False
        self._news = 0  # messages, goodbyes and ends of connections seen (wait_news)
        self._queued: deque[_HostWork] = deque()  # each enqueued call not finished yet
        health.add_hook(self._wake)
        if not checker:  # the NCCL engine keeps its own queue
            health.add_hook(self._poison_queued, first=True)
            health.oldest = self._oldest

    def _oldest(self) -> str | None:
        try:
            return self._queued[0].label
        except IndexError:
            return None

    def _poison_queued(self, err: CollectiveError) -> None:
        """The first failure: poison what every queued call (running or waiting) was to write."""
        while True:
            try:
                queued = list(self._queued)
                break
            except RuntimeError:  # changed while copied
                continue
        for hw in queued:
            poison(hw.targets, err, self.rank)

    def finished(self, upto: int) -> None:
        """``synchronize()`` saw the stream drain: nothing to do (each call leaves the queue itself)."""

    def confirm(self, timeout: float) -> None:
        """Nothing to confirm: every message of this transport carries its call's header, and the
        receiver compares it before it uses the bytes."""

    # -- bootstrap ---------------------------------------------------------------
    def listen(self, ip: str) -> dict[str, Any]:
        """Open this rank's listener; returns its address for the rendezvous table."""
        if self.world_size == 1:
            return {}
        self._listener = socket.create_server((ip, 0), backlog=max(16, self.world_size))
        host, port = self._listener.getsockname()[:2]
        return {"mesh": [host, port]}

    def connect(self, table: list[dict[str, Any]]) -> None:
        """Connect the mesh: dial every lower rank, accept every higher one."""
        if self.world_size == 1:
            return
        deadline = time.monotonic() + self.timeout
        hello = struct.Struct("<4sI")
        try:
            for r in range(self.rank):
                host, port = table[r]["mesh"]
                sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                sock.sendall(hello.pack(_MAGIC, self.rank))
                self._add(r, sock)
            assert self._listener is not None
            while len(self._peers) < self.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.world_size)) - set(self._peers) - {self.rank})
                    raise CollectiveTimeoutError(f"rank(s) {missing} did not connect to this rank within "
                                                 f"{self.timeout:g} s", op="init_process_group",
                                                 this_rank=self.rank, kind="init")
                self._listener.settimeout(left)
                try:
                    sock, _ = self._listener.accept()
                except socket.timeout:
                    continue
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                buf = bytearray(hello.size)
                if not _recv_exact(sock, memoryview(buf)):
                    sock.close()
                    continue
                magic, r = hello.unpack(buf)
                if magic != _MAGIC or not self.rank < r < self.world_size or r in self._peers:
                    sock.close()
                    continue
                self._add(r, sock)
        except OSError as e:
            raise CollectiveError(f"could not connect the loopback mesh: {e}", op="init_process_group",
                                  this_rank=self.rank, kind="init") from None
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        for peer in self._peers.values():
            peer.reader = threading.Thread(target=self._read, args=(peer,), daemon=True,
                                           name=f"ignis-loopback-{self.rank}<-{peer.rank}")
            peer.reader.start()

    def _add(self, r: int, sock: socket.socket) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peers[r] = _Peer(r, sock)

    # -- the wire ------------------------------------------------------------------
    def _read(self, peer: _Peer) -> None:
        head = bytearray(_FRAME.size)
        sock = peer.sock
        while True:
            if not _recv_exact(sock, memoryview(head)):
                break
            magic, hlen, plen = _FRAME.unpack(head)
            if magic != _MAGIC or hlen > (1 << 20):
                break
            hbuf = bytearray(hlen)
            if not _recv_exact(sock, memoryview(hbuf)):
                break
            header = json.loads(hbuf)
            if header.get("tag") == _BYE:
                with self._cond:
                    peer.bye = header.get("why") or True
                    self._news += 1
                    self._cond.notify_all()
                continue
            payload = np.empty(plen, np.uint8)
            if plen and not _recv_exact(sock, memoryview(payload)):
                break
            with self._cond:
                self._inbox[(peer.rank, header["tag"])] = (header, payload)
                self._news += 1
                self._cond.notify_all()
        with self._cond:
            peer.eof = True
            self._news += 1
            self._cond.notify_all()

    def _wake(self, _err: BaseException) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the side channel (the NCCL engine's call matcher) ---------------------------
    def post(self, p: int, header: dict[str, Any]) -> None:
        """Send rank ``p`` a message with no payload (``header["tag"]`` names it); ``CollectiveError``
        if ``p`` is gone."""
        self._send(p, header, _EMPTY, "call matching")

    def take(self, q: int, tag: str) -> dict[str, Any] | None:
        """Rank ``q``'s message ``tag`` if it arrived (taken out of the inbox), else None."""
        with self._cond:
            msg = self._inbox.pop((q, tag), None)
        return None if msg is None else msg[0]

    def peek(self, q: int, tag: str) -> dict[str, Any] | None:
        """Rank ``q``'s message ``tag`` if it arrived (left in the inbox; a later one replaces it)."""
        with self._cond:
            msg = self._inbox.get((q, tag))
        return None if msg is None else msg[0]

    def departed(self, q: int) -> tuple[Any, bool]:
        """``(bye, eof)`` of rank ``q``: its goodbye (True, or the reason it gave up, a str; False
        if none came) and whether its connection ended."""
        peer = self._peers[q]
        return peer.bye, peer.eof

    def notify(self) -> None:
        """Wake ``wait_news``."""
        with self._cond:
            self._news += 1
            self._cond.notify_all()

    def wait_news(self, seen: int, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for news (a message, a goodbye, an end of a connection,
        a ``notify``) after the count ``seen``; returns the count now."""
        with self._cond:
            if self._news == seen:
                self._cond.wait(timeout)
            return self._news

    def _send(self, p: int, header: dict[str, Any], payload: np.ndarray, label: str) -> None:
        data = memoryview(np.ascontiguousarray(payload).reshape(-1).view(np.uint8))
        if p == self.rank:
            with self._cond:
                self._inbox[(p, header["tag"])] = (header, np.array(data, np.uint8))
                self._cond.notify_all()
            return
        peer = self._peers[p]
        hbytes = json.dumps(header, separators=(",", ":")).encode()
        try:
            with peer.send_lock:
                peer.sock.sendall(_FRAME.pack(_MAGIC, len(hbytes), len(data)) + hbytes)
                if len(data):
                    peer.sock.sendall(data)
        except OSError as e:
            # The peer may have said why it left just before it closed: its goodbye can still
            # sit unread behind this failure. Let the reader reach the end of the connection
            # (it follows a failed send at once) so the error names the reason, not the pipe.
            deadline = time.monotonic() + _DRAIN_S
            with self._cond:
                while not peer.eof and not isinstance(peer.bye, str):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            raise self._gone(peer, label, f"sending to it failed ({e.strerror or e})") from None

    def _gone(self, peer: _Peer, label: str, how: str) -> CollectiveError:
        if isinstance(peer.bye, str):
            return CollectiveError(f"rank {peer.rank} failed and left ({peer.bye})", op=label, rank=peer.rank,
                                   this_rank=self.rank, kind="peer_failed")
        if peer.bye:
            return CollectiveError(f"rank {peer.rank} has closed its communicator ({how}); every rank must "
                                   "call the same operations before closing", op=label, rank=peer.rank,
                                   this_rank=self.rank, kind="peer_closed")
        return CollectiveError(f"rank {peer.rank} died: its connection closed ({how})", op=label,
                               rank=peer.rank, this_rank=self.rank, kind="peer_died")

    def _recv(self, q: int, tag: str, expect: dict[str, Any], nbytes: int, label: str,
              deadline: float) -> np.ndarray:
        key = (q, tag)
        with self._cond:
            while True:
                msg = self._inbox.pop(key, None)
                if msg is not None:
                    break
                if self.health.error is not None:
                    raise self.health.again(label)
                if q != self.rank and self._peers[q].eof:
                    raise self._gone(self._peers[q], label, "while this rank waited for its data")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveTimeoutError(
                        f"rank {q} sent nothing for {self.timeout:g} s (the time-out); it is stuck, or it called "
                        "other operations than this rank", op=label, rank=q, this_rank=self.rank, kind="timeout")
                self._cond.wait(left)
        header, payload = msg
        err = mismatch_error(q, header, expect, label, self.rank)
        if err is not None:
            raise err
        if payload.nbytes != nbytes:
            raise CollectiveError(f"rank {q} sent {payload.nbytes} bytes where {nbytes} were expected",
                                  op=label, rank=q, this_rank=self.rank, kind="mismatch")
        return payload

    # -- enqueue and run -------------------------------------------------------------
    def run(self, ops: "list[_Op] | tuple[_Op, ...]", stream: "Stream", targets: tuple = ()) -> None:
        """Queue ``ops`` (one call, or one group) on ``stream`` as one host function;
        ``targets`` (``(weakref, _Op)``: what it writes) are poisoned if it fails."""
        backend = self.device.backend
        work = []
        for op in ops:
            sv = backend.host_view(op.send_ptr, op.send_bytes) if op.send_bytes else _EMPTY
            rv = backend.host_view(op.recv_ptr, op.recv_bytes) if op.recv_bytes else _EMPTY
            work.append((op, sv.view(op.plan.numpy), rv.view(op.plan.numpy)))
        hw = _HostWork(self, work, ops[0], targets)
        self._queued.append(hw)  # before the host function can run (and pop it)
        try:
            stream.launch_host_func(hw)
        except BaseException:
            self._queued.remove(hw)
            raise
        claimed = self.health.claimed
        if claimed is not None and targets:  # the first failure's hooks may have missed this call
            poison(targets, claimed, self.rank)

    def execute(self, hw: "_HostWork", work: list) -> None:
        """Run one queued call (one operation or one group, sends first) on the stream's
        host thread. A failure becomes the communicator's first failure (the arrays the
        queued operations were to write are poisoned); the call then ends without failing
        the stream, as an NCCL kernel ends after an abort. A call queued behind a failure
        does nothing (its targets were poisoned when it was queued, or by the failure).

        Args:
            hw: the queued host function.
            work: ``(op, send view, receive view)`` for each operation.
        """
        try:
            if self.health.error is not None:
                raise self.health.again(hw.label)
            # Sends of a group go first, so a group's send/recv pairs never wait on each other.
            for op, sv, rv in work:
                if op.name == "send":
                    self._run_one(op, sv, rv)
            for op, sv, rv in work:
                if op.name != "send":
                    self._run_one(op, sv, rv)
        except Exception as e:
            if isinstance(e, CollectiveError):
                err = e
            else:
                err = CollectiveError(f"{type(e).__name__}: {e}", op=hw.label, this_rank=self.rank)
                err.__cause__ = e
            if not self.health.fail(err):  # an earlier failure's hooks poisoned what was queued then
                poison(hw.targets, self.health.claimed or err, self.rank)
        finally:
            try:
                self._queued.remove(hw)
            except ValueError:
                pass

    def agree(self, hdr: dict[str, Any], tag: str, label: str, deadline: float) -> None:
        """Exchange ``hdr`` (operation, dtype, count, root, reduction) with every other rank and
        raise ``CollectiveError`` (kind "mismatch") naming the first rank whose differs."""
        peers = [p for p in range(self.world_size) if p != self.rank]
        msg = {**hdr, "tag": tag}
        for p in peers:
            self._send(p, msg, _EMPTY, label)
        for q in peers:
            self._recv(q, tag, hdr, 0, label, deadline)

    def _run_one(self, op: "_Op", s: np.ndarray, out: np.ndarray) -> None:
        deadline = time.monotonic() + self.timeout
        n, r = self.world_size, self.rank
        hdr = op.header()
        itemsize = op.plan.numpy.itemsize
        label = op.label

        def send(p: int, tag: str, data: np.ndarray) -> None:
            self._send(p, {**hdr, "tag": tag}, data, label)

        def recv(q: int, tag: str, count: int) -> np.ndarray:
            return self._recv(q, tag, hdr, count * itemsize, label, deadline).view(op.plan.numpy)

        name = op.name
        t0, t1 = f"c{op.seq}.0", f"c{op.seq}.1"
        if name == "all_reduce":
            cnt = op.count
            b = [cnt * i // n for i in range(n + 1)]
            for p in range(n):
                if p != r:
                    send(p, t0, s[b[p]:b[p + 1]])
            acc = self._reduce(op, lambda q: s[b[r]:b[r + 1]] if q == r else recv(q, t0, b[r + 1] - b[r]))
            for p in range(n):
                if p != r:
                    send(p, t1, acc)
            out[b[r]:b[r + 1]] = acc
            for q in range(n):
                if q != r:
                    out[b[q]:b[q + 1]] = recv(q, t1, b[q + 1] - b[q])
        elif name == "reduce":
            # Phase 0 is the header exchange, so a rank that called another operation
            # (whose phase 0 carries data) is caught there too.
            self.agree(hdr, t0, label, deadline)
            if r != op.root:
                send(op.root, t1, s)
            else:
                out[:] = self._reduce(op, lambda q: s if q == r else recv(q, t1, op.count))
        elif name == "broadcast":
            self.agree(hdr, t0, label, deadline)
            if r == op.root:
                for p in range(n):
                    if p != r:
                        send(p, t1, s)
                if out.ctypes.data != s.ctypes.data:
                    out[:] = s
            else:
                out[:] = recv(op.root, t1, op.count)
        elif name == "all_gather":
            cnt = op.count
            for p in range(n):
                if p != r:
                    send(p, t0, s)
            if out[r * cnt:(r + 1) * cnt].ctypes.data != s.ctypes.data:
                out[r * cnt:(r + 1) * cnt] = s
            for q in range(n):
                if q != r:
                    out[q * cnt:(q + 1) * cnt] = recv(q, t0, cnt)
        elif name == "reduce_scatter":
            cnt = op.count
            for p in range(n):
                if p != r:
                    send(p, t0, s[p * cnt:(p + 1) * cnt])
            out[:] = self._reduce(op, lambda q: s[r * cnt:(r + 1) * cnt] if q == r else recv(q, t0, cnt))
        elif name == "send":
            self._send(op.root, {**hdr, "tag": f"p{op.seq}"}, s, label)
        elif name == "recv":
            out[:] = self._recv(op.root, f"p{op.seq}", hdr, op.count * itemsize, label,
                                deadline).view(op.plan.numpy)
        else:  # pragma: no cover - the communicator builds only the names above
            raise AssertionError(name)

    def _reduce(self, op: "_Op", part: Callable[[int], np.ndarray]) -> np.ndarray:
        """Reduce the parts of ranks 0..n-1, in that order, into a new array."""
        acc = np.array(part(0), copy=True)
        red = op.op
        fn = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
              ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[red]
        for q in range(1, self.world_size):
            fn(acc, part(q), out=acc)
        if red is ReduceOp.AVG:
            n = self.world_size
            if op.plan.is_float:
                acc[...] = (acc.astype(np.float64) / n).astype(acc.dtype)
            elif acc.dtype.kind == "u":
                acc //= n
            else:
                q = np.abs(acc) // n
                acc[...] = np.where(acc < 0, -q, q)
        return acc

    # -- shutdown -------------------------------------------------------------------
    def close(self) -> None:
        """Say goodbye to every peer and close the mesh."""
        if self._closed:
            return
        self._closed = True
        bye = json.dumps({"tag": _BYE}).encode()
        for peer in self._peers.values():
            try:
                with peer.send_lock:
                    peer.sock.sendall(_FRAME.pack(_MAGIC, len(bye), 0) + bye)
                peer.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        # Let the readers drain what peers still send (normally their goodbye), so
        # closing never resets a connection with unread bytes in it.
        deadline = time.monotonic() + min(2.0, self.timeout)
        for peer in self._peers.values():
            if peer.reader is not None:
                peer.reader.join(max(0.0, deadline - time.monotonic()))
        for peer in self._peers.values():
            try:
                peer.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            peer.sock.close()
        if self._listener is not None:
            self._listener.close()

    def abort(self, why: str | None = None) -> None:
        """Tell every peer why this rank gives up (``why``, default: the communicator's failure),
        and close the mesh. Idempotent."""
        if self._closed and why is None:
            return
        self._closed = True
        err = self.health.error or self.health.claimed
        if why is None:
            why = err.message if err is not None else "aborted"
        bye = json.dumps({"tag": _BYE, "why": why}).encode()
        for peer in self._peers.values():
            try:
                peer.sock.settimeout(1.0)
                with peer.send_lock:
                    peer.sock.sendall(_FRAME.pack(_MAGIC, len(bye), 0) + bye)
                peer.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            peer.sock.close()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


class _HostWork:
    """The host function of one queued call (a named callable, for the stream's error text).
    ``targets``: ``(weakref to an array, _Op)`` for each array it writes."""

    __slots__ = ("engine", "work", "first", "targets")

    def __init__(self, engine: LoopbackEngine, work: list, first: "_Op", targets: tuple) -> None:
        self.engine = engine
        self.work = work
        self.first = first
        self.targets = targets

    @property
    def label(self) -> str:
        return self.first.label

    def __call__(self) -> None:
        work, self.work = self.work, None  # drop the memory views once done
        self.engine.execute(self, work)

    def __repr__(self) -> str:
        return f"ignis.collective[rank {self.engine.rank}]"

