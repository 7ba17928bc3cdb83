#!/usr/bin/env python3
"""Allocation benchmark: Ignis resources against the allocators people already use.

Run from the repository root (device 0; the backend is chosen as usual, by
``IGNIS_BACKEND``, default ``auto``)::

    PYTHONPATH=src python3 benchmarks/bench_alloc.py [--json OUT.json] [--quick]

What it measures, in one process on one card:

1. allocate + deallocate pairs, microseconds per pair, at 256 B, 64 KiB, 1 MiB
   and 64 MiB, for ``PoolResource(AsyncResource(dev))`` (the default stack,
   tracking on) and ``AsyncResource(dev)`` on one ``ig.Stream``, and for the
   anchors that import: PyTorch's caching allocator (``torch.empty`` + ``del``),
   CuPy's default pool (``malloc`` + ``del``), cuda.core's device memory
   resource (``allocate`` + ``Buffer.close``) and raw ``cuMemAllocAsync`` /
   ``cuMemFreeAsync`` through ``cuda.bindings.driver``.
2. the cost of one tracked use (``prepare_block_use`` + ``finish_block_use``,
   READ_WRITE): on the block's own stream, where counting the backend's calls
   shows that it makes none, and alternating between two streams, where each
   use costs one event record and one wait.
3. ratios PoolResource / anchor per size (below 1.0: Ignis is faster).

Method and rules:

- A repeat is N pairs in a tight Python loop, with the cyclic GC off. The
  device is synchronized before and after each repeat, outside the timed span
  (frees are asynchronous; the loop itself never synchronizes). Untimed
  bookkeeping (``AsyncResource.reap_pending``) runs after the second sync.
- N is calibrated per allocator and size, after a warm-up, so that a repeat
  lasts about ``--target-ms``; the median over repeats is reported. Repeats
  go round-robin over the allocators, so slow drift hits all of them alike.
- Driver-call counts come from a separate counted run (the counting wrappers
  would otherwise be timed too).
- Everything allocated is released at the end, and the release is checked.
- On the emulated backend every number times the host-side emulator and says
  nothing about a GPU; the anchors are skipped there.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any, Callable

SIZES: tuple[tuple[str, int], ...] = (("256 B", 256), ("64 KiB", 64 << 10), ("1 MiB", 1 << 20),
                                      ("64 MiB", 64 << 20))
NOISY = 0.25         # a cell whose repeats spread more than this fraction of the median gets a '*'
WARMUP_PAIRS = 64
COUNTED_PAIRS = 1000
TRACKING_CALLS = ("event_record", "stream_wait_event", "event_create")  # always shown for tracked uses


@dataclass(frozen=True)
class Settings:
    repeats: int
    target_s: float   # wall time of one timed repeat
    n_min: int
    n_max: int


FULL = Settings(repeats=7, target_s=0.080, n_min=200, n_max=200_000)
QUICK = Settings(repeats=3, target_s=0.020, n_min=100, n_max=50_000)


class Skip(Exception):
    """An anchor that cannot run here; the message says why."""


@dataclass
class Allocator:
    """One thing to time: ``loop(size, n)`` runs n allocate + deallocate pairs."""

    key: str
    label: str
    loop: Callable[[int, int], None]
    settle: Callable[[], None] = lambda: None                # after a repeat, untimed
    close: Callable[[], dict] = lambda: {"ok": True}         # release everything; returns checks
    info: dict = field(default_factory=dict)                 # versions and the exact calls timed


# -- timing ---------------------------------------------------------------------
def timed(run: Callable[[int], None], n: int, sync: Callable[[], None],
          settle: Callable[[], None] = lambda: None) -> float:
    """Microseconds per iteration of ``run(n)``, synchronized before and after, untimed."""
    sync()
    gc_on = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        run(n)
        dt = time.perf_counter() - t0
    finally:
        if gc_on:
            gc.enable()
    sync()
    settle()
    return dt / n * 1e6


def calibrate(run: Callable[[int], None], sync: Callable[[], None], cfg: Settings,
              settle: Callable[[], None] = lambda: None, even: bool = False) -> int:
    """Warm up, then the iteration count that makes one repeat last about ``cfg.target_s``."""
    run(WARMUP_PAIRS)
    sync()
    settle()
    n = 16
    while True:
        per_us = timed(run, n, sync, settle)
        if per_us * n * 1e-6 >= cfg.target_s / 8 or n >= cfg.n_max:
            break
        n = min(n * 4, cfg.n_max)
    n = int(cfg.target_s / max(per_us * 1e-6, 1e-9))
    n = max(cfg.n_min, min(cfg.n_max, n))
    return n + (n & 1) if even else n


def summarize(samples: list[float], n: int) -> dict:
    med = statistics.median(samples)
    return {"median_us": med, "min_us": min(samples), "max_us": max(samples),
            "spread": (max(samples) - min(samples)) / med if med else 0.0,
            "repeats_us": samples, "iterations_per_repeat": n}


# -- driver-call counting -----------------------------------------------------------
def _c_driver_calls() -> dict[str, int]:
    """The event records and stream waits that compiled tracking queued straight to the
    driver (ignis.memory.resource.driver_calls: the cuda backend's direct path)."""
    try:
        from ignis.memory.resource import driver_calls
    except ImportError:
        return {}
    return driver_calls()


class DriverCallCounter:
    """Counts calls of every public backend method while active.

    It shadows the backend's methods with counting wrappers on the instance,
    so a resource that calls ``self._backend.event_record(...)`` is counted,
    and removes the shadows on exit. The event records and stream waits that
    compiled tracking queues straight to the driver (``ignis.memory.resource.driver_calls``)
    are added from its own counters."""

    def __init__(self, backend: Any) -> None:
        from ignis.backends import Backend
        self._backend = backend
        self.counts = {name: 0 for name in dir(Backend)
                       if not name.startswith("_") and callable(getattr(Backend, name))}

    def __enter__(self) -> "DriverCallCounter":
        counts = self.counts
        for name in counts:
            if name in vars(self._backend):
                raise RuntimeError(f"backend method {name} is already shadowed on the instance")
            original = getattr(self._backend, name)

            def counted(*args: Any, _name: str = name, _original: Callable = original, **kwargs: Any) -> Any:
                counts[_name] += 1
                return _original(*args, **kwargs)

            setattr(self._backend, name, counted)
        self._c_before = _c_driver_calls()
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.counts:
            vars(self._backend).pop(name, None)
        for name, n in _c_driver_calls().items():
            self.counts[name] += n - self._c_before.get(name, 0)

    def per(self, n: int, always: tuple[str, ...] = ()) -> dict[str, float]:
        """Counts divided by ``n``: the non-zero ones and those named in ``always``, plus ``total``."""
        out = {k: v / n for k, v in sorted(self.counts.items()) if v or k in always}
        out["total"] = sum(self.counts.values()) / n
        return out


# -- the driver's memory pool (cuda backend only) ----------------------------------------
def _driver() -> Any:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu  # type: ignore[no-redef]  # cuda-python < 12.6 layout
    return cu


def _ok(res: tuple, call: str) -> tuple:
    if res[0]:
        raise RuntimeError(f"{call} failed: {res[0]!r}")
    return res


class DevicePool:
    """The device's current stream-ordered pool: the one AsyncResource, cuda.core
    and raw cuMemAllocAsync all allocate from."""

    def __init__(self, ordinal: int) -> None:
        self.cu = cu = _driver()
        cudev = _ok(cu.cuDeviceGet(ordinal), "cuDeviceGet")[1]
        self.handle = _ok(cu.cuDeviceGetMemPool(cudev), "cuDeviceGetMemPool")[1]

    def get(self, attr: str) -> int:
        which = getattr(self.cu.CUmemPool_attribute, f"CU_MEMPOOL_ATTR_{attr}")
        return int(_ok(self.cu.cuMemPoolGetAttribute(self.handle, which), "cuMemPoolGetAttribute")[1])

    def set_release_threshold(self, value: int) -> None:
        which = self.cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
        _ok(self.cu.cuMemPoolSetAttribute(self.handle, which, self.cu.cuuint64_t(value)), "cuMemPoolSetAttribute")


# -- Ignis ----------------------------------------------------------------------------
def ignis_allocator(key: str, label: str, mr: Any, stream: Any) -> Allocator:
    alloc, free = mr.allocate, mr.deallocate

    def loop(size: int, n: int) -> None:
        for _ in range(n):
            b = alloc(size, stream)
            free(b)

    return Allocator(key, label, loop, settle=mr.reap_pending)


# -- anchors --------------------------------------------------------------------------
def _version(dist: str, *modules: Any) -> str:
    for module in modules:
        v = getattr(module, "__version__", None)
        if v:
            return str(v)
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "unknown"


def setup_torch(ordinal: int) -> Allocator:
    try:
        import torch
    except ImportError as e:
        raise Skip(f"torch not importable ({e})") from None
    if not torch.cuda.is_available():
        raise Skip("torch.cuda.is_available() is False")
    cuda = torch.device("cuda", ordinal)
    torch.empty(1, dtype=torch.uint8, device=cuda)   # initializes torch's CUDA state
    empty, u8 = torch.empty, torch.uint8
    get_backend = getattr(torch.cuda, "get_allocator_backend", None)
    info = {"version": torch.__version__, "allocator": get_backend() if get_backend else "unknown",
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "stream": "torch's current stream (legacy default)",
            "call": 'torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", 0)); del t'}

    def loop(size: int, n: int) -> None:
        for _ in range(n):
            t = empty(size, dtype=u8, device=cuda)
            del t

    def close() -> dict:
        torch.cuda.synchronize(cuda)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(cuda)
        return {"reserved_bytes": reserved, "ok": reserved == 0}

    return Allocator("torch", "torch.empty + del", loop, close=close, info=info)


def setup_cupy(ordinal: int) -> Allocator:
    try:
        import cupy
    except ImportError as e:
        raise Skip(f"cupy not importable ({e})") from None
    cupy.cuda.Device(ordinal).use()
    current = getattr(cupy.cuda, "get_current_memory_pool", None)
    if current is not None:
        pool, how = current(), "cupy.cuda.get_current_memory_pool()"
    else:
        pool, how = cupy.get_default_memory_pool(), "cupy.get_default_memory_pool()"
    malloc = pool.malloc
    malloc(1)  # first use initializes CuPy's CUDA state; the pointer is freed at once
    info = {"version": cupy.__version__, "pool": how, "pool_type": type(pool).__name__,
            "stream": "CuPy's current stream (legacy default)", "call": "p = pool.malloc(n); del p"}

    def loop(size: int, n: int) -> None:
        for _ in range(n):
            p = malloc(size)
            del p

    def close() -> dict:
        cupy.cuda.Device(ordinal).synchronize()
        pool.free_all_blocks()
        total = pool.total_bytes()
        return {"pool_total_bytes": total, "ok": total == 0}

    return Allocator("cupy", "cupy pool.malloc + del", loop, close=close, info=info)


def _import_cuda_core() -> tuple[Any, str]:
    """cuda.core's Device: top-level in recent releases, under .experimental before."""
    try:
        import cuda.core as cc
        if hasattr(cc, "Device"):
            return cc, "cuda.core"
    except ImportError:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the experimental namespace warns in recent releases
            import cuda.core.experimental as cce
    except ImportError as e:
        raise Skip(f"cuda.core not importable ({e})") from None
    return cce, "cuda.core.experimental"


def setup_cuda_core(ordinal: int) -> Allocator:
    cc, namespace = _import_cuda_core()
    dev = cc.Device(ordinal)
    dev.set_current()
    stream = dev.create_stream()
    mr = getattr(dev, "memory_resource", None)
    notes = []
    if mr is None:  # very old releases: Device.allocate only
        mr = dev
        notes.append("Device.memory_resource missing; used Device.allocate")
    alloc = mr.allocate
    # The fast forms work on every release seen so far (allocate's stream became
    # keyword-only, close(stream) stayed positional); the others are fallbacks.
    alloc_forms: list[tuple[str, Callable[[int], Any]]] = [
        ("allocate(n, stream=s)", lambda n: alloc(n, stream=stream)),
        ("allocate(n, s)", lambda n: alloc(n, stream)),
    ]
    close_forms: list[tuple[str, Callable[[Any], Any]]] = [
        ("close(s)", lambda b: b.close(stream)),
        ("close(stream=s)", lambda b: b.close(stream=stream)),
    ]
    errors = []
    chosen = None
    for a_name, a_call in alloc_forms:
        try:
            buf = a_call(256)
        except TypeError as e:
            errors.append(f"{a_name}: {e}")
            continue
        for c_name, c_call in close_forms:
            try:
                c_call(buf)
            except TypeError as e:
                errors.append(f"{c_name}: {e}")
                continue
            chosen = (a_name, a_call, c_name, c_call)
            break
        if chosen is not None:
            break
        buf.close()
    if chosen is None:
        stream.close()
        raise Skip("no known cuda.core allocate/close form worked: " + "; ".join(errors))
    a_name, a_call, c_name, c_call = chosen
    if (a_name, c_name) == ("allocate(n, stream=s)", "close(s)"):
        def loop(size: int, n: int) -> None:
            for _ in range(n):
                b = alloc(size, stream=stream)
                b.close(stream)
    else:
        notes.append(f"fallback form {a_name} + {c_name}: timing includes two extra Python calls per pair")

        def loop(size: int, n: int) -> None:
            for _ in range(n):
                c_call(a_call(size))

    info = {"version": _version("cuda-core", cc, sys.modules.get("cuda.core")), "namespace": namespace,
            "resource": type(mr).__name__, "call": f"buf = mr.{a_name}; buf.{c_name}",
            "stream": "dev.create_stream()", "notes": notes}

    def close() -> dict:
        dev.sync()
        stream.close()
        return {"ok": True}

    return Allocator("cuda_core", "cuda.core allocate + close", loop, close=close, info=info)


def setup_driver(ordinal: int, ig_device: Any) -> Allocator:
    try:
        cu = _driver()
    except ImportError as e:
        raise Skip(f"cuda.bindings not importable ({e})") from None
    ig_device.set_current()  # the primary context, which Ignis and the other anchors share
    hs = _ok(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")[1]
    alloc, free = cu.cuMemAllocAsync, cu.cuMemFreeAsync
    ptr = _ok(alloc(256, hs), "cuMemAllocAsync")[1]
    err = _ok(free(ptr, hs), "cuMemFreeAsync")[0]
    success = cu.CUresult.CUDA_SUCCESS

    def fail(call: str, status: Any) -> None:
        raise RuntimeError(f"{call} failed: {status!r}")

    if not err:  # statuses are falsy on success (IntEnum): the cheapest check
        def loop(size: int, n: int) -> None:
            for _ in range(n):
                err, p = alloc(size, hs)
                if err:
                    fail("cuMemAllocAsync", err)
                err = free(p, hs)[0]
                if err:
                    fail("cuMemFreeAsync", err)
    else:
        def loop(size: int, n: int) -> None:
            for _ in range(n):
                err, p = alloc(size, hs)
                if err != success:
                    fail("cuMemAllocAsync", err)
                err = free(p, hs)[0]
                if err != success:
                    fail("cuMemFreeAsync", err)

    import cuda.bindings as bindings
    info = {"version": _version("cuda-bindings", bindings), "stream": "cuStreamCreate(NON_BLOCKING)",
            "call": "err, p = cuMemAllocAsync(n, s); check; err, = cuMemFreeAsync(p, s); check"}

    def close() -> dict:
        _ok(cu.cuStreamSynchronize(hs), "cuStreamSynchronize")
        _ok(cu.cuStreamDestroy(hs), "cuStreamDestroy")
        return {"ok": True}

    return Allocator("driver", "cuMemAllocAsync + cuMemFreeAsync", loop, close=close, info=info)


# -- the three measurements ----------------------------------------------------------
def bench_pairs(allocators: list[Allocator], sync: Callable[[], None], cfg: Settings,
                errors: dict[str, dict[str, str]]) -> dict[str, dict[str, dict]]:
    """Section 1: {size label: {allocator key: summary}}."""
    results: dict[str, dict[str, dict]] = {}
    for label, size in SIZES:
        print(f"  pairs at {label} ...", file=sys.stderr, flush=True)
        gc.collect()
        plan: list[tuple[Allocator, Callable[[int], None], int]] = []
        for a in allocators:
            run = partial(a.loop, size)
            try:
                plan.append((a, run, calibrate(run, sync, cfg, a.settle)))
            except Exception as e:  # one allocator failing must not lose the others
                errors.setdefault(a.key, {})[label] = f"{type(e).__name__}: {e}"
        samples: dict[str, list[float]] = {a.key: [] for a, _, _ in plan}
        for rep in range(cfg.repeats):
            k = rep % len(plan) if plan else 0
            for a, run, n in plan[k:] + plan[:k]:
                if a.key not in samples:
                    continue
                try:
                    samples[a.key].append(timed(run, n, sync, a.settle))
                except Exception as e:
                    errors.setdefault(a.key, {})[label] = f"{type(e).__name__}: {e}"
                    del samples[a.key]
        results[label] = {a.key: summarize(samples[a.key], n) for a, _, n in plan if a.key in samples}
    return results


def count_pair_calls(ig_allocators: list[Allocator], backend: Any,
                     sync: Callable[[], None]) -> dict[str, dict[str, dict]]:
    """Backend calls per allocate + deallocate pair for the Ignis resources, after warm-up."""
    out: dict[str, dict[str, dict]] = {}
    for a in ig_allocators:
        out[a.key] = {}
        for label, size in SIZES:
            try:
                a.loop(size, WARMUP_PAIRS)
                sync()
                a.settle()
                with DriverCallCounter(backend) as counter:
                    a.loop(size, COUNTED_PAIRS)
                sync()
                a.settle()
                out[a.key][label] = counter.per(COUNTED_PAIRS)
            except Exception as e:
                out[a.key][label] = {"error": f"{type(e).__name__}: {e}"}
    return out


def bench_tracked(ig: Any, pool: Any, s1: Any, s2: Any, sync: Callable[[], None], cfg: Settings,
                  backend: Any) -> dict[str, dict]:
    """Section 2: µs per tracked use, and backend calls per use, on one 256 B block of ``pool``."""
    rw = ig.Access.READ_WRITE
    prepare, finish = pool.prepare_block_use, pool.finish_block_use
    block = pool.allocate(256, s1)

    def same_stream(n: int) -> None:
        for _ in range(n):
            prepare(block, s1, rw)
            finish(block, s1, rw)

    def cross_stream(n: int) -> None:
        # n uses: odd ones on s2 (record on s1 + wait on s2, record at finish),
        # even ones back on s1 (wait only): one record and one wait per use.
        for _ in range(n // 2):
            prepare(block, s2, rw)
            finish(block, s2, rw)
            prepare(block, s1, rw)
            finish(block, s1, rw)

    runs = [("same_stream", same_stream, False), ("cross_stream", cross_stream, True)]
    if backend.name == "cuda":  # what the two driver calls alone cost through cuda.bindings
        from cuda.bindings import driver as cu
        ev = backend.event_create(s1.device.ordinal, False)
        evo, o1, o2 = backend._events[ev][1], backend._streams[s1.handle][1], backend._streams[s2.handle][1]
        record, wait = cu.cuEventRecord, cu.cuStreamWaitEvent

        def driver_only(n: int) -> None:
            for _ in range(n // 2):
                record(evo, o1)
                wait(o2, evo, 0)
                record(evo, o2)
                wait(o1, evo, 0)

        runs.append(("driver_calls_only", driver_only, True))
    out: dict[str, dict] = {}
    try:
        for key, run, even in runs:
            print(f"  tracked use, {key.replace('_', ' ')} ...", file=sys.stderr, flush=True)
            n = calibrate(run, sync, cfg, even=even)
            with DriverCallCounter(backend) as counter:
                run(COUNTED_PAIRS)
            sync()
            samples = [timed(run, n, sync) for _ in range(cfg.repeats)]
            out[key] = summarize(samples, n)
            out[key]["calls_per_use"] = counter.per(COUNTED_PAIRS, TRACKING_CALLS)
    finally:
        sync()
        pool.deallocate(block)
        if backend.name == "cuda":
            backend.event_destroy(ev)
    return out


# -- report -------------------------------------------------------------------------
def _mu() -> str:
    try:
        "µ".encode(sys.stdout.encoding or "ascii")
        return "µ"
    except (UnicodeEncodeError, LookupError):
        return "u"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _calls(per: dict[str, Any]) -> str:
    if "error" in per:
        return f"failed ({_short(per['error'])})"
    parts = [f"{k} {v:g}" for k, v in per.items() if k != "total"]
    return f"{per['total']:g} in all" + (f" ({', '.join(parts)})" if parts else "")


def print_report(r: dict, labels: dict[str, str]) -> None:
    mu = _mu()
    meta = r["meta"]
    w = max([len(v) for v in labels.values()] + [len(v) for v in r["ratio_labels"].values()] + [36]) + 2
    head = "".join(f"{lbl:>10}" for lbl, _ in SIZES)
    print()
    print("Ignis allocation benchmark")
    print(f"  card     : {meta['card']} (device 0)")
    versions = ", ".join(f"{k} {v}" for k, v in meta["backend_versions"].items() if k != "backend")
    print(f"  backend  : {meta['backend']}" + (f" ({versions})" if versions else ""))
    print(f"  python   : {meta['python']}   mode: {meta['mode']} ({meta['repeats']} repeats of "
          f"~{meta['target_ms']:g} ms, median)")
    if meta["backend"] == "emulated":
        print("  ** EMULATED BACKEND: these numbers time the host-side emulator (numpy buffers, worker threads)")
        print("  ** and mean nothing about a GPU. Anchors were skipped. Run on a GPU for real numbers.")
    if r["anchors"]:
        print("  anchors  : " + ", ".join(f"{k} {v.get('version', '?')}" for k, v in r["anchors"].items()))
    pool_info = meta.get("device_pool")
    if pool_info:
        def bytes_or_max(v: Any) -> str:
            return "UINT64_MAX" if v == (1 << 64) - 1 else f"{v} B"
        print(f"  driver pool release threshold: {bytes_or_max(pool_info.get('release_threshold_at_start'))} "
              f"at start, {bytes_or_max(pool_info.get('release_threshold_measured'))} while measuring")

    print(f"\n1. allocate + deallocate, {mu}s per pair (lower is better)")
    print(f"  {'':<{w}}{head}")
    for key, label in labels.items():
        cells = []
        for size_label, _ in SIZES:
            s = r["pairs"].get(size_label, {}).get(key)
            cells.append(f"{'-':>10}" if s is None else
                         f"{s['median_us']:>9.3f}{'*' if s['spread'] > NOISY else ' '}")
        print(f"  {label:<{w}}{''.join(cells)}")
    print(f"  (* repeats spread over {NOISY:.0%} of the median; '-' not measured)")
    for key, per_size in r["pair_calls"].items():
        texts = {lbl: _calls(per) for lbl, per in per_size.items()}
        if len(set(texts.values())) == 1:
            print(f"  backend calls per pair, {labels[key]}: {next(iter(texts.values()))} at every size")
        else:
            print(f"  backend calls per pair, {labels[key]}: " + "; ".join(f"{k} {v}" for k, v in texts.items()))

    print(f"\n2. tracked use (prepare_block_use + finish_block_use, READ_WRITE), {mu}s per use")
    print(f"  compiled hot path: {'on' if meta.get('c_fast_path') else 'off (pure Python)'}")
    t = r.get("tracked_use") or {}
    for key, text in (("same_stream", "same stream (the block's own)"),
                      ("cross_stream", "cross stream (alternating 2 streams)"),
                      ("driver_calls_only", "(its record + wait alone, cuda.bindings)")):
        if key in t:
            s = t[key]
            print(f"  {text:<{w}}{s['median_us']:>9.3f}{'*' if s['spread'] > NOISY else ' '}  "
                  f"backend calls per use: {_calls(s['calls_per_use'])}")
    if "error" in t:
        print(f"  failed: {t['error']}")

    print("\n3. PoolResource time / anchor time (below 1.0: Ignis is faster)")
    print(f"  {'':<{w}}{head}")
    for key, per_size in r["ratios"].items():
        row = "".join(f"{'-':>10}" if per_size.get(lbl) is None else f"{per_size[lbl]:>9.2f} "
                      for lbl, _ in SIZES)
        print(f"  {r['ratio_labels'][key]:<{w}}{row}")
    if not r["ratios"]:
        print("  (no anchor measured)")

    for key, why in r["skipped"].items():
        print(f"  skipped {key}: {why}")
    for key, per_size in r["errors"].items():
        for lbl, why in per_size.items():
            print(f"  error {key} at {lbl}: {_short(why)}")
    for note in r["notes"]:
        print(f"  note: {note}")
    rel = r["released"]
    print("\nreleased: " + "; ".join(f"{k} {'ok' if v.get('ok') else 'NOT OK ' + json.dumps(v)}"
                                     for k, v in rel.items()))
    print(f"total time {r['meta']['wall_s']:.1f} s")


# -- main ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    p.add_argument("--quick", action="store_true", help="3 repeats of ~20 ms (under ~15 s on a GPU)")
    p.add_argument("--repeats", type=int, help="timed repeats per cell (default 7, 3 with --quick)")
    p.add_argument("--target-ms", type=float, help="length of one timed repeat (default 80, 20 with --quick)")
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.repeats:
        cfg = Settings(max(1, args.repeats), cfg.target_s, cfg.n_min, cfg.n_max)
    if args.target_ms:
        cfg = Settings(cfg.repeats, args.target_ms / 1e3, cfg.n_min, cfg.n_max)
    t_start = time.perf_counter()
    # The emulator counts an async free's bytes until its stream's worker thread
    # reaches it, and a tight loop outruns that thread: give it room (the host
    # buffers behind it are virtual and never touched). Ignored by the cuda backend.
    emulated_memory = os.environ.setdefault("IGNIS_EMULATED_MEMORY", "256GiB")

    import ignis as ig

    dev = ig.Device(0)
    backend = dev.backend
    emulated = backend.name == "emulated"
    print(f"bench_alloc: {dev.name} on the {backend.name} backend", file=sys.stderr, flush=True)
    notes: list[str] = []
    skipped: dict[str, str] = {}
    errors: dict[str, dict[str, str]] = {}
    released: dict[str, dict] = {}
    r: dict[str, Any] = {}

    s1, s2 = dev.create_stream(), dev.create_stream()
    upstream = ig.AsyncResource(dev)
    pool = ig.PoolResource(upstream)
    async_mr = ig.AsyncResource(dev)
    ignis = [ignis_allocator("ignis_pool", "ignis PoolResource(AsyncResource)", pool, s1),
             ignis_allocator("ignis_async", "ignis AsyncResource", async_mr, s1)]
    from ignis.memory import pool as pool_module  # compiled: there is no Python path to compare with
    anchors: list[Allocator] = []
    device_pool: DevicePool | None = None
    pool_info: dict[str, Any] = {}
    try:
        if emulated:
            skipped["anchors"] = "the emulated backend has no GPU to compare against"
            notes.append(f"emulated device memory IGNIS_EMULATED_MEMORY={emulated_memory}")
        else:
            try:
                device_pool = DevicePool(dev.ordinal)
                pool_info["release_threshold_at_start"] = device_pool.get("RELEASE_THRESHOLD")
            except Exception as e:
                device_pool = None
                notes.append(f"could not read the driver pool's attributes: {type(e).__name__}: {e}")
            setups: list[tuple[str, Callable[[], Allocator]]] = [
                ("torch", partial(setup_torch, dev.ordinal)), ("cupy", partial(setup_cupy, dev.ordinal)),
                ("cuda_core", partial(setup_cuda_core, dev.ordinal)),
                ("driver", partial(setup_driver, dev.ordinal, dev))]
            for key, setup in setups:
                print(f"  setting up {key} ...", file=sys.stderr, flush=True)
                try:
                    anchors.append(setup())
                except Skip as e:
                    skipped[key] = str(e)
                except Exception as e:
                    skipped[key] = f"setup failed: {type(e).__name__}: {e}"
            dev.set_current()  # foreign libraries may have changed the thread's context
            if device_pool is not None:
                pool_info["release_threshold_measured"] = device_pool.get("RELEASE_THRESHOLD")
                if pool_info["release_threshold_measured"] != pool_info["release_threshold_at_start"]:
                    notes.append("an anchor (cuda.core's memory resource does this) changed the driver pool's "
                                 "release threshold; AsyncResource, cuda.core and raw cuMemAllocAsync were all "
                                 "measured with the changed value, and it is restored at the end")
        for a in anchors:
            for n in a.info.get("notes", ()):
                notes.append(f"{a.key}: {n}")

        sync = dev.synchronize
        print("measuring (allocate + deallocate)", file=sys.stderr, flush=True)
        r["pairs"] = bench_pairs(ignis + anchors, sync, cfg, errors)
        r["pair_calls"] = count_pair_calls(ignis, backend, sync)
        try:
            r["tracked_use"] = bench_tracked(ig, pool, s1, s2, sync, cfg, backend)
        except Exception as e:
            r["tracked_use"] = {"error": f"{type(e).__name__}: {e}"}
    finally:
        for a in reversed(anchors):
            try:
                released[a.key] = a.close()
            except Exception as e:
                released[a.key] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        try:
            dev.set_current()
            dev.synchronize()
            pool.close()                 # the cache goes back to `upstream`
            upstream.reap_pending()
            async_mr.reap_pending()
            checks = {"pool_reserved": pool.bytes_reserved, "pool_outstanding": pool.bytes_outstanding,
                      "upstream_outstanding": upstream.bytes_outstanding,
                      "async_outstanding": async_mr.bytes_outstanding}
            upstream.trim()
            for mr in (upstream, async_mr):
                mr.close()
            s1.close()
            s2.close()
            released["ignis"] = {**checks, "ok": not any(checks.values())}
        except Exception as e:
            released["ignis"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        if device_pool is not None:
            try:
                device_pool.set_release_threshold(pool_info["release_threshold_at_start"])
                backend.mem_pool_trim(dev.ordinal, 0)
                dev.synchronize()
                used, reserved = device_pool.get("USED_MEM_CURRENT"), device_pool.get("RESERVED_MEM_CURRENT")
                released["driver_pool"] = {"used_bytes": used, "reserved_bytes": reserved,
                                           "release_threshold": device_pool.get("RELEASE_THRESHOLD"),
                                           "ok": used == 0 and reserved == 0}
            except Exception as e:
                released["driver_pool"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}

    labels = {a.key: a.label for a in ignis + anchors}
    ratios: dict[str, dict[str, float | None]] = {}
    ratio_labels: dict[str, str] = {}
    pairs = r["pairs"]

    def ratio(num: str, den: str) -> dict[str, float | None]:
        out = {}
        for lbl, _ in SIZES:
            a, b = pairs.get(lbl, {}).get(num), pairs.get(lbl, {}).get(den)
            out[lbl] = a["median_us"] / b["median_us"] if a and b and b["median_us"] else None
        return out

    for a in anchors:
        ratios[a.key] = ratio("ignis_pool", a.key)
        ratio_labels[a.key] = a.label
    if any(a.key == "driver" for a in anchors):
        # Not a PoolResource ratio: what Ignis's Python layer adds over the same driver pool.
        ratios["async_vs_driver"] = ratio("ignis_async", "driver")
        ratio_labels["async_vs_driver"] = "(AsyncResource / cuMemAllocAsync)"

    versions = {}
    try:
        versions = backend.versions()
    except Exception:
        pass
    r.update({
        "meta": {"card": dev.name, "backend": backend.name, "backend_versions": versions,
                 "python": platform.python_version(), "platform": platform.platform(),
                 "c_fast_path": not pool_module.__file__.endswith(".py"),  # the compiled (Cython) pool
                 "ignis": ig.__version__, "mode": "quick" if args.quick else "full", "repeats": cfg.repeats,
                 "target_ms": cfg.target_s * 1e3, "sizes": {lbl: n for lbl, n in SIZES},
                 "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "numbers_mean_nothing_about_a_gpu": emulated, "device_pool": pool_info,
                 "wall_s": time.perf_counter() - t_start},
        "labels": labels, "anchors": {a.key: a.info for a in anchors}, "ratios": ratios,
        "ratio_labels": ratio_labels, "skipped": skipped, "errors": errors, "notes": notes,
        "released": released,
    })
    print_report(r, labels)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=2, default=str)
            f.write("\n")
        print(f"wrote {args.json}")
    ignis_failed = any(k.startswith("ignis") for k in errors) or "error" in r["tracked_use"]
    return 0 if all(v.get("ok") for v in released.values()) and not ignis_failed else 1


if __name__ == "__main__":
    sys.exit(main())
