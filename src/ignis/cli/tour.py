"""``tour(out)``: a tour of what Ignis is for, in well under a minute without a GPU
(``ignis demo`` runs it after the demo).

1. A small generated model is saved to a safetensors file from device memory
   and loaded back straight to the device (skipped, saying so, where
   ``ignis.io`` is not available).
2. A two-stream pipeline: stream A computes key/value rows from the weights,
   stream B appends them to a KV cache with ``NvArray.write_rows``; tracking
   queues the cross-stream waits; the cache is checked on the host.
3. One planted bug of each class, each in its own sandbox, each caught with
   its report: a cross-stream race (``manual`` ordering, sanitizer on), a use
   after free, a double free, a stale handle after ``Device.rebuild()`` (on a
   spare emulated device), an out-of-bounds write (``DebugGuardResource``) and
   a leak (``contract.audit``).
4. The memory summary, with peaks (statistics are collected during the tour):
   the rows with something in them.
5. A snapshot of the same resource for https://pytorch.org/memory_viz and the
   timeline PNG (skipped, saying so, without matplotlib): the same reserved peak.

Rules: every check that fails is one "FAILED" line and exit status 1, and the
tour goes on where it can. Whatever the tour turns on (statistics, history,
the sanitizer, tracking) is put back as it was, and everything it allocates
is freed, success or not.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Callable, TextIO

import numpy as np

from ..units import format_bytes

__all__ = ["tour"]

D = 64          # model width
ROWS = 4        # KV rows appended per step
STEPS = 16


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Tour:
    def __init__(self, out: TextIO, device: int, out_dir: str) -> None:
        import ignis as ig

        self.ig = ig
        self.out = out
        self.dev = ig.Device(device)
        self.out_dir = out_dir
        self.failed = 0
        self.cleanup: list[Callable[[], None]] = []

    def say(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def fail(self, what: str) -> None:
        self.failed += 1
        self.say(f"   FAILED: {what}")

    def step(self, title: str, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # a step that breaks is reported; the tour goes on
            self.fail(f"{title}: {_first_line(e, 300)}")
        self.say(f"   ({(time.perf_counter() - t0) * 1e3:.0f} ms)")

    # -- 1. the model ---------------------------------------------------------------------------
    def model(self) -> dict[str, Any]:
        ig = self.ig
        rng = np.random.default_rng(7)
        shapes = {"embed.weight": (256, D), "attn.q.weight": (D, D), "attn.k.weight": (D, D),
                  "attn.v.weight": (D, D), "attn.o.weight": (D, D), "mlp.up.weight": (4 * D, D),
                  "mlp.down.weight": (D, 4 * D), "norm.weight": (D,)}
        host = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        total = sum(a.nbytes for a in host.values())
        io = getattr(ig, "io", None)
        save = getattr(io, "save_safetensors", None)
        load = getattr(io, "load_safetensors", None)
        if save is None or load is None:
            self.say("1. model: skipped the safetensors round trip (ignis.io is not available in this build); "
                     "uploading the weights directly")
            return {n: ig.from_numpy(a, tag="model") for n, a in host.items()}
        path = os.path.join(self.out_dir, "tour-model.safetensors")
        src = {n: ig.from_numpy(a, tag="model.upload") for n, a in host.items()}
        t0 = time.perf_counter()
        save(src, path)
        t_save = time.perf_counter() - t0
        for a in src.values():
            a.free()
        t0 = time.perf_counter()
        weights = load(path)
        t_load = time.perf_counter() - t0
        same = all(np.array_equal(weights[n].to_numpy(), host[n]) for n in ("embed.weight", "norm.weight"))
        if not same:
            self.fail("the loaded weights differ from the saved ones")
        self.say(f"1. model: {len(host)} tensors ({format_bytes(total)} float32) saved from the device to "
                 f"{os.path.basename(path)} in {t_save * 1e3:.1f} ms and loaded back to the device in "
                 f"{t_load * 1e3:.1f} ms; bytes {'match' if same else 'DIFFER'}")
        return weights

    # -- 2. the pipeline --------------------------------------------------------------------------
    def pipeline(self, weights: dict[str, Any]) -> None:
        ig = self.ig
        K = ig.kernels
        a, b = self.dev.create_stream(), self.dev.create_stream()
        self.cleanup += [a.close, b.close]
        waits0 = ig.memory_stats(self.dev)["num_cross_stream_waits"]
        cache = ig.zeros((STEPS * ROWS, D), "float32", stream=b, tag="kv_cache")
        wk, wv = weights["attn.k.weight"], weights["attn.v.weight"]
        k_host, v_host = wk.to_numpy(), wv.to_numpy()
        expect = np.zeros((STEPS * ROWS, D), np.float32)
        try:
            for t in range(STEPS):
                r0 = (t * ROWS) % D
                kv = ig.empty((ROWS, D), "float32", stream=a, tag="activations")
                K.copy(kv, wk.slice(0, r0, ROWS), stream=a)           # A: kv = k rows
                K.axpy(kv, wv.slice(0, r0, ROWS), float(t), stream=a)  # A: kv += t * v rows
                cache.write_rows(kv, t * ROWS, stream=b)               # B: append (waits for A, by tracking)
                kv.free()                                              # reuse on A waits for B's read
                expect[t * ROWS:(t + 1) * ROWS] = k_host[r0:r0 + ROWS] + np.float32(t) * v_host[r0:r0 + ROWS]
            got = cache.to_numpy(stream=b)
            waits = ig.memory_stats(self.dev)["num_cross_stream_waits"] - waits0
            ok = np.allclose(got, expect, rtol=1e-6, atol=1e-6)
            if not ok:
                self.fail("the KV cache does not hold the rows the pipeline computed")
            self.say(f"2. pipeline: {STEPS} steps; stream A computed {ROWS} key/value rows per step, stream B "
                     f"appended them to a {STEPS * ROWS}x{D} KV cache (write_rows); tracking queued {waits} "
                     f"cross-stream wait(s), no host sync; the cache {'holds the expected values' if ok else 'is WRONG'}")
        finally:
            self.dev.synchronize()
            cache.free()

    # -- 3. the bug zoo ---------------------------------------------------------------------------
    def caught(self, label: str, expected: type, plant: Callable[[], None], after: str = "") -> None:
        try:
            plant()
        except expected as e:
            self.say(f"   {label:<17} caught {_first_line(e)}{after}")
            return
        except Exception as e:
            self.fail(f"{label}: expected {expected.__name__}, got {_first_line(e)}")
            return
        self.fail(f"{label}: the planted bug was not caught")

    def bugs(self) -> None:
        ig = self.ig
        K = ig.kernels
        dev = self.dev
        self.say("3. planted bugs, one of each class, each in a sandbox:")

        def race() -> None:
            a, b = dev.create_stream(), dev.create_stream()
            x = ig.empty(4096, "float32", stream=a, tag="tour.race")
            y = ig.empty(4096, "float32", stream=b, tag="tour.race")
            dev.synchronize()
            try:
                with ig.ordering("manual"), ig.sanitizer.enabled("raise"):
                    K.fill(x, 1.0, stream=a)
                    K.copy(y, x, stream=b)   # reads x on B with no event after A's write
            finally:
                dev.synchronize()
                x.free()
                y.free()
                a.close()
                b.close()

        def use_after_free() -> None:
            x = ig.zeros(8, tag="tour.uaf")
            x.free()
            K.fill(x, 1.0)

        def double_free() -> None:
            x = ig.zeros(8, tag="tour.double_free")
            x.free()
            x.free()

        self.caught("race", ig.RaceError, race, " (both stacks in the report)")
        self.caught("use after free", ig.UseAfterFreeError, use_after_free)
        self.caught("double free", ig.DoubleFreeError, double_free)

        n = ig.device_count()
        if not dev.backend.cuda_driver and n > 1:  # rebuilding a CUDA context could break other code
            spare = ig.Device(n - 1 if n - 1 != dev.ordinal else 0)

            def stale() -> None:
                x = ig.zeros(8, device=spare, tag="tour.stale")
                r = x.ref()
                spare.rebuild()
                del x
                r.access()

            self.caught("stale handle", ig.StaleHandleError, stale, f" (spare device {spare.ordinal} was rebuilt)")
        else:
            self.say("   stale handle      skipped: needs a spare emulated device (this run must not rebuild "
                     "a real GPU's context)")

        guard_cls = getattr(ig, "DebugGuardResource", None)
        if guard_cls is not None:
            def oob() -> None:
                pool = ig.PoolResource(ig.DirectResource(dev))
                guard = guard_cls(pool)
                x = ig.empty(1000, "uint8", mr=guard, tag="tour.oob")
                # A kernel with an off-by-four bound writes 1004 bytes into a 1000-byte buffer.
                dev.backend.memset_d8_async(x.device_ptr, 7, 1004, x.stream.handle)
                try:
                    x.free()
                finally:
                    guard.close()
                    pool.close()

            self.caught("out of bounds", ig.OutOfBoundsError, oob)
        else:
            self.say("   out of bounds     skipped: DebugGuardResource is not available in this build")

        prev = ig.contract.track_all
        ig.contract.track_all = True
        try:
            forgotten = [ig.zeros(256, tag="tour.leaky_cache")]   # a cache nobody empties
        finally:
            ig.contract.track_all = prev
        rows = [r for r in ig.contract.audit(older_than=0.0) if r.get("tag") == "tour.leaky_cache"]
        if rows:
            r = rows[0]
            self.say(f"   {'leak':<17} caught by contract.audit(): NvArray#{r['array_id']} {r['nbytes']} B "
                     f"tag {r['tag']!r} owner {r['owner']!r}, alive {r['age_ms']} ms")
        else:
            self.fail("leak: contract.audit() did not list the forgotten array")
        for x in forgotten:
            x.free()

    # -- 4 and 5 ----------------------------------------------------------------------------------------
    def summary_and_timeline(self, png: str | None) -> None:
        ig = self.ig
        self.say("4. memory summary of the tour:")
        for line in ig.memory_summary(self.dev, abbreviated=True).splitlines():  # the rows with something in them
            self.say("   " + line)
        # The snapshot and its timeline are of the resource the summary describes (not of the
        # sandboxes' own pools): one story, one reserved peak.
        mr = ig.get_current_resource(self.dev)
        snap = ig.snapshot(self.dev, resource=mr)
        path = ig.dump_snapshot(os.path.join(self.out_dir, "tour-snapshot.pickle"), self.dev, resource=mr)
        trace = snap["device_traces"][self.dev.ordinal] if self.dev.ordinal < len(snap["device_traces"]) else []
        self.say(f"5. snapshot: {path} ({len(snap['segments'])} segment(s), {len(trace)} trace entries); "
                 "drag it onto https://pytorch.org/memory_viz")
        png = png or os.path.join(self.out_dir, "tour-timeline.png")
        try:
            info = ig.plot_timeline(snap, png, by="tag", device=self.dev.ordinal,
                                    title="ignis tour: device memory by tag")
        except ImportError as e:
            self.say(f"   timeline: skipped ({e})")
            return
        self.say(f"   timeline: {info['path']} (peak in use {format_bytes(info['peak_bytes'])}, reserved peak "
                 f"{format_bytes(info['reserved_peak_bytes'])}; tags: {', '.join(info['groups'][:6])})")


def _free_all(arrays: dict[str, Any]) -> None:
    for a in arrays.values():
        try:
            a.free()
        except Exception:
            pass
    arrays.clear()


def tour(out: TextIO | None = None, *, device: int = 0, out_dir: str | None = None, png: str | None = None) -> int:
    """Run the tour on ``device``, printing to ``out``; files go to ``out_dir``
    (default: ``ignis-tour`` in the temporary directory). Returns 0 when every
    check held, else 1."""
    from ..telemetry import stats as _stats
    from ..telemetry.snapshot import is_recording, record_memory_history

    out = out or sys.stdout
    out_dir = out_dir or os.path.join(tempfile.gettempdir(), "ignis-tour")
    os.makedirs(out_dir, exist_ok=True)
    t = _Tour(out, device, out_dir)
    ig = t.ig
    dev = t.dev
    t0 = time.perf_counter()
    t.say(f"Ignis tour on device {dev.ordinal} ({dev.name}, {dev.backend.name} backend)")
    was_stats, was_recording = _stats.stats_enabled(), is_recording()
    if not was_stats:
        _stats.enable_stats()
    ig.reset_peak_stats(dev)
    if not was_recording:
        record_memory_history(True, clear_history=True)
    weights: dict[str, Any] = {}
    try:
        def model() -> None:
            weights.update(t.model())

        t.step("model", model)
        if weights:
            t.step("pipeline", lambda: t.pipeline(weights))
        else:
            t.fail("pipeline: skipped, no weights")
        t.step("bugs", t.bugs)
        _free_all(weights)  # views of one allocation: it goes back once the last view is gone
        t.step("summary", lambda: t.summary_and_timeline(png))
    finally:
        _free_all(weights)
        for fn in reversed(t.cleanup):
            try:
                fn()
            except Exception:
                pass
        if not was_recording:
            record_memory_history(False)
        if not was_stats:
            _stats.disable_stats()
    secs = time.perf_counter() - t0
    if t.failed:
        t.say(f"tour finished in {secs:.1f} s with {t.failed} failed check(s)")
        return 1
    t.say(f"tour passed in {secs:.1f} s: every planted bug was caught and every check held")
    return 0
