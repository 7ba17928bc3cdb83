"""NvArray benchmarks, in one process on one card, against the anchors installed there.

1. ``ig.empty`` + ``free()`` per pair (ownership and generation tracking on) against
   ``torch.empty`` + del and ``cupy.empty`` + del, at 256 B and 1 MiB; the three take
   turns, 21 rounds of 30000 pairs each, median.
2. ``from_numpy`` / ``to_numpy`` bandwidth for 256 MiB against the pinned copy peak
   measured in the same run (one pinned buffer, one async copy, events).
3. ``clone`` against a device-to-device copy through PyTorch (``torch.Tensor.clone``).

Run: ``PYTHONPATH=src python3 benchmarks/bench_array.py [--json OUT] [--quick]``.
On the emulated backend the numbers describe host memcpy, not a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import numpy as np

import ignis as ig


def round_robin(fns: dict, n: int, repeats: int) -> dict:
    """Median µs per call of each ``fns[name](n)``, the contenders taking turns (in a
    rotating order) so that drift in the host's speed reaches them all alike."""
    names = list(fns)
    for f in fns.values():
        f(1000)  # warm: caches, pools, first-use setup
    samples: dict = {k: [] for k in names}
    gc.disable()
    try:
        for r in range(repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t = time.perf_counter()
                fns[k](n)
                samples[k].append((time.perf_counter() - t) / n * 1e6)
    finally:
        gc.enable()
    return {k: statistics.median(v) for k, v in samples.items()}


def timed_ms(dev: ig.Device, stream: ig.Stream, fn, repeats: int) -> float:
    fn()
    stream.synchronize()
    out = []
    for _ in range(repeats):
        start = stream.record(timing=True)
        fn()
        end = stream.record(timing=True)
        end.synchronize()
        out.append(start.elapsed_ms(end))
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeats = 3 if args.quick else 7
    n_pairs = 5000 if args.quick else 30000
    dev = ig.Device(0)
    emulated = ig.backend_name() == "emulated"
    res: dict = {"card": dev.name, "backend": ig.backend_name(), "python": sys.version.split()[0]}
    print(f"card: {dev.name}   backend: {ig.backend_name()}   python {res['python']}")
    if emulated:
        print("note: emulated backend: these numbers describe host memory, not a GPU")

    # 1. empty + free
    torch = cupy = None
    try:
        import torch  # type: ignore
        if not torch.cuda.is_available():
            torch = None
    except Exception:
        torch = None
    try:
        import cupy  # type: ignore
    except Exception:
        cupy = None
    rows = {}
    for nbytes in (256, 1 << 20):
        n = nbytes // 4

        def ign(k: int) -> None:
            for _ in range(k):
                ig.empty(n, "float32").free()

        fns = {"ignis": ign}
        if torch is not None:
            tdev = torch.device("cuda", 0)

            def tor(k: int) -> None:
                for _ in range(k):
                    x = torch.empty(n, dtype=torch.float32, device=tdev)
                    del x

            fns["torch"] = tor
        if cupy is not None:
            def cup(k: int) -> None:
                for _ in range(k):
                    x = cupy.empty(n, dtype=cupy.float32)
                    del x

            fns["cupy"] = cup
        rows[nbytes] = round_robin(fns, n_pairs, 3 * repeats)
    res["empty_free_us"] = rows
    print("\n1. empty + free, µs per pair (lower is better)")
    for nbytes, r in rows.items():
        line = "   ".join(f"{k} {v:.3f}" for k, v in r.items())
        ratios = "   ".join(f"ignis/{k} {r['ignis'] / v:.2f}" for k, v in r.items() if k != "ignis")
        print(f"  {nbytes:>8} B: {line}   |   {ratios}")

    # 2. host copies vs the pinned peak
    size = (32 << 20) if (args.quick or emulated) else (256 << 20)
    s = dev.default_stream
    host = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    d = ig.empty(size, "uint8")
    pinned = ig.PinnedHostResource().allocate(size)
    pinned.array[:] = host
    be = dev.backend
    h2d_peak = timed_ms(dev, s, lambda: be.memcpy_htod_async(d.device_ptr, pinned.ptr, size, s.handle), repeats)
    d2h_peak = timed_ms(dev, s, lambda: be.memcpy_dtoh_async(pinned.ptr, d.device_ptr, size, s.handle), repeats)

    def wall(fn) -> float:
        fn()
        out = []
        for _ in range(repeats):
            dev.synchronize()
            t = time.perf_counter()
            fn()
            dev.synchronize()
            out.append((time.perf_counter() - t) * 1e3)
        return statistics.median(out)

    up_ms = wall(lambda: d.from_host_raw(host))

    # The host's own ceiling for the first half of a staged upload: pageable -> pinned
    # copies on 8 and 16 threads (NumPy releases the GIL), alone and while a DMA reads
    # another pinned buffer (as it does during an upload); the clock times the memcpy only.
    from concurrent.futures import ThreadPoolExecutor
    memcpy_gbps, memcpy_dma_gbps = {}, {}
    other = ig.PinnedHostResource().allocate(size)
    for threads in (8, 16):
        with ThreadPoolExecutor(threads) as ex:
            step = 4 << 20

            def staged() -> None:
                list(ex.map(lambda o: np.copyto(other.array[o:o + step], host[o:o + step]), range(0, size, step)))

            memcpy_gbps[threads] = size / wall(staged) / 1e6
            under = []
            for _ in range(repeats):
                dev.synchronize()
                for _ in range(3):  # about three times as long as the memcpy
                    be.memcpy_htod_async(d.device_ptr, pinned.ptr, size, s.handle)
                t = time.perf_counter()
                staged()
                under.append(time.perf_counter() - t)
            dev.synchronize()
            memcpy_dma_gbps[threads] = size / statistics.median(under) / 1e9
    other.release()
    # The two ways to upload pageable memory without staging it ourselves (cuda only):
    # the driver's own pageable copy, and pinning the source in place for one copy.
    alt_gbps = {}
    if not emulated:
        from cuda.bindings import driver as cu

        def ok(res) -> None:
            if int(res[0]) != 0:
                raise RuntimeError(f"driver call failed: {res[0]!r}")

        def registered() -> None:
            ptr = host.ctypes.data
            ok(cu.cuMemHostRegister(ptr, size, 0))
            try:
                be.memcpy_htod_async(d.device_ptr, ptr, size, s.handle)
                s.synchronize()
            finally:
                ok(cu.cuMemHostUnregister(ptr))

        alt_gbps["driver_pageable_copy"] = size / wall(
            lambda: be.memcpy_htod_async(d.device_ptr, host.ctypes.data, size, s.handle)) / 1e6
        alt_gbps["register_copy_unregister"] = size / wall(registered) / 1e6
    keep = []
    down_ms = wall(lambda: keep.append(d.to_numpy()) or keep.pop())
    assert d.to_numpy().tobytes() == host.tobytes()
    gbps = lambda ms: size / ms / 1e6  # noqa: E731
    res["copy_gbps"] = {"bytes": size, "pinned_h2d": gbps(h2d_peak), "pinned_d2h": gbps(d2h_peak),
                        "from_numpy": gbps(up_ms), "to_numpy": gbps(down_ms),
                        "host_memcpy_pageable_to_pinned": memcpy_gbps,
                        "host_memcpy_pageable_to_pinned_during_dma": memcpy_dma_gbps,
                        "pageable_alternatives": alt_gbps}
    c = res["copy_gbps"]
    print(f"\n2. host copies of {size >> 20} MiB, GB/s")
    print(f"  pinned peak h2d {c['pinned_h2d']:.1f}   from_numpy (pageable source) {c['from_numpy']:.1f}"
          f"   ratio {c['from_numpy'] / c['pinned_h2d']:.2f}")
    print("  host ceiling (no GPU): pageable -> pinned memcpy " +
          ", ".join(f"{t} threads {v:.1f}" for t, v in memcpy_gbps.items()) +
          f"   (best / pinned peak h2d {max(memcpy_gbps.values()) / c['pinned_h2d']:.2f})")
    print("  host ceiling during a DMA: pageable -> pinned memcpy " +
          ", ".join(f"{t} threads {v:.1f}" for t, v in memcpy_dma_gbps.items()) +
          f"   (best / pinned peak h2d {max(memcpy_dma_gbps.values()) / c['pinned_h2d']:.2f})")
    if alt_gbps:
        print("  other ways for a pageable source: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.1f} ({v / c['pinned_h2d']:.2f})" for k, v in alt_gbps.items()))
    print(f"  pinned peak d2h {c['pinned_d2h']:.1f}   to_numpy {c['to_numpy']:.1f}"
          f"   ratio {c['to_numpy'] / c['pinned_d2h']:.2f}")
    pinned.release()

    # 3. clone vs torch
    csize = size
    ms_ig = wall(lambda: d.clone().free())
    line = f"  ignis clone {gbps(ms_ig) * 2:.0f} GB/s (read+write)"
    res["clone"] = {"ignis_gbps": gbps(ms_ig) * 2}
    if torch is not None:
        t = torch.empty(csize, dtype=torch.uint8, device="cuda")
        ms_t = wall(lambda: (t.clone(), torch.cuda.synchronize()))
        res["clone"]["torch_gbps"] = gbps(ms_t) * 2
        line += f"   torch clone {gbps(ms_t) * 2:.0f} GB/s   ratio {ms_t / ms_ig:.2f}"
    print(f"\n3. clone of {csize >> 20} MiB (wall time incl. allocation)")
    print(line)
    d.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
