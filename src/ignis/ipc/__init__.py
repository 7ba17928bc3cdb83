"""IPC (layer 5): share device memory between processes, zero-copy.

Memory allocated from a ``VmmResource`` is exported as a POSIX file
descriptor (``export``), passed to another process over a Unix socket with
SCM_RIGHTS (``send`` / ``recv``) or through ``multiprocessing`` (an
``IpcHandle`` pickles with the fd-passing reduction), and mapped there
(``open``) as an ``NvArray`` over the same bytes::

    # producer                                   # consumer
    mr = ig.VmmResource(0)
    a = ig.empty((1024, 1024), "float32", mr=mr)
    a.fill_(1.0)
    ig.ipc.send(sock, a)                         b = ig.ipc.recv(sock)
                                                 b.to_numpy()  # the producer's bytes
                                                 ig.ipc.close(b)  # unmaps; a is untouched

Rules (details in each module):

- Ordering: ``export`` finishes every pending write and read of the array
  first (a host synchronization), so the importer sees the bytes as they
  were when ``export`` returned. Later writes on either side are ordered by
  the program: ``ig.ipc.finish(array)`` on the writer, then a message.
- The imported array never owns the exporter's memory: freeing or closing
  it unmaps (after its queued uses), its views keep the mapping alive, and
  the mapping stays valid after the exporter frees its array or exits.
- Untrusted input: descriptors are validated (sizes, offsets, shapes, dtype,
  GPU UUID); a socket peer or a descriptor of another uid is refused unless
  ``allow_other_users=True``; bad messages leak no fd.
- Liveness: ``open`` asks the exporter (a tiny per-process service) whether
  the block is still live and raises ``UseAfterFreeError`` if it was freed.
  It cannot know once the exporter has exited, nor about a free that comes
  after its answer; the mapping is valid in both cases.
- multiprocessing: pass an ``IpcHandle`` as a ``Process`` argument, or put
  it on a ``Queue`` and drop it (do not close it: the queue pickles it later,
  from a thread; garbage collection closes it afterwards). A handle put on a
  queue and never taken keeps a duplicate fd until the process exits.
- Start method: start the processes that use Ignis with ``spawn`` (or
  ``forkserver``), never ``fork`` (the default on Linux before Python 3.14)::

      ctx = multiprocessing.get_context("spawn")
      p = ctx.Process(target=consumer, args=(handle,)); p.start()

  A child forked after the parent used a device has none of the parent's
  device state (the emulator's stream threads, the CUDA driver's context):
  Ignis raises ``ForkedProcessError`` there at the first use, rather than
  hang. ``spawn`` also passes the handle's fd to the child properly.
"""

from __future__ import annotations

from typing import IO, Any

from .handle import IpcDescriptor, IpcHandle
from .share import ImportedMemory, close, export, finish, is_imported, open
from .transport import peer_credentials, recv, recv_handle, send, send_handle

__all__ = ["IpcHandle", "IpcDescriptor", "ImportedMemory", "export", "open", "close", "finish",
           "is_imported", "send", "recv", "send_handle", "recv_handle", "peer_credentials", "demo"]


def demo(out: "IO[str] | None" = None, **kwargs: Any) -> int:
    """A producer process fills an array, a consumer process maps it zero-copy,
    checks it and writes back. Prints what happens; returns 0 on success."""
    from ._demo import run
    return run(out, **kwargs)
