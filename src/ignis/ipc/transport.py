"""Passing handles over Unix domain sockets (SCM_RIGHTS).

Wire format, one message per handle: ``b"IGX1"``, the descriptor's length
(little-endian u32), the descriptor (JSON, at most 64 KiB); the file
descriptor rides on the message as SCM_RIGHTS ancillary data. SCM_RIGHTS is
used rather than pidfd_getfd, which needs ptrace rights that containers
often drop.

Rules:
- The receiver checks the sending process's credentials (SO_PEERCRED) before
  it reads anything: a peer of another uid is refused with PermissionError
  unless ``allow_other_users=True``; its message, fds included, stays unread
  in the socket (closing the socket discards it).
- Everything received is untrusted: a bad magic, an oversized or truncated
  descriptor, a message without exactly one fd, or a descriptor that fails
  validation raises ``ValueError`` (``EOFError`` when the peer hung up), and
  every fd that arrived is closed first. A blocking socket waits for a
  stalled peer: give sockets to untrusted peers a timeout (``settimeout``).
- Any stream or seqpacket AF_UNIX socket works: ``socket.socketpair()``, a
  connected path or abstract-namespace socket. (For a ``socketpair`` the
  credentials are those of the process that created it.)
"""

from __future__ import annotations

import os
import socket
import struct

from ..array import NvArray
from ..runtime import Device, Stream
from .handle import MAX_DESCRIPTOR_BYTES, IpcDescriptor, IpcHandle
from .liveness import peer_credentials
from .share import export, open

__all__ = ["send", "recv", "send_handle", "recv_handle", "peer_credentials", "MAGIC"]

MAGIC = b"IGX1"
_HEADER = struct.Struct("<4sI")
_MAX_FDS = 4  # room to receive (and close) a few extra fds a bad peer might attach


def _unix(sock: socket.socket, what: str) -> None:
    if not isinstance(sock, socket.socket) or sock.family != socket.AF_UNIX:
        raise ValueError(f"ig.ipc.{what} needs a connected AF_UNIX socket (file descriptors travel only over "
                         f"Unix domain sockets), got {sock!r}")


def send_handle(sock: socket.socket, handle: IpcHandle) -> None:
    """Send ``handle`` (its fd and descriptor) over ``sock``. The handle stays
    open and the caller's: close it when done."""
    _unix(sock, "send_handle")
    if not isinstance(handle, IpcHandle):
        raise TypeError(f"send_handle needs an IpcHandle, got {type(handle).__name__}")
    body = handle.descriptor.to_bytes()
    msg = _HEADER.pack(MAGIC, len(body)) + body
    sent = socket.send_fds(sock, [msg], [handle.fd])
    if sent < len(msg):
        sock.sendall(msg[sent:])


def send(sock: socket.socket, array: NvArray, *, stream: Stream | None = None) -> IpcDescriptor:
    """Export ``array`` (``ig.ipc.export``) and send it over ``sock``; returns what was sent."""
    with export(array, stream=stream) as handle:
        send_handle(sock, handle)
        return handle.descriptor


def _recv_exact(sock: socket.socket, n: int, got: int, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"the peer closed the connection in the middle of an IPC message "
                           f"({got + len(buf)} of {got + n} bytes of {what} arrived)")
        buf += chunk
    return bytes(buf)


def recv_handle(sock: socket.socket, *, allow_other_users: bool = False) -> IpcHandle:
    """Receive one handle sent by ``send`` / ``send_handle``. The caller owns it (close it)."""
    _unix(sock, "recv_handle")
    pid, uid, _ = peer_credentials(sock)
    if uid != os.geteuid() and not allow_other_users:
        raise PermissionError(f"refusing device memory from pid {pid}: it runs as uid {uid}, not as this "
                              f"process's user (uid {os.geteuid()}); pass allow_other_users=True to accept "
                              "memory from other users")
    fds: list[int] = []
    try:
        if sock.type == socket.SOCK_STREAM:
            head = _recv_head(sock, fds)
        else:  # a datagram / seqpacket message must be read whole
            msg, more, flags, _ = socket.recv_fds(sock, _HEADER.size + MAX_DESCRIPTOR_BYTES, _MAX_FDS)
            fds += more
            _check_flags(flags)
            if not msg and not fds:
                raise EOFError("the peer closed the connection: no IPC message to receive")
            if len(msg) < _HEADER.size:
                raise EOFError(f"the IPC message is truncated ({len(msg)} bytes, less than its header)")
            head = msg[:_HEADER.size]
        magic, n = _HEADER.unpack(head)
        if magic != MAGIC:
            raise ValueError(f"not an Ignis IPC message (it starts with {magic!r}, not {MAGIC!r}); "
                             "send with ig.ipc.send or ig.ipc.send_handle")
        if n > MAX_DESCRIPTOR_BYTES:
            raise ValueError(f"the IPC descriptor claims {n} bytes, more than the {MAX_DESCRIPTOR_BYTES}-byte "
                             "limit; the message is corrupt or forged")
        if sock.type != socket.SOCK_STREAM:
            body = msg[_HEADER.size:]
            if len(body) != n:
                raise EOFError(f"the IPC message is truncated ({len(body)} of {n} descriptor bytes)")
        else:
            body = _recv_exact(sock, n, _HEADER.size, "the descriptor")
        if len(fds) != 1:
            raise ValueError(f"an Ignis IPC message carries exactly one file descriptor, this one carried "
                             f"{len(fds)}")
        handle = IpcHandle(fds[0], IpcDescriptor.parse(body))
        fds.clear()  # the handle owns it now
        return handle
    finally:
        for fd in fds:
            os.close(fd)


def _check_flags(flags: int) -> None:
    if flags & socket.MSG_CTRUNC:
        raise ValueError(f"the peer attached more than {_MAX_FDS} file descriptors to an IPC message; "
                         "an Ignis message carries exactly one")
    if flags & socket.MSG_TRUNC:
        raise ValueError("the IPC message is larger than any Ignis message; it is corrupt or forged")


def _recv_head(sock: socket.socket, fds: list[int]) -> bytes:
    """The header of a message on a stream socket; fds that arrive with it go to ``fds``."""
    head = b""
    while len(head) < _HEADER.size:
        chunk, more, flags, _ = socket.recv_fds(sock, _HEADER.size - len(head), _MAX_FDS)
        fds += more
        _check_flags(flags)
        if not chunk:
            if not head and not fds:
                raise EOFError("the peer closed the connection: no IPC message to receive")
            raise EOFError(f"the peer closed the connection in the middle of an IPC message "
                           f"({len(head)} of {_HEADER.size} header bytes arrived)")
        head += chunk
    return head


def recv(sock: socket.socket, *, allow_other_users: bool = False, device: "Device | int | None" = None,
         stream: Stream | None = None, check_live: bool = True, timeout: float = 1.0) -> NvArray:
    """Receive an array sent with ``ig.ipc.send`` and map it (``ig.ipc.open``).
    The received fd is closed once the memory is mapped; the array keeps the mapping."""
    with recv_handle(sock, allow_other_users=allow_other_users) as handle:
        return open(handle, device=device, stream=stream, check_live=check_live,
                    allow_other_users=allow_other_users, timeout=timeout)
