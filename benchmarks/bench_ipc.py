#!/usr/bin/env python3
"""IPC benchmark: sharing a 64 MiB device array with another process.

Run from the repository root (device 0; the backend is chosen as usual, by
``IGNIS_BACKEND``, default ``auto``)::

    PYTHONPATH=src python3 benchmarks/bench_ipc.py [--json OUT.json] [--quick] [--mib 64]

What it measures, with a producer (this process) and a consumer (a process
started with the spawn method) on one card, joined by a Unix socket pair:

1. Sharing latency per array, end to end: from the producer calling
   ``ig.ipc.export`` until the consumer holds a mapped, accessible NvArray
   (export with its stream synchronization, SCM_RIGHTS send, receive,
   liveness query to the exporter, import, reserve, map, set access). Both
   processes read ``time.perf_counter`` (CLOCK_MONOTONIC, one clock for the
   whole machine), so the consumer computes the one-way time itself. Also
   the producer's part (export + send), the consumer's ``ig.ipc.open``, both
   with and without the liveness query (``check_live=False``), and
   the unmap (``ig.ipc.close``) that ends each round. Rounds never overlap:
   the producer waits for the consumer's acknowledgement.
2. The consumer's read bandwidth of the shared memory: device-to-device
   copies of the imported array into a local one, against copies between two
   local arrays of the same size, in the same process on the same stream,
   timed with events; copy throughput (bytes copied per second) and the
   ratio shared / local.
3. The steps that the latency is made of, in this process alone (it imports
   its own export): the stream synchronization of ``finish``, the driver's
   export (which ``VmmResource`` does once per block and then duplicates),
   ``ig.ipc.export``, the driver's import, reserve + map + set access, and
   the unmap.

Medians over the rounds (and over the repeats for bandwidth), p90 beside
them. On the emulated backend every number times the host emulator and says
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import sys
import time
from typing import Any

import numpy as np

import ignis as ig

_STAMP = struct.Struct("<d")


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
            "min": xs[0], "n": len(xs)}


def _line(sock: socket.socket) -> Any:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("the consumer hung up")
        buf += chunk
    msg = json.loads(buf)
    if isinstance(msg, dict) and "error" in msg:
        raise RuntimeError(f"consumer failed: {msg['error']}")
    return msg


def _bandwidth(dst: "ig.NvArray", src: "ig.NvArray", stream: "ig.Stream", copies: int,
               repeats: int) -> list[float]:
    """GB/s of ``dst.copy_(src)`` on ``stream``, one sample per repeat."""
    dst.copy_(src, stream=stream)  # warm-up
    stream.synchronize()
    out = []
    for _ in range(repeats):
        start = stream.record(timing=True)
        for _ in range(copies):
            dst.copy_(src, stream=stream)
        end = stream.record(timing=True)
        end.synchronize()
        ms = start.elapsed_ms(end)
        start.close()
        end.close()
        out.append(src.nbytes * copies / (ms * 1e-3) / 1e9)
    return out


def _consumer(sock: socket.socket, backend: str, rounds: int, copies: int, repeats: int) -> None:
    """The consumer process: time each open, then the bandwidth of the last mapping."""
    try:
        if ig.get_backend().name != backend:
            ig.set_backend(backend)
        dev = ig.Device(0)
        e2e, part, unmap = [], [], []
        b = None
        for i in range(rounds):
            check = i % 2 == 0  # alternate: with and without the liveness query
            with ig.ipc.recv_handle(sock) as h:
                t_recv = time.perf_counter()
                b = ig.ipc.open(h, check_live=check)
                t_mapped = time.perf_counter()
            (t0,) = _STAMP.unpack(sock.recv(_STAMP.size, socket.MSG_WAITALL))
            e2e.append((check, (t_mapped - t0) * 1e6))
            part.append((check, (t_mapped - t_recv) * 1e6))
            if i < rounds - 1:
                t = time.perf_counter()
                ig.ipc.close(b)
                unmap.append((time.perf_counter() - t) * 1e6)
            sock.sendall(b"k")
        s = dev.create_stream()
        local_src = ig.empty(b.shape, b.dtype, stream=s, mr=ig.VmmResource(dev))
        local_src.copy_(b, stream=s)
        dst = ig.empty(b.shape, b.dtype, stream=s)
        shared_bw = _bandwidth(dst, b, s, copies, repeats)
        local_bw = _bandwidth(dst, local_src, s, copies, repeats)
        ok = bool(np.array_equal(dst.to_numpy(stream=s), local_src.to_numpy(stream=s)))
        ig.ipc.close(b)
        for a in (local_src, dst):
            a.free()
        s.close()
        out = {"e2e": e2e, "consumer": part, "unmap": unmap, "shared_bw": shared_bw, "local_bw": local_bw,
               "copy_ok": ok, "device": dev.name}
        sock.sendall(json.dumps(out).encode() + b"\n")
    except BaseException as e:  # reported by the producer
        sock.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode() + b"\n")
    finally:
        sock.close()


def run(mib: int, rounds: int, copies: int, repeats: int) -> dict:
    dev = ig.Device(0)
    backend = dev.backend.name
    mr = ig.VmmResource(dev)
    n = (mib << 20) // 4
    a = ig.empty((n,), "float32", mr=mr)
    a.from_host(np.arange(n, dtype=np.float32))
    ours, theirs = socket.socketpair()
    proc = multiprocessing.get_context("spawn").Process(
        target=_consumer, args=(theirs, backend, rounds, copies, repeats), daemon=True)
    proc.start()
    theirs.close()
    ours.settimeout(600)
    producer = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            with ig.ipc.export(a) as h:
                ig.ipc.send_handle(ours, h)
            producer.append((time.perf_counter() - t0) * 1e6)
            ours.sendall(_STAMP.pack(t0))
            if ours.recv(1) != b"k":
                raise EOFError("the consumer hung up")
        res = _line(ours)
    finally:
        ours.close()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        a.free()
    warm = slice(min(4, rounds // 4), None)  # the first rounds start the liveness service, caches
    e2e = res["e2e"][warm]
    return {
        "backend": backend, "device": dev.name, "array_mib": mib, "rounds": rounds,
        "granularity": mr.granularity,
        "latency_us": {
            "end_to_end": _quantiles([t for c, t in e2e if c]),
            "end_to_end_no_liveness_query": _quantiles([t for c, t in e2e if not c]),
            "producer_export_send": _quantiles(producer[warm]),
            "consumer_open": _quantiles([t for c, t in res["consumer"][warm] if c]),
            "consumer_open_no_liveness_query": _quantiles([t for c, t in res["consumer"][warm] if not c]),
            "consumer_close_unmap": _quantiles(res["unmap"][warm]),
        },
        "bandwidth_GBps": {"shared_to_local": _quantiles(res["shared_bw"]),
                           "local_to_local": _quantiles(res["local_bw"])},
        "bandwidth_ratio": statistics.median(res["shared_bw"]) / statistics.median(res["local_bw"]),
        "copy_ok": res["copy_ok"],
    }


def driver_floor(nbytes: int, rounds: int) -> dict[str, dict[str, float]]:
    """Microseconds of each step of sharing, in one process (importing its own export):
    what the end-to-end latency is made of."""
    from ignis.memory.vmm import map_range, unmap_range

    dev = ig.Device(0)
    b, o = dev.backend, dev.ordinal
    g = b.vmm_granularity(o)
    mr = ig.VmmResource(dev)
    a = ig.empty((nbytes // 4,), "float32", mr=mr)
    steps: dict[str, list[float]] = {k: [] for k in (
        "ig.ipc.finish (idle stream)", "driver export (cuMemExportToShareableHandle)",
        "ig.ipc.export (export fd cached per block)", "driver import (cuMemImportFromShareableHandle)",
        "reserve + map + set access", "release imported handle", "unmap + free address")}
    # The driver's own steps run on an allocation of their own, made through the backend
    # protocol as VmmResource makes its blocks (the array's size, rounded to the granularity).
    size = -(-a.nbytes // g) * g
    h = b.vmm_create(o, size)
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            ig.ipc.finish(a)
            t1 = time.perf_counter()
            fd = b.vmm_export_fd(h)
            t2 = time.perf_counter()
            ig.ipc.export(a).close()
            t3 = time.perf_counter()
            h2 = b.vmm_import_fd(fd)
            t4 = time.perf_counter()
            ptr = map_range(b, o, h2, size, g)
            t5 = time.perf_counter()
            b.vmm_release(h2)
            t6 = time.perf_counter()
            unmap_range(b, ptr, size)
            t7 = time.perf_counter()
            os.close(fd)
            for key, dt in zip(steps, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6)):
                steps[key].append(dt * 1e6)
    finally:
        b.vmm_release(h)
        a.free()
    warm = slice(min(4, rounds // 4), None)
    return {k: _quantiles(v[warm]) for k, v in steps.items()}


def report(r: dict) -> None:
    print(f"Ignis IPC benchmark: {r['array_mib']} MiB float32, {r['rounds']} rounds, device 0 = {r['device']} "
          f"({r['backend']} backend), granularity {r['granularity'] >> 10} KiB")
    if r["backend"] == "emulated":
        print("  (emulated backend: these numbers time the host emulator, not a GPU)")
    print(f"  {'latency per array (us)':<52}{'median':>10}{'p90':>10}{'min':>10}")
    names = {"end_to_end": "export+send+import+map (end to end)",
             "end_to_end_no_liveness_query": "  same, check_live=False",
             "producer_export_send": "producer: export + send",
             "consumer_open": "consumer: open (liveness query + import + map)",
             "consumer_open_no_liveness_query": "  same, check_live=False",
             "consumer_close_unmap": "consumer: close (synchronize + unmap)"}
    for key, label in names.items():
        q = r["latency_us"][key]
        print(f"  {label:<52}{q['median']:>10.1f}{q['p90']:>10.1f}{q['min']:>10.1f}")
    print(f"  {'consumer copy bandwidth (GB/s)':<52}{'median':>10}{'p90':>10}{'min':>10}")
    for key, label in (("shared_to_local", "imported (shared) -> local"), ("local_to_local", "local -> local")):
        q = r["bandwidth_GBps"][key]
        print(f"  {label:<52}{q['median']:>10.1f}{q['p90']:>10.1f}{q['min']:>10.1f}")
    print(f"  ratio shared / local: {r['bandwidth_ratio']:.3f}   (copies correct: {r['copy_ok']})")
    print(f"  {'steps, in one process (us)':<52}{'median':>10}{'p90':>10}{'min':>10}")
    for label, q in r["steps_us"].items():
        print(f"  {label:<52}{q['median']:>10.1f}{q['p90']:>10.1f}{q['min']:>10.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description="Ignis IPC benchmark (see the module docstring)")
    p.add_argument("--mib", type=int, default=64, help="array size in MiB (default 64)")
    p.add_argument("--rounds", type=int, default=None, help="sharing rounds (default 200, 40 with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    emulated = ig.get_backend().name == "emulated"
    rounds = args.rounds or (40 if args.quick or emulated else 200)
    copies, repeats = (2, 3) if args.quick or emulated else (20, 7)
    r = run(args.mib, rounds, copies, repeats)
    r["steps_us"] = driver_floor(args.mib << 20, rounds)
    r["host"] = {"python": platform.python_version(), "pid": os.getpid(), "platform": platform.platform()}
    report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0 if r["copy_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
