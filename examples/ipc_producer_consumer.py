#!/usr/bin/env python3
"""Share a device array between two processes, zero-copy (Ignis IPC).

The producer fills an array allocated from a ``VmmResource`` and sends it
over a Unix socket; the consumer maps the same device memory, checks it, adds
one to every element in place, and tells the producer, which sees the change
in its own array. Run from the repository root, on either backend, with the
virtual environment of the README's set-up (any Python that has Ignis
installed will do)::

    .venv/bin/python examples/ipc_producer_consumer.py                  # both roles
    .venv/bin/python examples/ipc_producer_consumer.py --role producer &
    .venv/bin/python examples/ipc_producer_consumer.py --role consumer  # two programs

Each side prints what it did; the producer ends with ``-> shared`` and both
exit with status 0 when the consumer's write is seen in the producer's array.

With no ``--role`` the script is the producer and starts the consumer itself
(``multiprocessing`` with the spawn method). The two programs meet at an
abstract Unix socket address (``--address``); the consumer refuses a producer
that runs as another user.

Start method: always start processes that use Ignis with ``spawn`` (as here)
or ``forkserver``: ``multiprocessing.get_context("spawn")``. Never ``fork``
(Linux's default before Python 3.14) once this process has used a device: a
forked child has none of the parent's device state, and Ignis raises
``ig.ForkedProcessError`` in it at the first use.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import sys
import time

import numpy as np

import ignis as ig

N = 16 << 20  # float32 elements: 64 MiB


def producer(address: str, spawn_consumer: bool) -> int:
    mr = ig.VmmResource(0)                       # exportable device memory
    a = ig.empty((N,), "float32", mr=mr)
    a.from_host(np.arange(N, dtype=np.float32))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + address)
    server.listen(1)
    proc = None
    if spawn_consumer:
        # spawn, not fork: this process has used the device (see the module docstring)
        proc = multiprocessing.get_context("spawn").Process(target=consumer, args=(address,))
        proc.start()
    print(f"producer pid {multiprocessing.current_process().pid}: 64 MiB on {a.device.name}, "
          f"waiting for a consumer at @{address}")
    conn, _ = server.accept()
    with conn:
        t0 = time.perf_counter()
        ig.ipc.send(conn, a)                      # export (finishes pending writes) + SCM_RIGHTS
        print(f"producer: sent the array in {(time.perf_counter() - t0) * 1e3:.2f} ms")
        reply = conn.recv(64)                     # the consumer finished its write
        print(f"producer: consumer says {reply.decode()!r}")
    ok = bool(np.array_equal(a[:8].to_numpy(), np.arange(1, 9, dtype=np.float32)))
    print(f"producer: its own array now starts with {a[:8].to_numpy()} -> {'shared' if ok else 'NOT shared'}")
    a.free()
    server.close()
    if proc is not None:
        proc.join()
        ok = ok and proc.exitcode == 0
    return 0 if ok else 1


def consumer(address: str) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(100):                          # the producer may not be listening yet
        try:
            conn.connect("\0" + address)
            break
        except (ConnectionRefusedError, FileNotFoundError):
            time.sleep(0.05)
    with conn:
        t0 = time.perf_counter()
        b = ig.ipc.recv(conn)                     # checks the peer's uid, maps, sets access
        print(f"consumer: mapped {b.nbytes >> 20} MiB in {(time.perf_counter() - t0) * 1e3:.2f} ms "
              f"at {b.device_ptr:#x}")
        host = b.to_numpy()
        ok = bool(np.array_equal(host, np.arange(N, dtype=np.float32)))
        print(f"consumer: all {N} elements {'match' if ok else 'DO NOT match'}")
        b.from_host(host + 1)                     # write in place, into the producer's memory
        ig.ipc.finish(b)                          # the write is done before we say so
        conn.sendall(b"added one" if ok else b"mismatch")
        ig.ipc.close(b)                           # unmaps; the producer's array is untouched
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("producer", "consumer"))
    p.add_argument("--address", default="ignis-example-ipc", help="abstract Unix socket name")
    args = p.parse_args()
    if args.role == "consumer":
        return consumer(args.address)
    return producer(args.address, spawn_consumer=args.role is None)


if __name__ == "__main__":
    sys.exit(main())
