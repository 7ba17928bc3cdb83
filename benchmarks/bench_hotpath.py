"""The hot path's figures (issue 18's table), each against its anchor, in one process on
one card, contenders in turns (a rotating order, repeat by repeat), medians:

1. pool allocate + free, 64 KiB, tracking on: ``PoolResource.allocate`` / ``deallocate``
   against CuPy's pool (``pool.malloc`` + del).
2. ``ig.empty`` + ``free()``, 64 KiB, against ``cupy.empty`` + del and ``torch.empty`` + del.
3. cross-stream ``arr.use()`` (READ_WRITE, alternating two streams) against what PyTorch
   needs for the same ordering: ``event.record(previous stream)`` + ``stream.wait_event``.
4. tracked ``ig.kernels.fill`` launch, sanitizer off, against ``torch.Tensor.fill_``.
5. the same launch with the sanitizer on, against the bare launch through the backend
   (no tracking): the sanitizer's added cost.
6. same-stream tracked use (``arr.use()`` on the array's own stream): driver calls per
   use (the backend's methods and tracking's direct driver calls both counted).

Launch figures are CPU-side µs per launch: the clock stops before the synchronize that
follows each repeat, and a repeat queues fewer launches than the driver's queue holds.
Run: ``PYTHONPATH=src python3 benchmarks/bench_hotpath.py [--quick] [--json OUT]``.
On the emulated backend the anchors are skipped and the numbers time the emulator.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable

import ignis as ig

KIB64 = 64 * 1024


def in_turns(fns: dict[str, Callable[[int], Any]], n: int, repeats: int,
             after: Callable[[], Any] | None = None) -> dict[str, dict[str, float]]:
    """µs per call of each ``fns[name](n)``: median and spread over ``repeats`` turns, the
    contenders in a rotating order; ``after`` runs after each timed call, untimed."""
    names = list(fns)
    for f in fns.values():  # warm: caches, pools, first-use setup, compilation
        f(max(1, n // 10))
        if after:
            after()
    samples: dict[str, list[float]] = {k: [] for k in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t = time.perf_counter()
                fns[k](n)
                samples[k].append((time.perf_counter() - t) / n * 1e6)
                if after:
                    after()
    finally:
        gc.enable()
    out = {}
    for k, v in samples.items():
        med = statistics.median(v)
        out[k] = {"median_us": med, "spread": (max(v) - min(v)) / med if med else 0.0}
    return out


def _torch(ordinal: int) -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_device(ordinal)
    torch.empty(1, device="cuda")  # initialize PyTorch's CUDA state
    return torch


def _cupy(ordinal: int) -> Any:
    try:
        import cupy
    except ImportError:
        return None
    cupy.cuda.Device(ordinal).use()
    cupy.empty(1)
    return cupy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (about 20 s on a GPU)")
    args = ap.parse_args(argv)
    repeats = 9 if args.quick else 21
    dev = ig.Device(0)
    be = dev.backend
    gpu = be.name == "cuda"
    torch = _torch(dev.ordinal) if gpu else None
    cupy = _cupy(dev.ordinal) if gpu else None
    dev.set_current()  # the anchors may have changed the thread's context
    res: dict[str, Any] = {"card": dev.name, "backend": be.name, "repeats": repeats,
                           "anchors": {"torch": getattr(torch, "__version__", None),
                                       "cupy": getattr(cupy, "__version__", None)}}
    sync = dev.synchronize

    # 1. pool pair
    pool = ig.PoolResource(ig.AsyncResource(dev))
    s0 = dev.default_stream

    def ig_pool(n: int) -> None:
        alloc, dealloc = pool.allocate, pool.deallocate
        for _ in range(n):
            dealloc(alloc(KIB64, s0))

    fns: dict[str, Callable[[int], Any]] = {"ignis_pool": ig_pool}
    if cupy is not None:
        malloc = cupy.get_default_memory_pool().malloc

        def cupy_pool(n: int) -> None:
            for _ in range(n):
                malloc(KIB64)  # the pointer is dropped at once: freed back to the pool
        fns["cupy_pool"] = cupy_pool
    res["pool_pair"] = in_turns(fns, 20000, repeats)

    # 2. array create + free
    def ig_empty(n: int) -> None:
        empty = ig.empty
        for _ in range(n):
            empty(KIB64 // 4, "float32").free()

    fns = {"ignis_empty_free": ig_empty}
    if cupy is not None:
        def cupy_empty(n: int) -> None:
            e = cupy.empty
            for _ in range(n):
                e(KIB64 // 4, cupy.float32)
        fns["cupy_empty_del"] = cupy_empty
    if torch is not None:
        def torch_empty(n: int) -> None:
            e, f32 = torch.empty, torch.float32
            for _ in range(n):
                e(KIB64 // 4, dtype=f32, device="cuda")
        fns["torch_empty_del"] = torch_empty
    res["empty_free"] = in_turns(fns, 20000, repeats)

    # 3. cross-stream use
    sa, sb = dev.create_stream(), dev.create_stream()
    arr = ig.empty(KIB64 // 4, "float32", stream=sa)
    rw = ig.Access.READ_WRITE

    def ig_cross(n: int) -> None:
        a, x, y = arr, sa, sb
        for i in range(n // 2):
            with a.use(x, rw):
                pass
            with a.use(y, rw):
                pass

    fns = {"ignis_cross_use": ig_cross}
    if torch is not None:
        ta, tb = torch.cuda.Stream(), torch.cuda.Stream()
        ev = torch.cuda.Event()

        def torch_cross(n: int) -> None:
            e, x, y = ev, ta, tb
            for i in range(n // 2):
                e.record(x)
                y.wait_event(e)
                e.record(y)
                x.wait_event(e)
        fns["torch_record_wait"] = torch_cross
    res["cross_stream_use"] = in_turns(fns, 4000, repeats, after=sync)

    # 4, 5. launches
    x = ig.empty(1024, "float32")
    k = ig.kernels.kernel("fill", 4)
    xs = x.stream
    one = 0x3F800000
    if gpu:
        import ctypes
        fn = k._function(dev)

        def bare(n: int) -> None:
            ptr, h, launch = x.device_ptr, xs.handle, be.kernel_launch
            for _ in range(n):  # what any caller does per launch: marshal the arguments, launch
                params = [ctypes.c_void_p(ptr), ctypes.c_uint32(one), ctypes.c_int64(1024)]
                launch(fn, (4, 1, 1), (256, 1, 1), 0, h, params)
    else:
        from ignis.array.launch import _host_call

        def bare(n: int) -> None:
            call, h, launch = _host_call(k, be, (x, one, 1024)), xs.handle, be.kernel_launch
            for _ in range(n):
                launch(call, (4, 1, 1), (256, 1, 1), 0, h, ())

    def tracked(n: int) -> None:
        f = ig.kernels.fill
        for _ in range(n):
            f(x, 1.0)

    def sanitized(n: int) -> None:
        with ig.sanitizer.enabled():
            tracked(n)

    fns = {"bare_launch": bare, "ignis_fill": tracked, "ignis_fill_sanitized": sanitized}
    if torch is not None:
        tx = torch.empty(1024, device="cuda")

        def torch_fill(n: int) -> None:
            f = tx.fill_
            for _ in range(n):
                f(1.0)
        fns["torch_fill_"] = torch_fill

    def sync_all() -> None:
        sync()
        if torch is not None:
            torch.cuda.synchronize()
    res["launch"] = in_turns(fns, 256, repeats * 3, after=sync_all)

    # 6. same-stream tracked use: driver calls
    from ignis.memory.resource import driver_calls
    counts: dict[str, int] = {}
    originals = {}
    for name in ("event_record", "stream_wait_event", "event_create", "event_query", "stream_synchronize"):
        originals[name] = getattr(be, name)

        def counted(*a: Any, _n: str = name, **kw: Any) -> Any:
            counts[_n] = counts.get(_n, 0) + 1
            return originals[_n](*a, **kw)
        setattr(be, name, counted)
    try:
        y = ig.empty(1024, "float32")
        with y.use():
            pass
        n_same = 10000
        counts.clear()
        before = driver_calls()
        for _ in range(n_same):
            with y.use():
                pass
        direct = {k2: v - before[k2] for k2, v in driver_calls().items()}
    finally:
        for name in originals:
            vars(be).pop(name, None)
    res["same_stream_use"] = {"uses": n_same, "backend_calls": dict(counts), "direct_driver_calls": direct,
                              "calls_per_use": (sum(counts.values()) + sum(direct.values())) / n_same}
    res["same_stream_use"].update(in_turns({"ignis_same_use": partial(_same, y)}, 20000, repeats)["ignis_same_use"])

    sync()
    for a in (arr, x, y):
        a.free()
    pool.close()
    report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _same(y: Any, n: int) -> None:
    for _ in range(n):
        with y.use():
            pass


def report(res: dict) -> None:
    def us(group: str, key: str) -> float | None:
        v = res.get(group, {}).get(key)
        return None if v is None else v["median_us"]

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or b is None else f"{a / b:.2f}"

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(f"bench_hotpath: {res['card']} on the {res['backend']} backend, {res['repeats']} turns, medians")
    if res["backend"] != "cuda":
        print("  ** emulated backend: these numbers time the emulator; anchors skipped")
    p_ig, p_cp = us("pool_pair", "ignis_pool"), us("pool_pair", "cupy_pool")
    print(f"  pool allocate + free 64 KiB      ignis {fmt(p_ig)} µs   cupy pool {fmt(p_cp)}   ratio {ratio(p_ig, p_cp)}"
          "   (target <= 1.00)")
    e_ig, e_cp, e_t = us("empty_free", "ignis_empty_free"), us("empty_free", "cupy_empty_del"), \
        us("empty_free", "torch_empty_del")
    faster = min([v for v in (e_cp, e_t) if v is not None], default=None)
    print(f"  ig.empty + free 64 KiB           ignis {fmt(e_ig)} µs   cupy {fmt(e_cp)}   torch {fmt(e_t)}   "
          f"ratio to the faster {ratio(e_ig, faster)}   (target <= 0.50)")
    c_ig, c_t = us("cross_stream_use", "ignis_cross_use"), us("cross_stream_use", "torch_record_wait")
    print(f"  cross-stream use                 ignis {fmt(c_ig)} µs   torch record + wait_event {fmt(c_t)}   "
          f"ratio {ratio(c_ig, c_t)}   (target <= 1.00)")
    f_ig, f_t = us("launch", "ignis_fill"), us("launch", "torch_fill_")
    print(f"  tracked fill launch              ignis {fmt(f_ig)} µs   torch fill_ {fmt(f_t)}   "
          f"ratio {ratio(f_ig, f_t)}   (target <= 1.00)")
    b, s = us("launch", "bare_launch"), us("launch", "ignis_fill_sanitized")
    added = None if b is None or s is None else s - b
    print(f"  launch, sanitizer on             {fmt(s)} µs   bare {fmt(b)}   added {fmt(added)} µs   (target <= 5)")
    ss = res["same_stream_use"]
    print(f"  same-stream tracked use          {ss['median_us']:.2f} µs   driver calls per use "
          f"{ss['calls_per_use']:.3g}   (target 0)")


if __name__ == "__main__":
    sys.exit(main())
