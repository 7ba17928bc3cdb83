#!/usr/bin/env python3
"""safetensors load and save: ig.io against the anchors, in one process on one card.

Run from the repository root::

    PYTHONPATH=src python3 benchmarks/bench_safetensors.py [--size-gb 4] [--sweep] [--no-cold]

What it measures, in this order, all in the same run:

1. the pinned host-to-device (and device-to-host) copy rate: one big pinned
   buffer <-> one device buffer, timed with events: the ceiling for a load;
2. a load from the page cache (the file sits on tmpfs, or was just written):
   ``ig.io.load_safetensors`` (default options, and ``reader="mmap"``) and ``safetensors.torch.load_file(path, device="cuda")``, wall
   time of the whole call (header, allocation, reads, copies, final
   synchronization); the loaded tensors are compared on the device (ig arrays
   through DLPack against the torch ones); and the OS's own read ceiling, no
   GPU involved: the same threads copying the file into host memory;
3. a save to tmpfs with ``ig.io.save_safetensors`` (each writer: ``auto``,
   ``pwrite``, ``mmap``), checked byte for byte against the reference-written
   input; and the OS's write ceiling for a fresh file there, no GPU involved;
4. with ``--sweep``, load and save rates over pipeline settings;
5. a cold-cache load: the file is copied to disk, evicted from the page cache
   (``drop_caches`` when permitted, else ``posix_fadvise(DONTNEED)``, checked
   with ``mincore``), then read raw (one thread, sequential 16 MiB reads) and
   evicted again before ``ig.io.load_safetensors``.

GB/s are 10^9 bytes per second; medians over ``--repeats`` (best in brackets).
The file is bfloat16 tensors of transformer-like sizes, written by the
reference ``safetensors.torch.save_file``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np

import ignis as ig
from ignis.io import PipelineOptions
from ignis.io.pipeline import fs_type


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def timed(fn: Callable[[], Any], repeats: int, after: Callable[[Any], None] = lambda r: None,
          before: Callable[[], None] = lambda: None) -> tuple[list[float], Any]:
    """Wall seconds of ``fn()`` per repeat (``before`` / ``after`` run untimed)."""
    times, last = [], None
    for _ in range(repeats):
        before()
        gc.collect()
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
        if _ < repeats - 1:
            after(last)
            last = None
    return times, last


def rate(nbytes: int, times: list[float]) -> tuple[float, float]:
    return gbps(nbytes, statistics.median(times)), gbps(nbytes, min(times))


def fmt_rate(r: tuple[float, float]) -> str:
    return f"{r[0]:7.2f} GB/s [{r[1]:.2f}]"


# -- the file ------------------------------------------------------------------------
def shapes_for(size_bytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """Transformer-like bfloat16 tensors adding up to at least ``size_bytes``."""
    h, kv, ff = (4096, 1024, 14336) if size_bytes >= 1 << 30 else (1024, 256, 3584)
    out = [("embed.weight", (32000, h))]
    total = 32000 * h * 2
    layer = 0
    while total < size_bytes:
        p = f"layers.{layer}."
        for name, shape in (("attn.q.weight", (h, h)), ("attn.k.weight", (kv, h)), ("attn.v.weight", (kv, h)),
                            ("attn.o.weight", (h, h)), ("mlp.gate.weight", (ff, h)), ("mlp.up.weight", (ff, h)),
                            ("mlp.down.weight", (h, ff)), ("norm1.weight", (h,)), ("norm2.weight", (h,))):
            out.append((p + name, shape))
            total += math.prod(shape) * 2
        layer += 1
    out.append(("final_norm.weight", (h,)))
    return out


def make_file(path: str, size_bytes: int, torch: Any) -> int:
    """Write the benchmark file with the reference writer; return its data bytes."""
    shapes = shapes_for(size_bytes)
    if torch is not None:
        from safetensors.torch import save_file
        tensors = {n: torch.empty(s, dtype=torch.bfloat16, device="cuda").normal_().cpu() for n, s in shapes}
        save_file(tensors, path)
    else:
        import ml_dtypes
        from safetensors.numpy import save_file
        rng = np.random.default_rng(0)
        tensors = {n: rng.integers(0, 1 << 16, size=s, dtype=np.uint16).view(ml_dtypes.bfloat16) for n, s in shapes}
        save_file(tensors, path)
    nbytes = sum(math.prod(s) * 2 for _, s in shapes)
    del tensors
    return nbytes


def files_equal(a: str, b: str, block: int = 256 << 20) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        buf_a, buf_b = bytearray(block), bytearray(block)
        while True:
            na, nb = fa.readinto(buf_a), fb.readinto(buf_b)
            if na != nb or buf_a[:na] != buf_b[:nb]:
                return False
            if na == 0:
                return True


# -- page cache control ---------------------------------------------------------------------
def resident_fraction(path: str) -> float | None:
    """Fraction of the file's pages in the page cache (mincore), or None if unknown."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            anchor = ctypes.c_char.from_buffer(mm)
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
            del anchor
            if rc != 0:
                return None
            return sum(v & 1 for v in bytes(vec)) / pages
        finally:
            mm.close()
    except Exception:
        return None


def evict(path: str) -> str:
    """Drop ``path`` from the page cache; says how."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        how = "drop_caches"
    except OSError as e:
        how = f"posix_fadvise(DONTNEED) (drop_caches not permitted: {e.strerror})"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return how


def raw_read(path: str, block: int = 16 << 20) -> tuple[int, float]:
    buf = bytearray(block)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    n = 0
    t0 = time.perf_counter()
    try:
        while True:
            k = os.readv(fd, [mv])
            if k == 0:
                break
            n += k
    finally:
        os.close(fd)
    return n, time.perf_counter() - t0


# -- what the OS alone can do (no GPU) --------------------------------------------------------
def os_read_ceiling(path: str, offset: int, nbytes: int, workers: int, chunk: int, mode: str) -> float:
    """GB/s of ``workers`` threads copying the file's range into host buffers, with
    ``preadv`` or out of a shared mapping (populate + memmove): the load's CPU-side ceiling."""
    from concurrent.futures import ThreadPoolExecutor
    from ignis.io import pipeline as pl

    local = threading.local()
    fd = os.open(path, os.O_RDONLY)
    mapping = pl._Mapping(fd, os.fstat(fd).st_size, write=False) if mode == "mmap" else None

    def task(off: int) -> None:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = np.ones(chunk, np.uint8)
        n = min(chunk, offset + nbytes - off)
        if n <= 0:
            return
        if mapping is None:
            os.preadv(fd, [memoryview(buf)[:n]], off)
        else:
            pl._populate(mapping.addr + off, n, path, write=False)
            ctypes.memmove(buf.ctypes.data, mapping.addr + off, n)

    try:
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(lambda i: task(offset + i * chunk), range(workers)))  # buffers faulted in
            t0 = time.perf_counter()
            list(ex.map(task, range(offset, offset + nbytes, chunk)))
            secs = time.perf_counter() - t0
    finally:
        if mapping is not None:
            mapping.close()
        os.close(fd)
    return gbps(nbytes, secs)


def os_write_ceiling(directory: str, nbytes: int, workers: int, chunk: int, mode: str) -> float:
    """GB/s of writing ``nbytes`` from host memory to a fresh file: ``pwrite`` from
    ``workers`` threads, or copies into a shared mapping (populate + memmove)."""
    from concurrent.futures import ThreadPoolExecutor
    from ignis.io import pipeline as pl

    path = os.path.join(directory, f".ignis-bench-w-{os.getpid()}")
    src = np.ones(chunk, np.uint8)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    mapping = None
    try:
        t0 = time.perf_counter()
        os.ftruncate(fd, nbytes)
        if mode == "mmap":
            mapping = pl._Mapping(fd, nbytes, write=True)

        def task(off: int) -> None:
            n = min(chunk, nbytes - off)
            if mapping is None:
                pl.pwrite_all(fd, memoryview(src)[:n], off)
            else:
                pl._populate(mapping.addr + off, n, path, write=True)
                ctypes.memmove(mapping.addr + off, src.ctypes.data, n)

        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(task, range(0, nbytes, chunk)))
        if mapping is not None:
            mapping.close()
            mapping = None
        secs = time.perf_counter() - t0
    finally:
        if mapping is not None:
            mapping.close()
        os.close(fd)
        os.unlink(path)
    return gbps(nbytes, secs)


# -- copies ----------------------------------------------------------------------------------
def pinned_copy_rates(nbytes: int, repeats: int) -> tuple[tuple[float, float], tuple[float, float]]:
    dev = ig.Device(0)
    pool = ig.PinnedHostResource(dev.backend)
    buf = pool.allocate(nbytes)
    buf.array.fill(1)
    dst = ig.empty((nbytes,), ig.dtypes.uint8)
    s = dev.create_stream()
    backend = dev.backend
    out = []
    try:
        for direction in ("htod", "dtoh"):
            ms = []
            for _ in range(repeats + 1):
                e0 = s.record(timing=True)
                if direction == "htod":
                    backend.memcpy_htod_async(dst.device_ptr, buf.ptr, nbytes, s.handle)
                else:
                    backend.memcpy_dtoh_async(buf.ptr, dst.device_ptr, nbytes, s.handle)
                e1 = s.record(timing=True)
                e1.synchronize()
                ms.append(e0.elapsed_ms(e1))
                e0.close()
                e1.close()
            out.append(rate(nbytes, [m / 1e3 for m in ms[1:]]))
    finally:
        s.synchronize()
        dst.free()
        buf.release()
        pool.trim()
        s.close()
    return out[0], out[1]


def check_against_torch(arrays: dict, ref: dict, torch: Any) -> str:
    """Compare every ig array with the torch tensor of the same name, on the device."""
    bad = []
    for name, t in ref.items():
        a = arrays[name]
        try:
            mine = torch.from_dlpack(a)
        except Exception:  # fall back to the host
            if not np.array_equal(a.to_numpy().view(np.uint16), t.cpu().view(torch.int16).numpy().view(np.uint16)):
                bad.append(name)
            continue
        if mine.shape != t.shape or not torch.equal(mine.view(torch.int16), t.view(torch.int16)):
            bad.append(name)
    torch.cuda.synchronize()
    return "identical" if not bad else f"MISMATCH in {len(bad)} tensors: {bad[:3]}"


# -- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=4.0, help="data bytes in the file, in GB (default 4)")
    ap.add_argument("--dir", default=None, help="where the file goes (default: /dev/shm if it has room)")
    ap.add_argument("--disk-dir", default=None, help="disk directory for the cold-cache load (default: cwd)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="also sweep pipeline settings")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache load")
    ap.add_argument("--no-torch", action="store_true", help="skip the safetensors.torch anchor")
    args = ap.parse_args(argv)

    try:
        import torch
        if args.no_torch or not torch.cuda.is_available() or ig.backend_name() != "cuda":
            torch = None
    except ImportError:
        torch = None
    dev = ig.Device(0)
    size = int(args.size_gb * 1e9)
    print(f"card: {dev.name} (device 0, {ig.backend_name()} backend); {os.cpu_count()} CPUs; "
          f"ignis {ig.__version__}")
    if ig.backend_name() == "emulated":
        print("note: emulated backend: every rate below is a host memcpy speed and says nothing about a GPU")
    opts = PipelineOptions()
    print(f"pipeline defaults: {opts}")
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    print(f"host: Linux {os.uname().release}; /dev/shm "
          f"{'absent' if shm is None else f'{shm.f_bavail * shm.f_frsize / 1e9:.1f} GB free'}; "
          f"RAM {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 1e9:.0f} GB")

    workdir = args.dir
    if workdir is None:
        st = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
        room = st.f_bavail * st.f_frsize if st else 0
        workdir = "/dev/shm" if room > 2.5 * size + (1 << 30) else tempfile.gettempdir()
    src = os.path.join(workdir, f"ignis-bench-{os.getpid()}.safetensors")
    out_path = os.path.join(workdir, f"ignis-bench-{os.getpid()}-out.safetensors")
    disk_copy = None
    results: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        nbytes = make_file(src, size, torch)
        print(f"file: {src} ({fs_type(workdir)}), {nbytes / 1e9:.2f} GB of bfloat16 in "
              f"{len(shapes_for(size))} tensors, written by safetensors in {time.perf_counter() - t0:.1f} s")

        h2d, d2h = pinned_copy_rates(min(1 << 30, max(nbytes // 4, 1 << 20)), args.repeats)
        results["pinned_h2d"], results["pinned_d2h"] = h2d, d2h
        print(f"pinned copy, one buffer     htod {fmt_rate(h2d)}   dtoh {fmt_rate(d2h)}")

        def ig_load(options: PipelineOptions | None = None) -> dict:
            return ig.io.load_safetensors(src, options=options)

        loads = {"default": None, "mmap": PipelineOptions(reader="mmap")}
        arrays = None
        for label, o in loads.items():
            arrays = None
            ig_load(o)  # warm-up: pinned ring, device pool
            times, arrays = timed(lambda: ig_load(o), args.repeats)
            results[f"ig_load_{label}"] = rate(nbytes, times)
            print(f"load, page cache  ig.io reader={label:<8}{fmt_rate(results[f'ig_load_{label}'])}")
        results["ig_load"] = results["ig_load_default"]
        with ig.io.safe_open(src) as f:
            lo = f._header.data_start
        w, chunk = PipelineOptions().workers, PipelineOptions().chunk_bytes
        for mode in ("pread", "mmap"):
            r = os_read_ceiling(src, lo, nbytes, w, chunk, mode)
            results[f"os_read_{mode}"] = (r, r)
            print(f"  OS read ceiling, no GPU: {w} threads, {chunk >> 20} MiB {mode:<5} into host memory: {r:.2f} GB/s")
        if torch is not None:
            from safetensors.torch import load_file

            def torch_load() -> dict:
                r = load_file(src, device="cuda")
                torch.cuda.synchronize()
                return r

            times, ref = timed(torch_load, max(2, args.repeats // 2))
            results["torch_load"] = rate(nbytes, times)
            print(f"load, page cache  safetensors.torch.load_file(device='cuda') {fmt_rate(results['torch_load'])}")
            print(f"  check: ig.io arrays vs torch tensors: {check_against_torch(arrays, ref, torch)}")
            ref = None
            torch.cuda.empty_cache()

        def unlink_out() -> None:
            if os.path.exists(out_path):
                os.unlink(out_path)

        for writer in ("auto", "pwrite", "mmap"):
            o = PipelineOptions(writer=writer)
            times, _ = timed(lambda: ig.io.save_safetensors(arrays, out_path, options=o), args.repeats,
                             before=unlink_out)
            results[f"ig_save_{writer}"] = rate(nbytes, times)
            print(f"save to {fs_type(workdir):<6}  ig.io writer={writer:<7}{fmt_rate(results[f'ig_save_{writer}'])}"
                  f"   byte-identical to the reference file: {files_equal(src, out_path)}")
        unlink_out()
        for mode, workers in (("pwrite", 1), ("pwrite", w), ("mmap", w)):
            r = os_write_ceiling(workdir, nbytes, workers, 16 << 20, mode)
            results[f"os_write_{mode}_{workers}"] = (r, r)
            print(f"  OS write ceiling, no GPU: fresh {fs_type(workdir)} file, {workers} threads, {mode}: {r:.2f} GB/s")

        if args.sweep:
            print("sweep: load (reader, chunk MiB, buffers, workers, streams) -> GB/s median [best]")
            configs = [(r, c, wk, st) for r in ("pread", "mmap") for c in (8, 16, 32) for wk in (8, 12, 16)
                       for st in (2,)] + [(r, 16, 16, st) for r in ("pread", "mmap") for st in (1, 4)] \
                + [("pread", c, wk, 2) for c in (8, 16) for wk in (24, 32)]  # more readers than cores
            for reader, chunk, workers, streams in configs:
                o = PipelineOptions(chunk_bytes=chunk << 20, buffers=workers + 4, workers=workers, streams=streams,
                                    reader=reader)
                arrays = None
                ig_load(o)
                times, arrays = timed(lambda: ig_load(o), 3)
                print(f"  load  {reader:<5} {chunk:3d} {o.buffers:3d} {workers:3d} {streams:2d}  "
                      f"{fmt_rate(rate(nbytes, times))}")
            print("sweep: save (writer, chunk MiB, workers) -> GB/s median [best]")
            for writer in ("pwrite", "mmap"):
                for chunk in (16, 64):
                    for workers in (4, 16):
                        o = PipelineOptions(chunk_bytes=chunk << 20, buffers=workers + 4, workers=workers,
                                            writer=writer)
                        times, _ = timed(lambda: ig.io.save_safetensors(arrays, out_path, options=o), 2,
                                         before=unlink_out)
                        print(f"  save  {writer:<6} {chunk:3d} {workers:3d}  {fmt_rate(rate(nbytes, times))}")
            unlink_out()
        arrays = None
        gc.collect()

        if not args.no_cold:
            disk_dir = args.disk_dir or os.getcwd()
            kind = fs_type(disk_dir)
            if kind in ("tmpfs", "ramfs"):
                print(f"cold: skipped: {disk_dir} is on {kind}; pass --disk-dir on a disk")
            else:
                disk_copy = os.path.join(disk_dir, f".ignis-bench-{os.getpid()}.safetensors")
                t0 = time.perf_counter()
                shutil.copyfile(src, disk_copy)
                how = evict(disk_copy)
                print(f"cold: copied to {disk_copy} ({kind}) in {time.perf_counter() - t0:.1f} s; evicted with {how}")
                res = resident_fraction(disk_copy)
                n, secs = raw_read(disk_copy)
                results["raw_read"] = (gbps(n, secs), gbps(n, secs))
                print(f"cold: raw sequential read (1 thread, 16 MiB reads), {res if res is None else f'{res:.0%}'} "
                      f"cached before: {gbps(n, secs):.2f} GB/s")
                evict(disk_copy)
                res = resident_fraction(disk_copy)
                t0 = time.perf_counter()
                ig.io.load_safetensors(disk_copy)  # the arrays are dropped at once
                secs = time.perf_counter() - t0
                results["ig_cold"] = (gbps(nbytes, secs), gbps(nbytes, secs))
                print(f"cold: ig.io load, {res if res is None else f'{res:.0%}'} cached before: "
                      f"{gbps(nbytes, secs):.2f} GB/s")

        print("\nsummary (medians)")
        print(f"  card                          {dev.name}")
        print(f"  pinned htod / dtoh            {h2d[0]:.2f} / {d2h[0]:.2f} GB/s")
        print(f"  ig.io load (page cache)       {results['ig_load'][0]:.2f} GB/s   "
              f"= {results['ig_load'][0] / h2d[0]:.0%} of pinned htod (reader=mmap: "
              f"{results['ig_load_mmap'][0]:.2f})")
        print(f"  OS read ceiling (no GPU)      pread {results['os_read_pread'][0]:.2f}, "
              f"mmap {results['os_read_mmap'][0]:.2f} GB/s")
        if "torch_load" in results:
            print(f"  safetensors.torch load_file   {results['torch_load'][0]:.2f} GB/s   "
                  f"ig.io / torch = {results['ig_load'][0] / results['torch_load'][0]:.1f}x")
        for w in ("auto", "pwrite", "mmap"):
            print(f"  ig.io save ({w:<6}) to {fs_type(workdir):<6}  {results[f'ig_save_{w}'][0]:.2f} GB/s   "
                  f"= {results[f'ig_save_{w}'][0] / d2h[0]:.0%} of pinned dtoh")
        print("  OS write ceiling (no GPU)     " + ", ".join(
            f"{k[9:]} {v[0]:.2f}" for k, v in results.items() if k.startswith("os_write_")) + " GB/s")
        if "ig_cold" in results:
            print(f"  cold load / raw read          {results['ig_cold'][0]:.2f} / {results['raw_read'][0]:.2f} GB/s"
                  f"   = {results['ig_cold'][0] / results['raw_read'][0]:.2f}x")
        return 0
    finally:
        for p in (src, out_path, disk_copy):
            if p and os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    sys.exit(main())
