"""Collectives: every operation and dtype across real processes, ownership, failures.

Multi-rank tests start real processes with ``ig.collective.launch`` running
this file as a script (``python test_collective.py WORKER``); each worker
checks its own results exactly and prints ``OK <worker>``, so a failing rank
says what it saw. On the emulated backend (loopback TCP) they run anywhere;
the ``gpu`` tests run the same workers on two GPUs through NCCL. With
``--fake``, a worker's group is the NCCL engine over fake bindings
(``FakeNccl``: its all_reduce can wait on the stream until the abort, as an NCCL
kernel waits for a peer), with the real rendezvous, checker mesh, call matcher
and watchdog, so the NCCL engine's failure paths run anywhere too. A worker
that hangs prints every thread's stack and exits (``faulthandler``).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ignis as ig
from ignis.collective import CollectiveError, CollectiveTimeoutError, ReduceOp, launch
from ignis.collective.launch import free_port

HERE = Path(__file__).resolve()
SRC = str(Path(ig.__file__).resolve().parents[1])


# ----------------------------------------------------------------------------------------------
# Workers (run in the launched processes)
# ----------------------------------------------------------------------------------------------
REDUCIBLE = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64",
             "float8_e4m3fn", "float8_e5m2", "complex64"]
FP8 = ("float8_e4m3fn", "float8_e5m2")


def _values(dt: str, rank: int, n: int, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input: small integers, so every reduction below is exact in every dtype."""
    i = np.arange(n)
    if op == "prod":
        base = 1 + (i + rank) % 2                      # products of up to 4 ranks: <= 16
    elif dt in FP8:
        base = (i + rank) % 2                          # sums <= 4, averages in quarters
    else:
        base = (i * 3 + rank * 5) % 7                  # sums of up to 4 ranks: <= 24
    if dt == "complex64":
        return (base + 1j * (base + 1)).astype(np.complex64)
    return base.astype(ig.dtype(dt).numpy)


def _expected(dt: str, op: str, world: int, n: int) -> np.ndarray:
    parts = [_values(dt, r, n, op).astype(np.complex128 if dt == "complex64" else np.float64) for r in range(world)]
    if op in ("sum", "avg"):
        out = sum(parts)
        if op == "avg":
            out = out / world
            if ig.dtype(dt).numpy.kind in "iu":
                out = np.trunc(out)
    elif op == "prod":
        out = np.prod(parts, axis=0)
    elif op == "max":
        out = np.max(parts, axis=0)
    else:
        out = np.min(parts, axis=0)
    return out.astype(ig.dtype(dt).numpy)


class _Checker:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def eq(self, what: str, got: np.ndarray, want: np.ndarray) -> None:
        self.count += 1
        g = np.asarray(got)
        w = np.asarray(want)
        if g.dtype.kind == "V" or w.dtype.kind == "V" or g.dtype != w.dtype:
            g = g.astype(np.complex128 if g.dtype.kind == "c" else np.float64)
            w = w.astype(np.complex128 if w.dtype.kind == "c" else np.float64)
        if g.shape != w.shape or not np.array_equal(g, w):
            self.failures.append(f"{what}: got {g.reshape(-1)[:8]} want {w.reshape(-1)[:8]}")

    def raises(self, what: str, exc: type, fn, match: str = "") -> None:  # type: ignore[no-untyped-def]
        self.count += 1
        try:
            fn()
        except exc as e:
            if match and match not in str(e):
                self.failures.append(f"{what}: {type(e).__name__} without {match!r}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            self.failures.append(f"{what}: raised {type(e).__name__}: {e}, expected {exc.__name__}")
            return
        self.failures.append(f"{what}: did not raise {exc.__name__}")

    def done(self, name: str) -> int:
        if self.failures:
            for f in self.failures:
                print(f"FAIL {f}")
            print(f"FAILED {name} {len(self.failures)} of {self.count}")
            return 1
        print(f"OK {name} {self.count} checks")
        return 0


def worker_ops(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """Every operation, every dtype that applies; sums checked exactly."""
    r, w = comm.rank, comm.world_size
    dev = comm.device
    ck = _Checker(r)
    n = 37  # uneven chunks
    ops = ["sum", "prod", "max", "min", "avg"]
    skip_fp8_avg = comm.backend == "nccl" and args.no_fp8_avg

    # all_reduce, in place, every reducible dtype and op
    for dt in REDUCIBLE:
        for op in ops:
            if dt == "complex64" and op not in ("sum", "avg"):
                continue
            if dt in FP8 and (comm.backend == "nccl" and not getattr(comm._engine, "fp8", True)):
                continue
            if dt in FP8 and op == "avg" and skip_fp8_avg:
                continue
            a = ig.from_numpy(_values(dt, r, n, op), device=dev)
            try:
                comm.all_reduce(a, op=op)
                ck.eq(f"all_reduce {dt} {op}", a.to_numpy(), _expected(dt, op, w, n))
            except Exception as e:  # noqa: BLE001
                ck.failures.append(f"all_reduce {dt} {op}: {type(e).__name__}: {e}")
                if comm.error is not None:
                    return ck.done("ops")

    # all_reduce out of place, ReduceOp enum
    a = ig.from_numpy(_values("float32", r, n), device=dev)
    out = ig.zeros(n, "float32", device=dev)
    res = comm.all_reduce(a, out, op=ReduceOp.MAX)
    ck.eq("all_reduce out-of-place returns recv", np.array(res is out), np.array(True))
    ck.eq("all_reduce out-of-place", out.to_numpy(), _expected("float32", "max", w, n))
    ck.eq("all_reduce out-of-place leaves send", a.to_numpy(), _values("float32", r, n))

    # reduce to the last rank; other ranks' recv untouched
    root = w - 1
    for dt in ("int32", "float32", "bfloat16"):
        for op in ops:
            a = ig.from_numpy(_values(dt, r, n, op), device=dev)
            out = ig.full(n, -1, dt, device=dev)
            comm.reduce(a, out, root=root, op=op)
            want = _expected(dt, op, w, n) if r == root else np.full(n, -1, ig.dtype(dt).numpy)
            ck.eq(f"reduce {dt} {op} root={root}", out.to_numpy(), want)
    a = ig.from_numpy(_values("int64", r, n), device=dev)
    comm.reduce(a, root=0)
    ck.eq("reduce in place", a.to_numpy(), _expected("int64", "sum", w, n) if r == 0 else _values("int64", r, n))

    # broadcast every dtype from the last rank
    for dt in ig.dtypes.names():
        src = (np.arange(n) % 2 == 1) if dt == "bool" else _values(dt, root, n)
        a = ig.from_numpy(src.astype(ig.dtype(dt).numpy) if r == root else
                          np.zeros(n, ig.dtype(dt).numpy), device=dev)
        comm.broadcast(a, root=root)
        ck.eq(f"broadcast {dt}", a.to_numpy().view(np.uint8), src.astype(ig.dtype(dt).numpy).view(np.uint8))

    # all_gather every dtype (recv given, default, and in place)
    for dt in ig.dtypes.names():
        mine = _values(dt, r, n) if dt != "bool" else (np.arange(n) + r) % 2 == 0
        mine = mine.astype(ig.dtype(dt).numpy)
        want = np.concatenate([(_values(dt, q, n) if dt != "bool" else (np.arange(n) + q) % 2 == 0)
                               .astype(ig.dtype(dt).numpy) for q in range(w)])
        a = ig.from_numpy(mine, device=dev)
        out = ig.zeros(w * n, dt, device=dev)
        comm.all_gather(a, out)
        ck.eq(f"all_gather {dt}", out.to_numpy().view(np.uint8), want.view(np.uint8))
    a = ig.from_numpy(_values("float32", r, n), device=dev)
    g = comm.all_gather(a)
    ck.eq("all_gather default recv shape", np.array(g.shape), np.array((w, n)))
    ck.eq("all_gather default recv", g.to_numpy().reshape(-1),
          np.concatenate([_values("float32", q, n) for q in range(w)]))
    big = ig.zeros((w, n), "int32", device=dev)
    big[r].from_host(_values("int32", r, n))
    comm.all_gather(big[r], big)
    ck.eq("all_gather in place", big.to_numpy().reshape(-1),
          np.concatenate([_values("int32", q, n) for q in range(w)]))

    # reduce_scatter: every reducible dtype with sum, every op on float32
    for dt, op in [(dt, "sum") for dt in REDUCIBLE] + [("float32", op) for op in ops]:
        if dt in FP8 and comm.backend == "nccl" and not getattr(comm._engine, "fp8", True):
            continue
        full_in = _values(dt, r, w * n, op)
        a = ig.from_numpy(full_in, device=dev)
        out = ig.zeros(n, dt, device=dev)
        comm.reduce_scatter(a, out, op=op)
        ck.eq(f"reduce_scatter {dt} {op}", out.to_numpy(), _expected(dt, op, w, w * n)[r * n:(r + 1) * n])
    a = ig.from_numpy(np.stack([_values("float64", r, n)] * w) * (np.arange(w)[:, None] + 1), device=dev)
    rs = comm.reduce_scatter(a)
    ck.eq("reduce_scatter default recv", rs.to_numpy(), sum(_values("float64", q, n) for q in range(w)) * (r + 1))

    # send/recv around the ring, in a group, every dtype
    nxt, prv = (r + 1) % w, (r - 1) % w
    for dt in ig.dtypes.names():
        mine = (_values(dt, r, n) if dt != "bool" else (np.arange(n) + r) % 3 == 0).astype(ig.dtype(dt).numpy)
        theirs = (_values(dt, prv, n) if dt != "bool" else (np.arange(n) + prv) % 3 == 0).astype(ig.dtype(dt).numpy)
        a = ig.from_numpy(mine, device=dev)
        b = ig.zeros(n, dt, device=dev)
        with comm.group():
            comm.send(a, nxt)
            comm.recv(b, prv)
        ck.eq(f"ring send/recv {dt}", b.to_numpy().view(np.uint8), theirs.view(np.uint8))
    # a plain pair, outside a group: rank 0 -> rank 1
    if w >= 2 and r in (0, 1):
        a = ig.from_numpy(np.arange(n, dtype=np.float32) + 100 * r, device=dev)
        if r == 0:
            comm.send(a, 1)
        else:
            comm.recv(a, 0)
            ck.eq("send/recv pair", a.to_numpy(), np.arange(n, dtype=np.float32))

    # a group of several collectives
    xs = [ig.from_numpy(_values("float32", r, n) + k, device=dev) for k in range(3)]
    with comm.group():
        for x in xs:
            comm.all_reduce(x)
    for k, x in enumerate(xs):
        ck.eq(f"grouped all_reduce {k}", x.to_numpy(), _expected("float32", "sum", w, n) + w * k)

    # clear errors, raised on the rank that made the mistake (every rank makes them: nothing is issued)
    f32 = ig.zeros(n, "float32", device=dev)
    ck.raises("shape mismatch", ValueError, lambda: comm.all_reduce(f32, ig.zeros(n + 1, "float32", device=dev)),
              "same shape and dtype")
    ck.raises("dtype mismatch", ValueError, lambda: comm.all_reduce(f32, ig.zeros(n, "float16", device=dev)),
              "same shape and dtype")
    ck.raises("all_gather size", ValueError, lambda: comm.all_gather(f32, ig.zeros(n, "float32", device=dev)),
              "world_size")
    ck.raises("reduce_scatter size", ValueError,
              lambda: comm.reduce_scatter(f32, ig.zeros(n + 1, "float32", device=dev)), "world_size")
    ck.raises("int16 has no reduction", ValueError, lambda: comm.all_reduce(ig.zeros(n, "int16", device=dev)),
              "NCCL has no sum reduction for int16")
    ck.raises("bool has no reduction", ValueError, lambda: comm.all_reduce(ig.zeros(n, "bool", device=dev),
                                                                            op="max"), "bool")
    ck.raises("complex prod", ValueError, lambda: comm.all_reduce(ig.zeros(n, "complex64", device=dev), op="prod"),
              "sum or avg")
    ck.raises("unknown op", ValueError, lambda: comm.all_reduce(f32, op="mean"), "unknown reduction")
    ck.raises("root out of range", ValueError, lambda: comm.broadcast(f32, root=w), "not a rank")
    ck.raises("peer out of range", ValueError, lambda: comm.send(f32, -1), "not a rank")
    ck.raises("numpy array", TypeError, lambda: comm.all_reduce(np.zeros(3, np.float32)), "NvArray")
    other = (dev.ordinal + 1) % ig.device_count()
    if other != dev.ordinal:
        ck.raises("wrong device", ValueError, lambda: comm.all_reduce(ig.zeros(n, "float32", device=other)),
                  f"on device {other}")
    dead = ig.zeros(n, "float32", device=dev)
    dead.free()
    ck.raises("freed array", ig.UseAfterFreeError, lambda: comm.all_reduce(dead))
    ck.eq("nothing left acquired", np.array([f32.owner]), np.array(["compute"]))
    comm.barrier()
    return ck.done("ops")


def worker_ownership(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """'collective' while a group holds the arrays, 'compute' after; other layers refused;
    cross-stream order without host synchronization."""
    r, w = comm.rank, comm.world_size
    dev = comm.device
    ck = _Checker(r)
    n = 1 << 16
    a = ig.zeros(n, "float32", device=dev)
    with comm.group():
        comm.all_reduce(a)
        ck.eq("owner during group", np.array([a.owner]), np.array(["collective"]))
        ck.raises("free while the collective holds it", ig.MemoryContractViolation, lambda: a.free())
        comm.all_reduce(a, op="max")  # the same array twice in one group
    ck.eq("owner after group", np.array([a.owner]), np.array(["compute"]))
    comm.all_reduce(a)
    ck.eq("owner after call", np.array([a.owner]), np.array(["compute"]))

    b = ig.zeros(n, "float32", device=dev)
    ig.contract.acquire(b, "io")
    ck.raises("held by io", ig.MemoryContractViolation, lambda: comm.all_reduce(b), "'io'")
    ck.eq("still io's", np.array([b.owner]), np.array(["io"]))
    ig.contract.release(b, "io")
    b.incref()
    b.incref()
    ck.raises("shared array", ig.MemoryContractViolation, lambda: comm.broadcast(b), "shared")
    b.decref()
    b.decref()
    ig.contract.acquire(b, "collective")
    ck.raises("double acquire", ig.MemoryContractViolation, lambda: comm.all_reduce(b), "already owned")
    ig.contract.release(b, "collective")
    ck.raises("group with a refused array issues nothing", ig.MemoryContractViolation,
              lambda: _group_with_refusal(comm, a, b))
    ck.eq("group released what it held", np.array([a.owner, b.owner]), np.array(["compute", "io"]))
    ig.contract.release(b, "io")

    # Stream order: a write queued on another stream, the collective, then a write and a
    # read on other streams; nothing synchronizes the host in between.
    s1 = dev.create_stream()
    s2 = dev.create_stream()
    for it in range(5):
        x = ig.empty(n, "float32", device=dev)
        x.fill_(float(r + 1 + it), stream=s1)
        comm.all_reduce(x)
        y = x.clone(stream=s2)              # reads after the collective
        x.fill_(-1.0, stream=s1)            # writes after the collective's read and write
        want = sum(q + 1 + it for q in range(w))
        ck.eq(f"reader on another stream waits ({it})", y.to_numpy(stream=s2)[::4099], np.full(16, want, np.float32))
        ck.eq(f"writer on another stream waits ({it})", x.to_numpy(stream=s1)[::4099], np.full(16, -1, np.float32))
    z = ig.full(n, 2.0, "float32", device=dev)
    comm.all_reduce(z)
    z.free()  # freed right after the call: the memory returns in stream order, behind the collective
    comm.synchronize()
    s1.close()
    s2.close()
    comm.barrier()
    return ck.done("ownership")


def _group_with_refusal(comm, a, b) -> None:  # type: ignore[no-untyped-def]
    ig.contract.acquire(b, "io")
    with comm.group():
        comm.all_reduce(a)
        comm.all_reduce(b)


def worker_die(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """The last rank dies; the others must raise CollectiveError naming it and the operation.
    With ``--flag DIR``, a survivor stays until every survivor has caught it: one that exited
    first would be a second death, which a slower survivor could see first and name."""
    r, w = comm.rank, comm.world_size
    comm.barrier()
    if args.flag:  # the death comes after every survivor left the barrier (a death inside it fails it)
        Path(args.flag, f"passed{r}").touch()
    if r == w - 1:
        if args.flag:
            for other in range(w - 1):
                _wait_flag(str(Path(args.flag, f"passed{other}")), limit=args.timeout)
        os._exit(3)
    a = ig.full(1 << 12, 1.0, "float32", device=comm.device)
    t0 = time.monotonic()
    if args.mode == "late":  # the death is known before the call: the call is named, as the failed one
        while comm.error is None and time.monotonic() - t0 < args.timeout:
            time.sleep(0.005)
    try:
        comm.all_reduce(a)
        comm.synchronize()
    except CollectiveError as e:
        took = time.monotonic() - t0
        ok = e.rank == w - 1 and "all_reduce" in str(e) and took < args.timeout and e.kind == "peer_died"
        if not ok:
            print(f"FAIL expected a peer_died error naming rank {w - 1} and all_reduce")
        print(f"CAUGHT rank={e.rank} kind={e.kind} took={took:.2f}s: {e}")
        try:
            comm.all_reduce(a)
        except CollectiveError as again:
            print(f"AGAIN {again}")
        else:
            ok = False
        if args.flag:
            Path(args.flag, f"caught{r}").touch()
            for other in range(w - 1):
                _wait_flag(str(Path(args.flag, f"caught{other}")), limit=args.timeout)
        return 0 if ok else 1
    print("NOT RAISED")
    return 1


def worker_hang(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """The last rank stays alive but never calls the collective: a time-out naming it."""
    r, w = comm.rank, comm.world_size
    comm.barrier()
    if r == w - 1:
        time.sleep(args.timeout * 3)
        return 0
    a = ig.full(64, 1.0, "float32", device=comm.device)
    t0 = time.monotonic()
    try:
        comm.all_reduce(a)
        comm.synchronize()
    except CollectiveTimeoutError as e:
        took = time.monotonic() - t0
        print(f"CAUGHT rank={e.rank} kind={e.kind} took={took:.2f}s: {e}")
        return 0 if "all_reduce" in str(e) and took < args.timeout * 2 + 2 else 1
    print("NOT RAISED")
    return 1


def worker_mismatch(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """The ranks call different operations, sizes or dtypes (``--mode``): every rank gets a clear
    mismatch error naming another rank, before the time-out; what its call was to write is
    poisoned, what it only read is intact, and nothing else is touched: arrays made before, new
    arrays on new streams, kernels, the device itself all go on."""
    r, w = comm.rank, comm.world_size
    dev = comm.device
    ck = _Checker(r)
    api = getattr(args, "api", None)
    keep = ig.full(64, 3.0, "float32", device=dev)  # an array the failure has nothing to do with
    comm.barrier()
    if api is not None:
        api.hang = True  # as NCCL's kernels do, a mismatched all_reduce waits until the abort
    mode = args.mode or "reduce-bcast"
    wrote: list = []
    read: list = []
    x = ig.full(64, float(r + 1), "float32", device=dev)
    t0 = time.monotonic()
    try:
        if mode == "reduce-bcast":        # rank 0 all_reduce, the others broadcast from rank 0
            if r == 0:
                comm.all_reduce(x)
            else:
                comm.broadcast(x, root=0)
            wrote.append(x)
        elif mode == "bcast-reduce":      # rank 0 broadcasts (only reads x), the others all_reduce
            if r == 0:
                comm.broadcast(x, root=0)
                read.append((x, float(r + 1)))
            else:
                comm.all_reduce(x)
                wrote.append(x)
        elif mode == "gather-sizes":      # each rank gathers a different number of elements
            s = ig.full(8 + r, float(r), "float32", device=dev)
            read.append((s, float(r)))
            wrote.append(comm.all_gather(s))
        elif mode == "dtypes":            # float32 on rank 0, int32 elsewhere
            if r != 0:
                x = ig.full(64, r + 1, "int32", device=dev)
            comm.all_reduce(x)
            wrote.append(x)
        elif mode == "p2p-sizes":         # rank 0 sends 64 elements, rank 1 receives 9
            if api is not None:
                api.refuse_p2p = True     # as NCCL 2.28 does on two H200s: an internal error at the call
            if r == 0:
                comm.send(x, 1)
                read.append((x, float(r + 1)))
            elif r == 1:
                x = ig.zeros(9, "float32", device=dev)
                comm.recv(x, 0)
                wrote.append(x)
        else:
            raise ValueError(mode)
        comm.synchronize()
        # NCCL may finish a mismatched call without the peer's half (a send into the peer's buffers;
        # a fake call always): then the matcher reports the mismatch by itself, a moment later.
        while comm.error is None and time.monotonic() - t0 < args.timeout / 2:
            time.sleep(0.01)
        err = comm.error
    except CollectiveError as e:
        err = e
    took = time.monotonic() - t0
    if err is None:
        ck.failures.append("no error")
    else:
        print(f"CAUGHT kind={err.kind} rank={err.rank} took={took:.2f}s: {err}")
        ck.count += 1
        # With three ranks, one may learn of it from a rank that found it first and left meanwhile
        # (its goodbye carries the mismatch).
        relayed = err.kind == "peer_failed" and "(a different" in str(err)
        if (err.kind != "mismatch" and not relayed) or err.rank in (None, r) or not 0 <= err.rank < w \
                or err.this_rank != r:
            ck.failures.append(f"expected a mismatch naming another rank, got kind={err.kind} rank={err.rank}: {err}")
        if took > args.timeout / 2:
            ck.failures.append(f"the mismatch took {took:.1f} s to be found: the time-out found it, not a check")
    for a in wrote:
        ck.raises("what the call was to write", CollectiveError, lambda: a.to_numpy(), "was to write it")
    for a, value in read:
        ck.eq("what the call only read", a.to_numpy(), np.full(a.shape, value, np.float32))
    ck.raises("the failed communicator", CollectiveError, comm.barrier)
    ck.eq("an array made before", keep.to_numpy(), np.full(64, 3.0, np.float32))
    keep.fill_(4.0)
    ck.eq("... is still written", keep.to_numpy(), np.full(64, 4.0, np.float32))
    s2 = dev.create_stream()
    fresh = ig.full(1 << 12, 5.0, "float32", device=dev, stream=s2)
    ck.eq("a new array on a new stream", fresh.to_numpy()[::512], np.full(8, 5.0, np.float32))
    other = ig.zeros(64, "float32", device=dev)
    ig.kernels.copy(other, keep)
    ck.eq("a kernel", other.to_numpy(), np.full(64, 4.0, np.float32))
    try:
        dev.synchronize()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        ck.failures.append(f"the device is unusable after the failed collective: {type(e).__name__}: {e}")
    fresh.free()
    s2.close()
    return ck.done(f"mismatch-{mode}")


# -- failed collectives poison what they were to write (issue 14, item 7) ---------------------------
_CAUSE = {"die": "died", "close": "closed its communicator", "raise": "raised RuntimeError: boom",
          "timeout": "sent nothing", "mismatch": "called broadcast"}
_NCCL_CAUSE = {**_CAUSE, "timeout": "did not finish within"}  # the NCCL engine's time-out is its watchdog's


def _cause(comm: "ig.collective.Communicator", mode: str) -> str:
    """What the failure caused by ``mode`` says, as this communicator's engine words it."""
    if comm.backend == "emulated":
        return _CAUSE[mode]
    if mode == "die" and comm.bindings != "fake":
        return ""  # real NCCL may report a dead peer itself (an asynchronous error) before Ignis does
    return _NCCL_CAUSE[mode]


def _wait_flag(path: str, limit: float = 60.0) -> None:
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > limit:
            raise RuntimeError(f"flag {path} never appeared")
        time.sleep(0.01)


def _misbehave(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """Rank 1, once rank 0 has queued its collectives: die, close, raise, hang past the
    time-out, or call another operation."""
    _wait_flag(args.flag)
    mode = args.mode
    if mode == "die":
        os._exit(3)
    if mode == "close":
        comm.close()
        return 0
    if mode == "raise":
        raise RuntimeError("boom")  # uncaught: the interpreter exits through the atexit close
    if mode == "timeout":
        time.sleep(args.timeout * 3)
        os._exit(0)
    a = ig.full(64, 1.0, "float32", device=comm.device)
    try:
        comm.broadcast(a, root=0)  # rank 0 called all_reduce: on NCCL, raised here (rooted calls are checked first)
        comm.synchronize()
    except CollectiveError as e:
        print(f"CAUGHT kind={e.kind}: {e}")
        return 0
    print("NOT RAISED")
    return 1


def _stuck_until_abort(args: argparse.Namespace) -> None:
    """Under fake NCCL bindings (``--fake``), this rank's next all_reduces wait on the stream until
    the communicator is aborted, as real NCCL kernels wait for a peer that does not come."""
    api = getattr(args, "api", None)
    if api is not None:
        api.hang = True


def _poison_checks(ck: "_Checker", comm: "ig.collective.Communicator", arr: "ig.NvArray", op: str,
                   cause: str, peer: int) -> None:
    """Every access to ``arr`` raises CollectiveError naming ``op``, this rank, ``peer`` and the
    cause; no access returns data."""
    z = ig.zeros(arr.shape, arr.dtype, device=comm.device)

    def use() -> None:
        with arr.use():
            pass

    accesses = [("to_numpy", lambda: arr.to_numpy()), ("clone", lambda: arr.clone()),
                ("view to_numpy", lambda: arr.reshape(-1)[1:3].to_numpy()),
                ("fill_", lambda: arr.fill_(0)), ("copy into another array", lambda: z.copy_(arr)),
                ("launch", lambda: ig.kernels.copy(z, arr)), ("use()", use),
                ("DLPack export", lambda: arr.__dlpack__())]
    for what, fn in accesses:
        ck.count += 1
        try:
            got = fn()
        except CollectiveError as e:
            text = str(e)
            # NCCL's time-out and asynchronous errors cannot name the rank at fault
            need = [op, f"rank {comm.rank}", cause, f"NvArray#{arr.id}"] + (
                [f"rank {peer}"] if e.rank is not None or comm.backend == "emulated" else [])
            missing = [s for s in need if s not in text]
            if missing or e.this_rank != comm.rank or (e.rank is not None and e.rank != peer):
                ck.failures.append(f"{what} of {op}'s target: {missing} not in the error "
                                   f"(this_rank={e.this_rank}, rank={e.rank}): {e}")
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            ck.failures.append(f"{what} of {op}'s target raised {type(e).__name__}, not CollectiveError: {e}")
        else:
            ck.failures.append(f"{what} of {op}'s target returned {got!r}: stale data came back")


def _solo_group() -> "ig.collective.Communicator":
    return ig.collective.init_process_group(rank=0, world_size=1, master_port=free_port(), timeout=10)


def worker_poison(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """Rank 0 queues three all_reduces (in place; out of place; into a view); rank 1 then
    misbehaves (--mode). Once rank 0 has learned of it (no synchronize), every target of
    the three is poisoned, the read-only input is not, and synchronize() raises
    CollectiveError."""
    comm.barrier()  # all_reduce #1
    if comm.rank != 0:
        return _misbehave(comm, args)
    _stuck_until_abort(args)
    ck = _Checker(comm.rank)
    n = 64
    dev = comm.device
    x = ig.full(n, 1.0, "float32", device=dev)
    s = ig.full(n, 2.0, "float32", device=dev)
    y = ig.full(n, -1.0, "float32", device=dev)
    big = ig.full((2, n), -1.0, "float32", device=dev)
    row0 = big[0]                        # a view made before the failure
    comm.all_reduce(x)                   # all_reduce #2: the one that fails
    comm.all_reduce(s, y)                # #3 and #4: queued behind it
    comm.all_reduce(big[1])
    Path(args.flag).touch()
    t0 = time.monotonic()
    while comm.error is None:            # no synchronize: the engine learns of it by itself
        if time.monotonic() - t0 > args.timeout + 20:
            print("FAILED: the communicator never learned of the failure")
            return 1
        time.sleep(0.01)
    took = time.monotonic() - t0
    cause = _cause(comm, args.mode)
    err = comm.error
    print(f"LEARNED kind={err.kind} rank={err.rank} after {took:.2f}s: {err}")
    if args.mode != "timeout":  # a death, a goodbye or a mismatch is seen at once, not at the time-out
        ck.eq(f"the failure was seen before the time-out ({took:.2f} s)", np.array([took < args.timeout / 2]),
              np.array([True]))
    ck.eq("the failure names rank 1", np.array([err.rank in (1, None) if comm.backend == "nccl" else err.rank == 1]),
          np.array([True]))
    solo = _solo_group()
    for arr, op in ((x, "all_reduce #2"), (y, "all_reduce #3"), (big, "all_reduce #4"), (row0, "all_reduce #4")):
        _poison_checks(ck, comm, arr, op, cause, 1)
        ck.raises(f"{op}'s target in the next collective", CollectiveError, lambda: comm.all_reduce(arr),
                  "all_reduce #2")  # the communicator itself failed
        ck.raises(f"{op}'s target in another communicator", CollectiveError, lambda: solo.all_reduce(arr), op)
    ck.eq("the read-only input is left alone", s.to_numpy(), np.full(n, 2.0, np.float32))
    ck.raises("synchronize", CollectiveError, comm.synchronize, "all_reduce #2")
    ck.raises("barrier", CollectiveError, comm.barrier, "all_reduce #2")
    ck.raises("a view made after the failure", CollectiveError, lambda: big[1], "all_reduce #4")
    for a in (x, y, s):
        a.free()                          # freeing stays allowed
    solo.close()
    return ck.done(f"poison-{args.mode}")


def worker_poison_race(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """Rank 0 reads its all_reduce's target at once, before rank 1 closes: the read waits on
    the device, then fails; it never returns the un-reduced input."""
    import threading
    comm.barrier()
    if comm.rank != 0:
        return _misbehave(comm, args)
    _stuck_until_abort(args)
    ck = _Checker(comm.rank)
    x = ig.full(64, 1.0, "float32", device=comm.device)
    comm.all_reduce(x)
    threading.Timer(0.3, Path(args.flag).touch).start()  # rank 1 closes while the read waits
    cause = _cause(comm, args.mode)
    # The host read is queued before the failure is known; the failed call ends (NCCL's kernel
    # returns once aborted), the read runs, and re-checks the array after its wait. The clone
    # comes after the failure was known: refused at once.
    for what, fn in (("to_numpy", lambda: x.to_numpy()), ("clone", lambda: x.clone().to_numpy())):
        ck.count += 1
        try:
            got = fn()
        except CollectiveError as e:
            if "all_reduce #2" not in str(e) or cause not in str(e):
                ck.failures.append(f"{what}: the error does not name the operation and the cause: {e}")
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            ck.failures.append(f"{what} raised {type(e).__name__}, not CollectiveError: {e}")
        else:
            ck.failures.append(f"{what} returned {got!r}: stale data came back")
    _poison_checks(ck, comm, x, "all_reduce #2", cause, 1)
    try:
        comm.device.synchronize()  # only the communicator failed: the device is fine
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        ck.failures.append(f"the device is unusable after the failed collective: {type(e).__name__}: {e}")
    return ck.done("poison-race")


# -- roots are checked (issue 14, item 8) ---------------------------------------------------------
def _roots(case: str, rank: int, world: int) -> tuple[str, int]:
    """(operation, root) that rank ``rank`` calls in ``case``."""
    if case == "broadcast-own":        # every rank names itself: each would keep its own data
        return "broadcast", rank
    if case == "broadcast-other":      # every rank names another: each would wait for data
        return "broadcast", (rank + 1) % world
    if case == "reduce-own":
        return "reduce", rank
    if case == "reduce-last-differs":  # only the last rank names another root
        return "reduce", 1 if rank == world - 1 else 0
    raise ValueError(case)


def _root_checks(ck: "_Checker", comm: "ig.collective.Communicator", case: str, grouped: bool) -> None:
    """Call ``case``'s rooted operation (after an all_reduce in one group when ``grouped``):
    every rank raises a root mismatch naming a rank whose root differs and both roots; what
    the call was to write is poisoned, what it only read is intact."""
    r, w = comm.rank, comm.world_size
    name, root = _roots(case, r, w)
    others = {q: _roots(case, q, w)[1] for q in range(w)}
    differ = [q for q in range(w) if others[q] != root]
    label = f"{name} #{comm._seq + 1 + grouped}"
    x = ig.full(8, float(r + 1), "float32", device=comm.device)
    y = ig.full(8, 1.0, "float32", device=comm.device)
    try:
        if grouped:
            with comm.group():
                comm.all_reduce(y)
                getattr(comm, name)(x, root=root)
        else:
            getattr(comm, name)(x, root=root)
        comm.synchronize()
    except CollectiveError as e:
        ck.count += 1
        want = [label, f"root={root}", "root"] + ([f"root={others[e.rank]}"] if e.rank in others else [])
        if e.kind != "mismatch" or e.rank not in differ or any(s not in str(e) for s in want):
            ck.failures.append(f"{case}: expected a root mismatch in {label} naming one of ranks {differ}, got "
                               f"kind={e.kind} rank={e.rank}: {e}")
        else:
            print(f"CAUGHT {e}")
    else:
        ck.failures.append(f"{case}: no error; x={x.to_numpy()}")
    ck.raises("barrier after the mismatch", CollectiveError, comm.barrier, label)
    wrote = root != r if name == "broadcast" else root == r
    if wrote:  # this rank's x was to receive: poisoned
        ck.raises("the target of the mismatched call", CollectiveError, lambda: x.to_numpy(), label)
    else:      # this rank's x was only read: intact
        ck.eq("the input of the mismatched call", x.to_numpy(), np.full(8, r + 1, np.float32))
    if grouped:  # the group failed as one call
        ck.raises("the all_reduce target of the failed group", CollectiveError, lambda: y.to_numpy(), "all_reduce")


def worker_roots(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    ck = _Checker(comm.rank)
    comm.barrier()
    _root_checks(ck, comm, args.mode, args.grouped)
    return ck.done(f"roots-{args.mode}")


def _fake_nccl_group(api: "FakeNccl", timeout: float):  # type: ignore[no-untyped-def]
    """This launched rank's group, as init_process_group builds it for NCCL, over fake bindings:
    the rendezvous, the checker mesh and the watchdog are real."""
    from ignis.collective import process_group as pg
    from ignis.collective.communicator import Communicator, Health
    from ignis.collective.rendezvous import Rendezvous
    env = pg.read_env()
    dev = ig.Device(env.local_rank)
    health = Health(env.rank)
    rdzv = Rendezvous(env.master_addr, env.master_port, env.rank, env.world_size, timeout)
    stream = dev.create_stream()
    engine = pg._nccl_engine(api, env, dev, health, timeout, rdzv, stream)
    return Communicator(engine, rank=env.rank, world_size=env.world_size, device=dev, stream=stream,
                        timeout=timeout, health=health, rendezvous=rdzv)


def _fake_default_group(args: argparse.Namespace) -> "ig.collective.Communicator":
    """``--fake``: this rank's default group over fake NCCL bindings (``args.api``), closed at
    interpreter exit as ``init_process_group``'s is (aborted, saying why, after an uncaught error)."""
    import atexit

    from ignis.collective import process_group as pg
    api = args.api = FakeNccl()
    comm = _fake_nccl_group(api, args.timeout)
    api.failed = lambda: comm._health.claimed is not None  # the failure is claimed (poisoned, gates released)
    pg._default = comm
    atexit.register(pg._close_at_exit)
    return comm


def worker_nccl_roots(_comm: None, args: argparse.Namespace) -> int:
    """The NCCL engine's root check (fake bindings, real processes): matching roots pass;
    mismatched ones fail every rank before NCCL is called."""
    api = FakeNccl()
    comm = _fake_nccl_group(api, args.timeout)
    api.failed = lambda: comm._health.claimed is not None  # the failure is claimed (poisoned, gates released)
    ck = _Checker(comm.rank)
    x = ig.full(8, 1.0, "float32", device=comm.device)
    comm.broadcast(x, root=0)
    comm.reduce(x, root=1)
    with comm.group():
        comm.broadcast(x, root=1)
        comm.all_reduce(x)
    comm.synchronize()
    ck.eq("matching roots reach NCCL", np.array([c[0] for c in api.calls]),
          np.array(["broadcast", "reduce", "group_start", "broadcast", "all_reduce", "group_end"]))
    ck.eq("... and run on the stream with no failure", np.array([f for _, f in api.ran]), np.array([False] * 3))
    api.ran.clear()
    before = len(api.calls)
    _root_checks(ck, comm, args.mode, args.grouped)
    time.sleep(0.1)
    ck.eq("the mismatched call (its whole group) never reached NCCL", np.array([c[0] for c in api.calls[before:]]
                                                                              + ["-"]), np.array(["-"]))
    ck.eq("... and nothing ran on the stream", np.array(len(api.ran)), np.array(0))
    t0 = time.monotonic()
    while not api.aborted and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    ck.eq("the watchdog aborted NCCL", np.array([api.aborted]), np.array([True]))
    comm.close()
    return ck.done(f"nccl-roots-{args.mode}")
def worker_nccl_gives_up(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """(``--fake``) Both ranks' all_reduce waits in "NCCL"; rank 0 alone gets an NCCL error. It tells
    rank 1 that it gives up before it aborts, so rank 1 fails at once (not at its time-out), naming
    rank 0 and the cause, and poisons its own target. Rank 0 stays until rank 1 has seen it: only
    its goodbye on failure can have told rank 1."""
    r = comm.rank
    ck = _Checker(r)
    api = args.api
    comm.barrier()
    api.hang = True
    x = ig.full(64, 1.0, "float32", device=comm.device)
    comm.all_reduce(x)  # all_reduce #2, stuck on both ranks
    t0 = time.monotonic()
    if r == 0:
        api.error = "unhandled system error (ncclSystemError)"
    while comm.error is None and time.monotonic() - t0 < args.timeout + 5:
        time.sleep(0.01)
    took = time.monotonic() - t0
    err = comm.error
    print(f"LEARNED after {took:.2f}s: {err!r}")
    if err is None:
        return ck.done("gives-up") or 1
    if r == 0:
        ck.eq("rank 0: NCCL's error", np.array([err.kind]), np.array(["nccl"]))
        _wait_flag(args.flag, limit=args.timeout)
    else:
        ck.eq("rank 1: rank 0 gave up", np.array([err.kind, err.rank], dtype=object),
              np.array(["peer_failed", 0], dtype=object))
        ck.eq("rank 1: at once", np.array([took < args.timeout / 2]), np.array([True]))
        ck.eq("rank 1: the cause", np.array(["ncclSystemError" in str(err)]), np.array([True]))
        Path(args.flag).touch()
    ck.raises("the target", CollectiveError, lambda: x.to_numpy(), "all_reduce #2")
    return ck.done("gives-up")


def worker_nccl_early(comm: "ig.collective.Communicator", args: argparse.Namespace) -> int:
    """(``--fake``) Rank 0's send finishes before rank 1 makes the matching receive (NCCL may finish
    a send into the peer's buffers): rank 0's synchronize() confirms what rank 1 has made so far
    and returns, without waiting for rank 1 to make its call; the receive is compared later."""
    r = comm.rank
    ck = _Checker(r)
    comm.barrier()
    x = ig.full(16, 1.0, "float32", device=comm.device)
    if r == 0:
        t0 = time.monotonic()
        comm.send(x, 1)
        comm.synchronize()
        took = time.monotonic() - t0
        ck.eq(f"rank 0's synchronize did not wait for rank 1's receive ({took:.2f} s)", np.array([took < 3.0]),
              np.array([True]))
    else:
        time.sleep(6.0)
        comm.recv(x, 0)
        comm.synchronize()
    comm.barrier()
    ck.eq("no failure", np.array([comm.error is None]), np.array([True]))
    return ck.done("early")


WORKERS = {"ops": worker_ops, "ownership": worker_ownership, "die": worker_die, "hang": worker_hang,
           "mismatch": worker_mismatch, "poison": worker_poison, "poison_race": worker_poison_race,
           "roots": worker_roots, "nccl_roots": worker_nccl_roots, "nccl_gives_up": worker_nccl_gives_up,
           "nccl_early": worker_nccl_early}
SELF_INIT = {"nccl_roots"}  # build their own communicator


def _worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("worker", choices=sorted(WORKERS))
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--no-fp8-avg", action="store_true")
    p.add_argument("--mode", default="")
    p.add_argument("--flag", default="")
    p.add_argument("--grouped", action="store_true")
    p.add_argument("--fake", action="store_true", help="the NCCL engine over fake bindings (FakeNccl)")
    args = p.parse_args(argv)
    # A rank that hangs prints every thread's stack and exits, so the test says where instead of
    # waiting for the test time-out (the workers' own waits are bounded by --timeout).
    import faulthandler
    faulthandler.dump_traceback_later(max(30.0, 1.5 * args.timeout + 15), exit=True)
    if args.worker in SELF_INIT:
        rc = WORKERS[args.worker](None, args)
        sys.stdout.flush()
        return rc
    comm = _fake_default_group(args) if args.fake else ig.collective.init_process_group(timeout=args.timeout)
    rc = WORKERS[args.worker](comm, args)
    sys.stdout.flush()
    if args.worker in ("die", "hang"):
        os._exit(rc)  # peers may be gone or stuck: no goodbyes
    comm.close()
    return rc


# ----------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------
def _launch(n: int, worker: str, *extra: str, backend: str = "emulated", grace: float = 30.0,
            env: dict[str, str] | None = None) -> tuple[int, str]:
    out = io.StringIO()
    penv = {"IGNIS_BACKEND": backend, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
            "NCCL_NVLS_ENABLE": "0"}
    penv.update(env or {})
    rc = launch(n, str(HERE), [worker, *extra], env=penv, grace=grace, out=out)
    return rc, out.getvalue()


@pytest.mark.parametrize("world", [2, 4])
def test_every_operation_and_dtype(world):
    rc, out = _launch(world, "ops")
    assert rc == 0, out
    for r in range(world):
        assert f"[rank {r}] OK ops" in out, out


def test_ownership_and_stream_order_with_jitter():
    rc, out = _launch(2, "ownership", env={"IGNIS_EMU_JITTER": "7:300"})
    assert rc == 0, out
    assert out.count("OK ownership") == 2, out


@pytest.mark.parametrize("mode", ["", "late"])
def test_dying_rank_is_named_on_the_others(tmp_path, mode):
    t0 = time.monotonic()
    rc, out = _launch(3, "die", "--timeout", "20", "--flag", str(tmp_path), *(["--mode", mode] if mode else []))
    took = time.monotonic() - t0
    assert rc == 3, out  # the dead rank's status
    for r in (0, 1):
        assert f"[rank {r}] CAUGHT rank=2" in out, out
        assert f"[rank {r}] AGAIN" in out, out
    assert "ignis launch: 1 of 3 rank(s) failed (rank 2: exit 3)" in out, out
    assert took < 20, f"detection took {took:.1f} s: it waited for the time-out instead of seeing the death"


def test_hanging_rank_times_out_naming_it():
    rc, out = _launch(2, "hang", "--timeout", "1.5")
    assert rc == 0, out
    assert "[rank 0] CAUGHT rank=1 kind=timeout" in out, out


@pytest.mark.parametrize("world,mode", [(2, "reduce-bcast"), (2, "bcast-reduce"), (3, "bcast-reduce"),
                                        (2, "gather-sizes"), (2, "dtypes")])
def test_mismatched_calls_are_refused_on_every_rank_and_poison_only_their_targets(world, mode):
    rc, out = _launch(world, "mismatch", "--mode", mode, "--timeout", "20")
    assert rc == 0, out
    assert out.count("CAUGHT kind=") == world, out
    if "bcast" in mode:
        assert "broadcast" in out and "all_reduce" in out, out


@pytest.mark.parametrize("mode", ["reduce-bcast", "bcast-reduce", "gather-sizes", "dtypes", "p2p-sizes"])
def test_nccl_engine_refuses_mismatched_calls_on_every_rank(mode):
    """The NCCL engine's call matcher (fake bindings, real processes, the real checker mesh):
    NCCL itself compares nothing between ranks."""
    rc, out = _launch(2, "mismatch", "--fake", "--mode", mode, "--timeout", "20")
    assert rc == 0, out
    assert out.count("CAUGHT kind=mismatch") == 2, out


# -- in-process: a group of one, bootstrap errors ---------------------------------------------------
@pytest.fixture
def solo():
    comm = ig.collective.init_process_group(rank=0, world_size=1, timeout=10)
    yield comm
    comm.close()


def test_group_of_one_runs_every_operation(solo):
    comm = solo
    a = ig.from_numpy(np.arange(10, dtype=np.float32), device=comm.device)
    comm.all_reduce(a, op="avg")
    comm.broadcast(a)
    comm.reduce(a, op="max")
    g = comm.all_gather(a)
    rs = comm.reduce_scatter(g)
    with comm.group():
        comm.send(a, 0)
        b = comm.recv(ig.zeros(10, "float32", device=comm.device), 0)
    assert np.array_equal(rs.to_numpy(), np.arange(10, dtype=np.float32))
    assert np.array_equal(b.to_numpy(), np.arange(10, dtype=np.float32))
    assert a.owner == b.owner == "compute"
    assert "rank=0/1" in repr(comm)


def test_strided_arrays_are_refused(solo):
    class Strided(ig.NvArray):
        strides = (4, 32)  # every 8th element of each row: not contiguous

    a = Strided((4, 4), "float32", device=solo.device)
    with pytest.raises(ValueError, match="not contiguous"):
        solo.all_reduce(a)
    assert a.owner == "compute"
    Strided.strides = (16, 4)  # C order, in bytes: fine
    solo.all_reduce(a)


def test_closed_communicator_refuses(solo):
    solo.close()
    solo.close()  # idempotent
    with pytest.raises(CollectiveError, match="closed"):
        solo.all_reduce(ig.zeros(4, "float32", device=solo.device))


def test_default_communicator():
    assert not ig.collective.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ig.collective.get_communicator()
    comm = ig.collective.init_process_group(rank=0, world_size=1)
    assert ig.collective.get_communicator() is comm
    ig.collective.destroy_process_group()
    assert comm.is_closed and not ig.collective.is_initialized()


def test_close_callbacks_run_once_and_cannot_break_close(solo):
    seen = []

    def boom(c):
        raise RuntimeError("a callback's own error")

    solo.on_close(seen.append)
    solo.on_close(boom)
    solo.on_close(seen.append)
    with pytest.raises(TypeError, match="function"):
        solo.on_close(42)
    solo.close()
    solo.close()
    assert seen == [solo, solo] and solo.is_closed


def test_rank_that_cannot_reach_rank0_times_out():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=f"127.0.0.1:{port}"):
        ig.collective.init_process_group(rank=1, world_size=2, master_port=port, timeout=0.5, device=0)
    assert time.monotonic() - t0 < 5


def test_rank0_names_the_ranks_that_never_joined():
    with pytest.raises(CollectiveTimeoutError, match=r"rank\(s\) \[1, 2\] did not join"):
        ig.collective.init_process_group(rank=0, world_size=3, master_port=free_port(), timeout=0.5)


def test_environment_is_validated():
    read = ig.collective.read_env
    assert read(env={}).world_size == 1
    g = read(env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1234"})
    assert (g.rank, g.world_size, g.local_rank, g.master_addr, g.master_port) == (1, 2, 1, "127.0.0.1", 1234)
    with pytest.raises(ValueError, match="WORLD_SIZE is not set"):
        read(env={"RANK": "0"})
    with pytest.raises(ValueError, match="RANK=2 is not valid"):
        read(env={"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="not an integer"):
        read(env={"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="timeout"):
        ig.collective.init_process_group(rank=0, world_size=1, timeout=0)


def test_backend_must_fit_the_ignis_backend():
    other = "nccl" if ig.backend_name() == "emulated" else "emulated"
    with pytest.raises(ig.UnsupportedError):
        ig.collective.init_process_group(other, rank=0, world_size=1)
    with pytest.raises(ValueError, match="unknown collective backend"):
        ig.collective.init_process_group("gloo", rank=0, world_size=1)


def test_errors_pickle():
    import pickle
    e = CollectiveTimeoutError("rank 1 sent nothing", op="all_reduce #3", rank=1, this_rank=0, kind="timeout")
    e2 = pickle.loads(pickle.dumps(e))
    assert isinstance(e2, TimeoutError) and isinstance(e2, ig.IgnisError)
    assert (e2.rank, e2.op, e2.kind, str(e2)) == (1, "all_reduce #3", "timeout", str(e))
    assert "collective all_reduce #3 failed on rank 0" in str(e)


# -- the NCCL engine, driven by fake bindings (its enqueue path, watchdog and abort run anywhere) ----------
class FakeNccl:
    """Stands in for NCCL bindings: records calls; an armed call blocks its stream until abort."""

    name = "fake"
    version = 22800

    def __init__(self, async_error: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.aborted = False
        self.destroyed = False
        self.hang = False
        self.fault = False              # the next all_reduce's "kernel" faults (its host function raises)
        self.refuse_p2p = False         # send/recv raise, as NCCL does at a send/recv pair of other sizes
        self.error = async_error
        self.ran: list[tuple] = []      # (operation, failed()) when a broadcast/reduce "kernel" ran
        self.failed = lambda: False
        self.watch: tuple = ()          # arrays whose poisoning abort() records
        self.poisoned_at_abort: list[bool] = []
        import threading
        self.release = threading.Event()

    def unique_id(self) -> bytes:
        return bytes(range(128))

    def init_rank(self, n, uid, rank):  # type: ignore[no-untyped-def]
        return ("comm", n, rank)

    def _enqueue(self, st):  # type: ignore[no-untyped-def]
        if self.hang:
            ig.get_backend().launch_host_func(st, lambda: self.release.wait(30))
        if self.fault:
            self.fault = False

            def fault() -> None:
                raise RuntimeError("an illegal memory access was encountered")
            ig.get_backend().launch_host_func(st, fault)

    def _mark(self, name, st):  # type: ignore[no-untyped-def]
        ig.get_backend().launch_host_func(st, lambda: self.ran.append((name, self.failed())))

    def all_reduce(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self.calls.append(("all_reduce", s, r, n, dt, op))
        self._enqueue(st)

    def broadcast(self, h, s, r, n, dt, root, st):  # type: ignore[no-untyped-def]
        self.calls.append(("broadcast", s, r, n, dt, root))
        self._mark("broadcast", st)

    def reduce(self, h, s, r, n, dt, op, root, st):  # type: ignore[no-untyped-def]
        self.calls.append(("reduce", s, r, n, dt, op, root))
        self._mark("reduce", st)

    def all_gather(self, h, s, r, n, dt, st):  # type: ignore[no-untyped-def]
        self.calls.append(("all_gather", s, r, n, dt))

    def reduce_scatter(self, h, s, r, n, dt, op, st):  # type: ignore[no-untyped-def]
        self.calls.append(("reduce_scatter", s, r, n, dt, op))

    def send(self, h, s, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self.calls.append(("send", s, n, dt, peer))
        if self.refuse_p2p:
            raise RuntimeError("NCCL_ERROR_INTERNAL_ERROR: internal error - please report this issue")

    def recv(self, h, r, n, dt, peer, st):  # type: ignore[no-untyped-def]
        self.calls.append(("recv", r, n, dt, peer))
        if self.refuse_p2p:
            raise RuntimeError("NCCL_ERROR_INTERNAL_ERROR: internal error - please report this issue")

    def group_start(self) -> None:
        self.calls.append(("group_start",))

    def group_end(self) -> None:
        self.calls.append(("group_end",))

    def abort(self, h) -> None:  # type: ignore[no-untyped-def]
        self.poisoned_at_abort = [_poisoned(a) for a in self.watch]
        self.aborted = True
        self.release.set()  # NCCL's abort makes stuck kernels return

    def destroy(self, h) -> None:  # type: ignore[no-untyped-def]
        self.destroyed = True

    def async_error(self, h):  # type: ignore[no-untyped-def]
        return self.error


def _poisoned(a: "ig.NvArray") -> bool:
    """Whether ``a`` is poisoned, asked without queuing anything (a view checks the gate)."""
    try:
        a.reshape(-1)
    except CollectiveError:
        return True
    return False


def _fake_comm(api: FakeNccl, timeout: float = 10.0, device: int = 0):  # type: ignore[no-untyped-def]
    from ignis.collective.communicator import Communicator, Health
    from ignis.collective.nccl import NcclEngine
    dev = ig.Device(device)
    health = Health(0)
    stream = dev.create_stream()
    engine = NcclEngine(api, 0, 2, dev, health, timeout)
    engine.init(api.unique_id(), stream)
    return Communicator(engine, rank=0, world_size=2, device=dev, stream=stream, timeout=timeout, health=health)


def test_nccl_engine_forwards_pointers_counts_and_codes():
    api = FakeNccl()
    comm = _fake_comm(api)
    a = ig.zeros(10, "bfloat16")
    b = ig.zeros(20, "complex64")
    c = ig.zeros(20, "complex64")
    comm.all_reduce(a, op="max")
    comm.all_reduce(b, c, op="avg")
    comm.broadcast(b, root=1)
    comm.reduce(a, root=1)
    g = comm.all_gather(a)
    comm.reduce_scatter(g)
    with comm.group():
        comm.send(a, 1)
        comm.recv(b, 1)
    calls = api.calls
    assert calls[0] == ("all_reduce", a.device_ptr, a.device_ptr, 10, 9, 2)
    assert calls[1] == ("all_reduce", b.device_ptr, c.device_ptr, 40, 7, 4)    # complex64 avg: float32 pairs
    assert calls[2] == ("broadcast", b.device_ptr, b.device_ptr, 160, 1, 1)    # data movement: bytes
    assert calls[3] == ("reduce", a.device_ptr, a.device_ptr, 10, 9, 0, 1)     # not the root: send only
    assert calls[4] == ("all_gather", a.device_ptr, g.device_ptr, 20, 1)
    assert calls[5][0] == "reduce_scatter" and calls[5][3:] == (10, 9, 0)
    assert [c[0] for c in calls[6:]] == ["group_start", "send", "recv", "group_end"]
    assert calls[7][1:] == (a.device_ptr, 20, 1, 1)
    comm.close()
    assert api.destroyed and not api.aborted


def test_nccl_watchdog_aborts_a_stuck_operation():
    api = FakeNccl()
    comm = _fake_comm(api, timeout=0.3)
    api.hang = True
    a = ig.zeros(10, "float32")
    comm.all_reduce(a)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="all_reduce #1") as info:
        comm.synchronize()
    assert time.monotonic() - t0 < 3
    assert api.aborted and info.value.kind == "timeout"
    with pytest.raises(CollectiveError, match="failed earlier, in all_reduce #1"):
        comm.broadcast(a)
    assert a.owner == "compute"
    comm.close()
    assert not api.destroyed  # a failed communicator is aborted, never destroyed


def test_nccl_async_error_and_dead_peer_fail_the_communicator():
    api = FakeNccl(async_error="remote process exited (ncclRemoteError)")
    comm = _fake_comm(api)
    with pytest.raises(CollectiveError, match="ncclRemoteError"):
        for _ in range(100):
            comm.synchronize()
            time.sleep(0.02)
    assert api.aborted
    comm.close()

    api = FakeNccl()
    comm = _fake_comm(api)
    comm._health.peer_died(1, "rank 1 died")
    assert api.aborted
    with pytest.raises(CollectiveError, match="rank 1 died") as info:
        comm.all_reduce(ig.zeros(4, "float32"))
    assert info.value.rank == 1
    comm.close()


def _assert_poisoned(a: "ig.NvArray", op: str, cause: str) -> None:
    """Every access to ``a`` raises CollectiveError naming ``op``, rank 0 and ``cause``; none returns."""
    def use() -> None:
        with a.use():
            pass
    for fn in (a.to_numpy, a.clone, lambda: a.fill_(0), use, lambda: a.__dlpack__(),
               lambda: ig.kernels.copy(ig.zeros(a.numel, a.dtype, device=a.device), a)):
        with pytest.raises(CollectiveError) as info:
            fn()
        e = info.value
        assert op in str(e) and cause in str(e) and f"NvArray#{a.id}" in str(e), str(e)
        assert e.op == op and e.this_rank == 0 and e.kind == "failed_earlier"
        assert isinstance(e.__cause__, CollectiveError)


def _half_mesh(reader_delay: float):
    """Rank 0's loopback engine with one real connection to a rank 1 played by the test; its
    reader starts ``reader_delay`` seconds late (as on a loaded host)."""
    import socket
    import threading

    from ignis.collective.communicator import Health
    from ignis.collective.loopback import LoopbackEngine, _Peer

    eng = LoopbackEngine(0, 2, None, Health(0), 5.0)
    mine, theirs = socket.socketpair()
    peer = eng._peers[1] = _Peer(1, mine)
    peer.reader = threading.Timer(reader_delay, eng._read, args=(peer,))
    return eng, peer, theirs


def test_a_failed_send_names_the_reason_the_peer_gave_before_it_left():
    # Rank 1 says why it gives up and closes before rank 0's reader has read that: rank 0's
    # next send fails on the closed connection, and its error must still carry the reason.
    import json

    from ignis.collective.loopback import _BYE, _FRAME, _MAGIC

    eng, peer, theirs = _half_mesh(0.3)
    why = json.dumps({"tag": _BYE, "why": "rank 1 raised RuntimeError: boom"}).encode()
    theirs.sendall(_FRAME.pack(_MAGIC, len(why), 0) + why)
    theirs.close()
    peer.reader.start()
    with pytest.raises(CollectiveError) as info:
        eng._send(1, {"tag": "x"}, np.zeros(64, np.uint8), "all_reduce #2")
    assert info.value.kind == "peer_failed" and info.value.rank == 1, info.value
    assert "raised RuntimeError: boom" in str(info.value) and "all_reduce #2" in str(info.value)


def test_a_failed_send_to_a_peer_that_left_without_a_word_says_it_died():
    eng, peer, theirs = _half_mesh(0.1)
    theirs.close()
    peer.reader.start()
    t = time.monotonic()
    with pytest.raises(CollectiveError) as info:
        eng._send(1, {"tag": "x"}, np.zeros(64, np.uint8), "all_reduce #2")
    assert info.value.kind == "peer_died" and "sending to it failed" in str(info.value), info.value
    assert time.monotonic() - t < 1.5  # it waited for the reader's end, not for the whole drain


def test_health_poisons_before_it_publishes_the_failure():
    from ignis.collective.communicator import Health
    h = Health(0)
    seen = []
    h.add_hook(lambda e: seen.append(("first", h.error, h.claimed)), first=True)
    h.add_hook(lambda e: seen.append(("then", h.error, h.claimed)))
    err = CollectiveError("rank 1 died", rank=1, this_rank=0, kind="peer_died")
    assert h.fail(err) and not h.fail(CollectiveError("later", op="all_reduce #3", this_rank=0))
    assert seen[0] == ("first", None, err)  # the poison lands before anyone can see the failure
    assert seen[1][0] == "then" and seen[1][1] is err
    assert h.error.op == "all_reduce #3" and h.error.rank == 1  # a first failure takes a later report's op


def test_the_first_error_a_program_sees_is_the_failure_itself():
    """A failure found on another thread (here: a mismatch) reaches the program's next call with
    its own kind and the rank it names; later calls get "failed_earlier"."""
    from ignis.collective.communicator import Health
    h = Health(1)
    h.fail(CollectiveError("rank 0 called all_reduce(8 x float32) where this rank called broadcast(...)",
                           op="broadcast #2", rank=0, this_rank=1, kind="mismatch"))
    first = h.report("synchronize")
    assert (first.kind, first.rank, first.op) == ("mismatch", 0, "synchronize"), first
    assert "failed earlier, in broadcast #2" in str(first) and "called all_reduce" in str(first)
    later = h.report("barrier")
    assert (later.kind, later.rank) == ("failed_earlier", 0), later
    h2 = Health(0)
    h2.fail(CollectiveError("rank 1 died", op="all_reduce #3", rank=1, this_rank=0, kind="peer_died"))
    h2.told()  # the call that found it raised it
    assert h2.report("all_reduce #4").kind == "failed_earlier"
    h3 = Health(0)  # found before any operation was in flight: the first call to fail is named
    h3.fail(CollectiveError("rank 2 died", rank=2, this_rank=0, kind="peer_died"))
    first = h3.report("all_reduce")
    assert (first.kind, first.rank, first.op) == ("peer_died", 2, "all_reduce") and "all_reduce" in str(first)


def test_nccl_async_error_poisons_in_flight_targets_before_the_abort():
    api = FakeNccl()
    comm = _fake_comm(api)
    api.hang = True  # the "kernels" wait until the abort
    x = ig.full(16, 1.0, "float32")
    s = ig.full(16, 2.0, "float32")
    y = ig.full(16, -1.0, "float32")
    big = ig.zeros((2, 16), "float32")
    other_row = big[0]  # a view made before: poisoned with its root (a view made after is refused)
    comm.all_reduce(x)
    comm.all_reduce(s, y)
    comm.all_reduce(big[1])  # a view: its root is poisoned
    api.watch = (x, y, big)
    api.error = "remote process exited (ncclRemoteError)"
    with pytest.raises(CollectiveError, match="ncclRemoteError"):
        comm.synchronize()
    assert api.aborted and api.poisoned_at_abort == [True, True, True]
    _assert_poisoned(x, "all_reduce #1", "ncclRemoteError")
    _assert_poisoned(y, "all_reduce #2", "ncclRemoteError")
    _assert_poisoned(big, "all_reduce #3", "ncclRemoteError")
    _assert_poisoned(other_row, "all_reduce #3", "ncclRemoteError")
    with pytest.raises(CollectiveError, match="all_reduce #3"):
        big[0]
    assert np.array_equal(s.to_numpy(), np.full(16, 2.0, np.float32))  # only read: left alone
    with pytest.raises(CollectiveError, match="all_reduce #1"):
        comm.all_reduce(s)
    for a in (x, y, s):
        a.free()  # freeing stays allowed
    comm.close()


def test_nccl_next_collective_asks_for_async_errors():
    api = FakeNccl()
    comm = _fake_comm(api)
    engine = comm._engine
    engine._stop.set()  # no watchdog: only the calls themselves can see the error
    engine._watchdog.join(2)
    api.hang = True
    x = ig.full(16, 1.0, "float32")
    comm.all_reduce(x)
    api.watch = (x,)
    api.error = "unhandled system error (ncclSystemError)"
    z = ig.full(16, 3.0, "float32")
    time.sleep(0.002)  # calls ask at most once a millisecond
    with pytest.raises(CollectiveError, match="ncclSystemError") as info:
        comm.all_reduce(z)  # raised before anything is queued: z is untouched, and not poisoned
    assert "failed earlier, in all_reduce #1" in str(info.value) and comm.error.kind == "nccl"
    assert api.aborted and api.poisoned_at_abort == [True]
    assert len([c for c in api.calls if c[0] == "all_reduce"]) == 1
    assert np.array_equal(z.to_numpy(), np.full(16, 3.0, np.float32))
    _assert_poisoned(x, "all_reduce #1", "ncclSystemError")
    comm.close()


def test_nccl_watchdog_time_out_poisons_before_the_abort():
    api = FakeNccl()
    comm = _fake_comm(api, timeout=0.3)
    api.hang = True
    x = ig.full(16, 1.0, "float32")
    comm.all_reduce(x)
    api.watch = (x,)
    with pytest.raises(CollectiveTimeoutError, match="all_reduce #1"):
        comm.synchronize()
    assert api.poisoned_at_abort == [True]
    _assert_poisoned(x, "all_reduce #1", "did not finish within 0.3 s")
    comm.close()


def test_nccl_calls_known_finished_are_not_poisoned():
    api = FakeNccl()
    comm = _fake_comm(api)
    done = ig.full(16, 1.0, "float32")
    comm.all_reduce(done)
    comm.synchronize()  # it finished: a later failure must not poison it
    api.hang = True
    x = ig.full(16, 1.0, "float32")
    comm.all_reduce(x)
    comm._health.peer_died(1, "rank 1's connection to the rendezvous closed without a goodbye: the process died")
    assert api.aborted
    _assert_poisoned(x, "all_reduce #2", "the process died")
    assert np.array_equal(done.to_numpy(), np.full(16, 1.0, np.float32))
    comm.close()

    # A peer that exits right after the last call: everything finished, nothing is poisoned,
    # even before the watchdog's next look.
    api = FakeNccl()
    comm = _fake_comm(api)
    last = ig.full(16, 1.0, "float32")
    comm.all_reduce(last)
    comm.stream.synchronize()  # finished on the stream; the communicator was not asked
    comm._health.peer_died(1, "rank 1's connection to the rendezvous closed without a goodbye: the process died")
    assert np.array_equal(last.to_numpy(), np.full(16, 1.0, np.float32))
    comm.close()


def test_nccl_stream_failure_is_a_collective_error():
    if ig.get_backend().name != "emulated":
        pytest.skip("a raising host function models a failed stream on the emulator only; on a GPU a fault "
                    "is sticky to the context (the two-GPU tests cover NCCL's own failures)")
    dev = ig.Device(ig.device_count() - 1)  # its context is rebuilt at the end: the failure is sticky
    api = FakeNccl()
    comm = _fake_comm(api, device=dev.ordinal)
    try:
        api.fault = True
        x = ig.full(16, 1.0, "float32", device=dev)
        comm.all_reduce(x)
        with pytest.raises(CollectiveError, match="illegal memory access") as info:
            comm.synchronize()
        assert not isinstance(info.value, ig.DriverError) and info.value.kind == "stream"
        _assert_poisoned(x, "all_reduce #1", "illegal memory access")
        comm.close()
    finally:
        dev.rebuild()


def test_missing_nccl_bindings_are_explained(monkeypatch):
    from ignis.collective import nccl
    monkeypatch.setattr(nccl, "_loaded", [])
    monkeypatch.setenv("IGNIS_NCCL_BINDINGS", "nope")
    with pytest.raises(ValueError, match="IGNIS_NCCL_BINDINGS"):
        nccl.load_bindings()
    monkeypatch.setattr(nccl, "_BINDINGS", {"broken": lambda: (_ for _ in ()).throw(ImportError("no lib"))})
    monkeypatch.delenv("IGNIS_NCCL_BINDINGS")
    with pytest.raises(CollectiveError, match="broken: ImportError: no lib"):
        nccl.load_bindings()


# -- failed collectives poison their targets; roots are checked (real processes) --------------------------
@pytest.mark.parametrize("mode,status", [("die", 3), ("close", 0), ("raise", 1), ("timeout", 0), ("mismatch", 0)])
def test_failed_collective_poisons_what_it_was_to_write(mode, status, tmp_path):
    t = "1.5" if mode == "timeout" else "20"
    rc, out = _launch(2, "poison", "--mode", mode, "--flag", str(tmp_path / "go"), "--timeout", t)
    assert f"[rank 0] OK poison-{mode}" in out, out
    assert rc == status, out


def test_a_read_queued_before_the_failure_never_returns_stale_data(tmp_path):
    rc, out = _launch(2, "poison_race", "--mode", "close", "--flag", str(tmp_path / "go"), "--timeout", "20")
    assert "[rank 0] OK poison-race" in out, out
    assert rc == 0, out


@pytest.mark.parametrize("mode,status", [("die", 3), ("close", 0), ("raise", 1), ("timeout", 0), ("mismatch", 0)])
def test_nccl_engine_failed_collective_poisons_what_it_was_to_write(mode, status, tmp_path):
    """The NCCL engine's failure paths over fake bindings whose all_reduce waits on the stream until
    the abort, as a real NCCL kernel waits for a peer: a death, a goodbye (closed, or gave up after
    an error) and a mismatch are seen at once; a silent peer at the watchdog's time-out; errors name
    the oldest unfinished call."""
    t = "1.5" if mode == "timeout" else "20"
    rc, out = _launch(2, "poison", "--fake", "--mode", mode, "--flag", str(tmp_path / "go"), "--timeout", t)
    assert f"[rank 0] OK poison-{mode}" in out, out
    assert rc == status, out


def test_nccl_engine_synchronize_never_waits_for_a_peer_to_make_its_call():
    rc, out = _launch(2, "nccl_early", "--fake", "--timeout", "20")
    assert rc == 0, out
    assert out.count("OK early") == 2, out


def test_nccl_engine_rank_that_gives_up_tells_the_others_first(tmp_path):
    rc, out = _launch(2, "nccl_gives_up", "--fake", "--flag", str(tmp_path / "seen"), "--timeout", "20")
    assert rc == 0, out
    assert out.count("OK gives-up") == 2, out


def test_nccl_engine_read_queued_before_the_failure_never_returns_stale_data(tmp_path):
    rc, out = _launch(2, "poison_race", "--fake", "--mode", "close", "--flag", str(tmp_path / "go"),
                      "--timeout", "20")
    assert "[rank 0] OK poison-race" in out, out
    assert rc == 0, out


@pytest.mark.parametrize("world,case,grouped", [(2, "broadcast-own", False), (2, "broadcast-other", True),
                                                (2, "reduce-own", False), (3, "reduce-last-differs", False)])
def test_root_mismatch_is_reported_on_every_rank(world, case, grouped):
    t0 = time.monotonic()
    rc, out = _launch(world, "roots", "--mode", case, "--timeout", "30", *(["--grouped"] if grouped else []))
    assert rc == 0, out
    for r in range(world):
        assert f"[rank {r}] OK roots-{case}" in out, out
    assert time.monotonic() - t0 < 30, "the mismatch was found by the time-out, not by the check"


@pytest.mark.parametrize("case,grouped", [("broadcast-own", False), ("broadcast-other", True),
                                          ("reduce-own", False)])
def test_nccl_engine_checks_roots_before_nccl_runs(case, grouped):
    rc, out = _launch(2, "nccl_roots", "--mode", case, "--timeout", "30", *(["--grouped"] if grouped else []))
    assert rc == 0, out
    assert out.count(f"OK nccl-roots-{case}") == 2, out


# -- the launcher and its command line -----------------------------------------------------------------
def test_launch_sets_the_group_environment_and_prefixes_output():
    out = io.StringIO()
    code = ("import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], "
            "os.environ['MASTER_ADDR'], int(os.environ['IGNIS_EMULATED_DEVICES']) >= 3)")
    assert launch(3, "-c", [code], out=out) == 0
    lines = sorted(out.getvalue().splitlines())
    assert lines == [f"[rank {r}] {r} 3 {r} 127.0.0.1 True" for r in range(3)]


def test_launch_returns_the_failing_status_and_stops_stragglers():
    out = io.StringIO()
    code = "import os, sys, time; r = os.environ['RANK']; sys.exit(5) if r == '1' else time.sleep(60)"
    t0 = time.monotonic()
    assert launch(2, "-c", [code], out=out, grace=0.5) == 5
    assert time.monotonic() - t0 < 20
    text = out.getvalue()
    assert "rank 1 failed; stopping" in text and "rank 1: exit 5" in text, text


def test_launch_rejects_bad_counts():
    with pytest.raises(ValueError):
        launch(0, "x.py")


def test_cli_parser():
    import argparse as ap

    from ignis.cli.collective import add_parser
    parser = ap.ArgumentParser(prog="ignis")
    sub = parser.add_subparsers(dest="command")
    add_parser(sub)
    args = parser.parse_args(["launch", "-n", "2", "--master-port", "29555", "train.py", "--lr", "3"])
    assert (args.nproc, args.master_port, args.script, args.args) == (2, 29555, "train.py", ["--lr", "3"])
    assert callable(args.func)
    with pytest.raises(SystemExit):
        parser.parse_args(["launch", "-n", "0", "x.py"])


# -- GPUs -------------------------------------------------------------------------------------------------
def _two_gpus() -> None:
    if ig.backend_name() != "cuda" or ig.device_count() < 2:
        pytest.skip(f"needs 2 GPUs (the {ig.backend_name()} backend has {ig.device_count()})")


@pytest.mark.gpu
@pytest.mark.parametrize("bindings", ["", "ctypes"])
def test_gpu_every_operation_gives_the_right_sums(bindings):
    _two_gpus()
    rc, out = _launch(2, "ops", "--timeout", "120", backend="cuda", env={"IGNIS_NCCL_BINDINGS": bindings})
    print(out)
    assert rc == 0, out
    assert out.count("OK ops") == 2, out


@pytest.mark.gpu
def test_gpu_ownership_and_stream_order():
    _two_gpus()
    rc, out = _launch(2, "ownership", "--timeout", "120", backend="cuda")
    assert rc == 0, out


@pytest.mark.gpu
def test_gpu_dying_rank_is_named():
    _two_gpus()
    rc, out = _launch(2, "die", "--timeout", "30", backend="cuda")
    print(out)
    assert rc == 3, out
    assert "[rank 0] CAUGHT rank=1" in out, out



@pytest.mark.gpu
def test_gpu_hanging_rank_is_aborted_by_the_watchdog():
    _two_gpus()
    rc, out = _launch(2, "hang", "--timeout", "3", backend="cuda")
    print(out)
    assert rc == 0, out
    assert "[rank 0] CAUGHT rank=None kind=timeout" in out or "[rank 0] CAUGHT rank=1 kind=timeout" in out, out

@pytest.mark.gpu
@pytest.mark.parametrize("mode,status", [("die", 3), ("close", 0), ("raise", 1), ("timeout", 0), ("mismatch", 0)])
def test_gpu_failed_collective_poisons_what_it_was_to_write(mode, status, tmp_path):
    """Rank 0's all_reduces wait in NCCL's kernels for rank 1, which dies, closes its communicator,
    gives up after an error, stays silent past the time-out, or calls broadcast. The kernels spin
    until rank 0 aborts its communicator (nothing else ends them): the death, the goodbye and the
    mismatch make it do so at once, the silence at the watchdog's time-out; what they were to write
    is poisoned first, and the failure names the oldest call that did not finish."""
    _two_gpus()
    rc, out = _launch(2, "poison", "--mode", mode, "--flag", str(tmp_path / "go"), "--timeout",
                      {"timeout": "3", "die": "60"}.get(mode, "20"), backend="cuda")
    print(out)
    assert f"[rank 0] OK poison-{mode}" in out, out
    assert rc == status, out


@pytest.mark.gpu
def test_gpu_a_read_queued_before_the_failure_never_returns_stale_data(tmp_path):
    """A host read of the target, queued while rank 0's all_reduce spins in NCCL: rank 1 closes its
    communicator (its ncclCommDestroy then waits for rank 0's connections), rank 0 learns it from
    the goodbye, poisons, aborts; the kernel returns, the read runs and re-checks: CollectiveError."""
    _two_gpus()
    rc, out = _launch(2, "poison_race", "--mode", "close", "--flag", str(tmp_path / "go"), "--timeout", "20",
                      backend="cuda")
    print(out)
    assert "[rank 0] OK poison-race" in out, out
    assert rc == 0, out


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-bcast", "bcast-reduce", "gather-sizes", "dtypes", "p2p-sizes"])
def test_gpu_mismatched_calls_are_refused_on_every_rank(mode):
    """NCCL compares nothing between ranks; the call matcher does, on every rank, within
    milliseconds: what the calls were to write is poisoned, the device and other arrays go on."""
    _two_gpus()
    rc, out = _launch(2, "mismatch", "--mode", mode, "--timeout", "20", backend="cuda")
    print(out)
    assert rc == 0, out
    assert out.count("CAUGHT kind=mismatch") == 2, out


@pytest.mark.gpu
@pytest.mark.parametrize("case,grouped", [("broadcast-own", False), ("broadcast-other", True),
                                          ("reduce-own", False)])
def test_gpu_root_mismatch_is_reported_before_nccl_runs(case, grouped):
    _two_gpus()
    rc, out = _launch(2, "roots", "--mode", case, "--timeout", "60", *(["--grouped"] if grouped else []),
                      backend="cuda")
    print(out)
    assert rc == 0, out
    assert out.count(f"OK roots-{case}") == 2, out


def test_reduce_op_code_is_ncclRedOp_t():
    assert [(m.name, m.code) for m in ReduceOp] == [(m.name, m.value) for m in ReduceOp] \
        == [("SUM", 0), ("PROD", 1), ("MAX", 2), ("MIN", 3), ("AVG", 4)]


def test_communicator_identity_is_read_only(backend):
    comm = ig.collective.init_process_group("nccl" if backend.name == "cuda" else "emulated", rank=0, world_size=1, master_addr="127.0.0.1",
                                            master_port=free_port())
    try:
        for name in ("rank", "world_size", "device", "stream", "timeout"):
            with pytest.raises(AttributeError):
                setattr(comm, name, getattr(comm, name))
        a = ig.full(8, 3.0, "float32")
        for _ in range(3):  # the last plan asked again, in place
            comm.all_reduce(a, op="max")
        b = ig.empty(8, "float32")
        comm.all_reduce(a, b, op="sum")
        assert (b.to_numpy() == 3.0).all() and a.owner == b.owner == "compute"
    finally:
        comm.close()



def test_an_operation_stays_out_of_the_cyclic_collector(backend):
    """One ``_Op`` is made per call: compiled, the cyclic collector does not track it (it
    would count toward the collector's runs, one every few hundred calls)."""
    import gc
    from ignis.collective import communicator as mod
    comm = ig.collective.init_process_group("nccl" if backend.name == "cuda" else "emulated", rank=0, world_size=1,
                                            master_addr="127.0.0.1", master_port=free_port())
    seen = []

    class Recording:  # the engine, with the operations it is handed noted
        def __init__(self, engine):
            self.engine = engine

        def run(self, ops, stream, targets):
            seen.extend(ops)
            return self.engine.run(ops, stream, targets)

        def __getattr__(self, name):
            return getattr(self.engine, name)
    try:
        comm._engine = Recording(comm._engine)
        a = ig.full(8, 2.0, "float32")
        comm.all_reduce(a)
        assert (a.to_numpy() == 2.0).all()
        assert [op.name for op in seen] == ["all_reduce"]
        if not mod.__file__.endswith(".py"):  # compiled
            assert not gc.is_tracked(seen[0])
    finally:
        comm._engine = comm._engine.engine if isinstance(comm._engine, Recording) else comm._engine
        comm.close()

if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
