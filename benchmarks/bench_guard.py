"""The debug guard under PyTorch: its cost against PyTorch's caching allocator, and
against Compute Sanitizer's memcheck, in the same run on the same card.

- pair: ``torch.empty(n, device="cuda")`` then its free, µs per pair, for the
  caching allocator and under ``ignis.torch.use_guard()`` (target: at most 5x);
  4 KiB and 1 MiB tensors. CPU-side time per pair (the pair queues at most a
  memset or two on the GPU; each repeat of 3000 pairs waits for the device at
  its end). Paired rounds (``--pair-rounds``, default 21): the two contenders'
  processes live together, pinned to one CPU, and run one repeat each in turn,
  so each round's ratio compares two stretches of time milliseconds apart; the
  figure is the median of the rounds' ratios, with their spread. (The hosts'
  speed drifts by up to 2x within minutes: ratios of whole runs taken minutes
  apart moved between 2x and 6x on the same code.)
- step (children in turns, ``--turns``, default 3; medians over the turns): one
  step of a small training loop (an MLP, a prefetch stream with
  ``record_stream``, autocast bf16, SGD), ms per step, caching allocator vs the
  guard (target: at most 2x) vs ``compute-sanitizer --tool memcheck`` (where
  the tool is on the machine and accepts the device), with the final loss of
  each (the guard must not change it).
- ops: what learning of ``record_stream`` costs every other op: ``x.add_(1)``
  per op plainly, under a minimal TorchDispatchMode that only handles
  ``aten.record_stream`` (the obvious way), and with the guard's CUDA kernel for
  ``aten.record_stream`` registered (its way: no per-op cost).

Each configuration runs in its own process (PyTorch's allocator can be chosen
only before CUDA starts). Run: ``PYTHONPATH=src IGNIS_BACKEND=cuda python3
benchmarks/bench_guard.py [--json OUT] [--steps N] [--memcheck-steps N]``;
``--pair-only [--guard-opts JSON]``: the pair alone (``scripts/gpu_guard_paired.sh``
compares trees with it).
For a breakdown: ``--child diag`` (the pair with stacks / the garbage collector
off, the guard's own allocate + free, one Python-wrapped memset; the pair at 1 MiB,
short runs of 200 pairs that never wait for the device, and the device's time for
one 1 MiB poison memset, byte-wise and word-wise: is the 1 MiB pair the CPU's cost
or the device's?) and
``--child profile '{"capture_stacks": false}'`` (cProfile of the pair loop).

Without a GPU (or PyTorch): ``--emulated`` times the guard's allocate + free on
the emulated backend, µs per pair of 4 KiB and 1 MiB: through the C entry points
PyTorch calls (here through ctypes, which adds its own call cost), through
``_alloc`` / ``_free`` and through the guard's ``allocate`` / ``free_fast``, with
and without allocation sites, and the cost of one site capture. Once with the
emulator's device work (its memsets and check kernels run on its stream
threads) and once with that work replaced by no-ops (``host``: the guard's own
host work, what the GPU run pays on the CPU besides the driver calls). A guide
for changes to the guard; the GPU numbers are the ones above.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# -- children ------------------------------------------------------------------------------
_PAIR_SIZES = {"4KiB": 1024, "1MiB": 1 << 18}  # float32 elements


def _pair_setup(guard: bool, opts: str):
    """torch, and the guard's module under ``use_guard(**opts)`` (None for the caching allocator)."""
    import torch
    if not guard:
        return torch, None
    from ignis.torch import _guard
    _guard.use_guard(**json.loads(opts))
    return torch, _guard


def _pairs(torch, n: int, reps: int) -> tuple[float, float]:
    """``reps`` pairs of ``torch.empty(n)`` and its free: wall and CPU (thread) µs per pair.
    Waits for the device after the timing, so no queued work spills into what follows."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(reps):
        t = torch.empty(n, device="cuda")
        del t
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    torch.cuda.synchronize()
    return dt / reps * 1e6, dc / reps * 1e6


def _guard_numbers(_guard) -> dict:
    if _guard is None:
        return {}
    return {"checks": _guard.guard_stats(0), "problems": len(_guard.check(raise_=False)) + len(_guard.reports())}


def child_pair(guard: bool, opts: str = "{}") -> dict:
    """The pair in one process: 9 repeats of 5000 per size, their median (the method before
    paired rounds; ``scripts/gpu_guard_compare.sh`` runs it)."""
    torch, _guard = _pair_setup(guard, opts)
    out = {}
    for label, n in _PAIR_SIZES.items():
        _pairs(torch, n, 2000)
        out[label] = statistics.median(_pairs(torch, n, 5000)[0] for _ in range(9))
    out.update(_guard_numbers(_guard))
    return out


def child_pair_server(guard: bool, opts: str = "{}") -> None:
    """The pair, one repeat at a time on request: the parent alternates this process with
    the other contender's (``paired_pairs``). Reads a size label per line on stdin and
    answers ``REP <µs per pair> <CPU µs per pair>``; ``stats`` answers the guard's numbers,
    ``quit`` ends it. Each repeat waits for the device at its end (outside its timing), so
    no queued work spills into the other contender's repeat."""
    torch, _guard = _pair_setup(guard, opts)
    reps = int(os.environ.get("PAIR_REP", "3000"))
    for n in _PAIR_SIZES.values():
        _pairs(torch, n, 2000)
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "stats":
            print("RESULT " + json.dumps(_guard_numbers(_guard)), flush=True)
            continue
        us, cpu_us = _pairs(torch, _PAIR_SIZES[cmd], reps)
        print(f"REP {us} {cpu_us}", flush=True)


def paired_pairs(rounds: int, opts: str = "{}") -> dict:
    """The pair under the caching allocator and under the guard, in two processes started
    together and run alternately, one repeat each in turn (the order swapped every
    round), so that each round's ratio compares two stretches of time milliseconds apart:
    the host's speed, which drifts by 2x over minutes on these machines, cancels out of
    the ratio. Returns per size the median µs of each, the median of the rounds' ratios
    and the ratios' spread, and the CPU time per pair of each (thread time: what the
    process itself spent, without time the host gave to others)."""
    def start(guard: bool) -> subprocess.Popen:
        args = [sys.executable, os.path.abspath(__file__), "--child", "pair_server", "guard" if guard else "plain", opts]
        p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        for line in p.stdout:
            if line.startswith("READY"):
                return p
        raise RuntimeError(f"the {'guard' if guard else 'plain'} pair child did not start (status {p.wait()})")

    def ask(p: subprocess.Popen, cmd: str) -> str:
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        for line in p.stdout:
            if line.startswith(("REP ", "RESULT ")):
                return line
        raise RuntimeError(f"a pair child ended (status {p.wait()})")

    procs = {"caching": start(False), "guard": start(True)}
    # Both on one CPU (they never run at once): a faster or quieter core would otherwise
    # favour whichever process the kernel put there.
    try:
        cpu_id = max(os.sched_getaffinity(0))
        for p in procs.values():
            os.sched_setaffinity(p.pid, {cpu_id})
    except (AttributeError, OSError):
        pass
    times = {w: {k: [] for k in _PAIR_SIZES} for w in procs}
    cpu = {w: {k: [] for k in _PAIR_SIZES} for w in procs}
    try:
        for r in range(rounds):
            order = ("caching", "guard") if r % 2 == 0 else ("guard", "caching")
            for k in _PAIR_SIZES:
                for w in order:
                    _, us, cus = ask(procs[w], k).split()
                    times[w][k].append(float(us))
                    cpu[w][k].append(float(cus))
        stats = json.loads(ask(procs["guard"], "stats")[7:])
    finally:
        for p in procs.values():
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
            except OSError:
                pass
            p.wait(timeout=60)
    out: dict = {"rounds": rounds, "guard_checks": stats.get("checks"), "problems": stats.get("problems")}
    for k in _PAIR_SIZES:
        ratios = sorted(g / c for g, c in zip(times["guard"][k], times["caching"][k]))
        out[k] = {"caching_us": statistics.median(times["caching"][k]), "guard_us": statistics.median(times["guard"][k]),
                  "ratio": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
                  "ratio_q1_q3": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
                  "caching_cpu_us": statistics.median(cpu["caching"][k]),
                  "guard_cpu_us": statistics.median(cpu["guard"][k])}
        out[k]["cpu_ratio"] = out[k]["guard_cpu_us"] / out[k]["caching_cpu_us"]
    return out


def child_step(guard: bool, steps: int) -> dict:
    import torch
    import torch.nn.functional as F
    if guard:
        from ignis.torch import _guard
        _guard.use_guard()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = [(torch.randn(128, 256).pin_memory(), torch.randint(0, 10, (128,)).pin_memory()) for _ in range(8)]
    prefetch = torch.cuda.Stream()

    def load(i):
        with torch.cuda.stream(prefetch):
            x, y = data[i % len(data)]
            return x.cuda(non_blocking=True), y.cuda(non_blocking=True)

    def run(n: int, start: int):
        nxt = load(start)
        loss = None
        for step in range(start, start + n):
            torch.cuda.current_stream().wait_stream(prefetch)
            x, y = nxt
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            nxt = load(step + 1)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            del x, y
        return loss

    warm = max(5, steps // 10)
    run(warm, 0)
    torch.cuda.synchronize()
    times = []
    per = max(1, steps // 5)
    at = warm
    for _ in range(5):
        t0 = time.perf_counter()
        loss = run(per, at)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / per * 1e3)
        at += per
    out = {"ms_per_step": statistics.median(times), "loss": float(loss.item()), "steps": warm + 5 * per}
    if guard:
        out["problems"] = len(_guard.check(raise_=False)) + len(_guard.reports())
    return out


def child_ops(mode: str) -> dict:
    import torch
    if mode == "guard":
        from ignis.torch import _guard
        _guard.use_guard()
    ctx = None
    if mode == "dispatch_mode":
        from torch.utils._python_dispatch import TorchDispatchMode

        class OnlyRecordStream(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.record_stream.default:
                    pass  # here the front end would note the stream
                return func(*args, **(kwargs or {}))

        ctx = OnlyRecordStream()
        ctx.__enter__()
    x = torch.zeros(1024, device="cuda")
    for _ in range(500):
        x.add_(1)
    torch.cuda.synchronize()
    reps = []
    N = 256  # below the launch queue's depth
    for _ in range(21):
        t0 = time.perf_counter()
        for _ in range(N):
            x.add_(1)
        reps.append((time.perf_counter() - t0) / N * 1e6)
        torch.cuda.synchronize()
    s = torch.cuda.Stream()
    t0 = time.perf_counter()
    for _ in range(1000):
        x.record_stream(s)
    rs = (time.perf_counter() - t0) / 1000 * 1e6
    if ctx is not None:
        ctx.__exit__(None, None, None)
    return {"us_per_op": statistics.median(reps), "us_per_record_stream": rs}


def child_profile(opts: str) -> dict:
    """Where the guard's time goes in the torch.empty + free pair (cProfile, top functions)."""
    import cProfile
    import io
    import pstats

    import torch
    from ignis.torch import _guard
    _guard.use_guard(**json.loads(opts))
    for _ in range(3000):
        t = torch.empty(1024, device="cuda")
        del t
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10000):
        t = torch.empty(1024, device="cuda")
        del t
    plain = (time.perf_counter() - t0) / 10000 * 1e6
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10000):
        t = torch.empty(1024, device="cuda")
        del t
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(28)
    return {"us_per_pair": plain, "profile": buf.getvalue()[-6000:]}


def child_diag() -> dict:
    """The pair's cost under the guard with one part at a time turned off (one process)."""
    import gc

    import torch
    from ignis.torch import _guard
    _guard.use_guard()

    def pairs(n: int = 5000, reps: int = 5, numel: int = 1024) -> float:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                t = torch.empty(numel, device="cuda")
                del t
            out.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        return statistics.median(out)

    pairs(3000, 1)
    pairs(3000, 1, 1 << 18)
    g = _guard.guard_resource(0)
    res = {"default": pairs(), "default_1MiB": pairs(numel=1 << 18)}
    # 200 pairs queue less device work than the launch queue holds: the CPU's own cost per
    # pair, never waiting for the device. A long run far above it waits for the device.
    res["short_4KiB"] = pairs(200, 25)
    res["short_1MiB"] = pairs(200, 25, 1 << 18)
    gc.disable()
    res["gc_off"] = pairs()
    gc.enable()
    g.capture_stacks = False
    res["no_stacks"] = pairs()
    gc.disable()
    res["no_stacks_gc_off"] = pairs()
    gc.enable()
    g.capture_stacks = True
    s = _guard._stream(0, 0)
    from ignis.safety.frames import capture_frames
    t0 = time.perf_counter()
    for _ in range(20000):
        capture_frames(1, 6)
    res["capture_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    t0 = time.perf_counter()
    for _ in range(20000):
        b = g.allocate(4096, s, "torch", ())
        g.free_fast(b)
    res["allocate_free_fast_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    torch.cuda.synchronize()
    be = g._backend
    t0 = time.perf_counter()
    for _ in range(20000):
        be.memset_d8_async(b.ptr, 0xA5, 4096, s.handle)
    res["memset_py_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    torch.cuda.synchronize()
    x = torch.empty(1 << 18, device="cuda")
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def device_us(op) -> float:  # the device's µs per call of ``op``, 1000 in a row
        torch.cuda.synchronize()
        ev0.record()
        for _ in range(1000):
            op()
        ev1.record()
        torch.cuda.synchronize()
        return ev0.elapsed_time(ev1) / 1000 * 1e3

    # The poison of a 1 MiB tensor byte-wise (cuMemsetD8Async), and as the guard queues it
    # now: the byte replicated into words (cuMemsetD32Async).
    xp = x.data_ptr()
    res["memset_1MiB_gpu_us"] = device_us(lambda: be.memset_d8_async(xp, 0xA5, 1 << 20, s.handle))
    res["memset32_1MiB_gpu_us"] = device_us(lambda: be.memset_d32_async(xp, 0xA5A5A5A5, 1 << 18, s.handle))
    torch.cuda.synchronize()
    del x
    return res


def child_emulated(host_only: bool) -> dict:
    """The guard's allocate + free without PyTorch, on the emulated backend (see the module)."""
    import ctypes

    import ignis as ig
    from ignis.safety.frames import capture_frames
    from ignis.torch import _guard, _guard_fast

    lib = ctypes.CDLL(_guard_fast.__file__)
    c_alloc, c_free = lib.ignis_torch_alloc, lib.ignis_torch_free
    c_alloc.restype, c_alloc.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    c_free.restype, c_free.argtypes = None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    dev = ig.Device(0)
    stream = dev.create_stream()
    h = stream.handle
    out: dict = {"backend": dev.backend.name, "device_work": "no-ops" if host_only else "the emulator's"}

    def c_pair(g, n: int) -> None:
        p = c_alloc(n, 0, h)
        c_free(p, n, 0, h)

    def py_pair(g, n: int) -> None:
        _guard._free(_guard._alloc(n, 0, h), n, 0, h)

    def guard_pair(g, n: int) -> None:
        g.free_fast(g.allocate(n, stream, "torch", ()))

    for stacks in (True, False):
        _guard._reset()
        _guard._configure({"capture_stacks": stacks})
        _guard_fast.torch_guard_bind(_guard._alloc, _guard._free)
        g = _guard.guard_resource(0)
        if host_only:  # the emulator's device work as no-ops (this process only)
            b = g._backend
            b.memset_d8_async = b.memset_d32_async = b.kernel_launch = b.event_record = lambda *a: None
            b.event_query = lambda *a: True
            b.host_view = lambda *a: None
        for name, pair in (("entry_points_ctypes", c_pair), ("alloc_free", py_pair), ("allocate_free_fast", guard_pair)):
            if name == "allocate_free_fast" and stacks:
                continue  # it takes the site from its caller: the same with or without
            for label, n in (("4KiB", 4096), ("1MiB", 1 << 20)):
                for _ in range(2000):
                    pair(g, n)
                dev.synchronize()
                reps = []
                for _ in range(7):
                    t0 = time.perf_counter()
                    for _ in range(5000):
                        pair(g, n)
                    reps.append((time.perf_counter() - t0) / 5000 * 1e6)
                    dev.synchronize()
                out[f"{name}{'' if name == 'allocate_free_fast' else '_stacks' if stacks else '_no_stacks'}"
                    f"_{label}_us"] = statistics.median(reps)
        out["problems"] = len(g.check(raise_=False)) if not host_only else 0
    t0 = time.perf_counter()
    for _ in range(20000):
        capture_frames(1, 6)
    out["capture_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    _guard._reset()
    stream.close()
    return out


# -- parent --------------------------------------------------------------------------------
def _child(args: list[str], *, prefix: list[str] | None = None, timeout: int = 240) -> dict | str:
    cmd = [*(prefix or []), sys.executable, os.path.abspath(__file__), "--child", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return f"failed (status {r.returncode}): {(r.stdout + r.stderr)[-1500:]}"


def _median_of(results: list) -> dict | str:
    """The median of each figure over the turns' results (the last result kept for the rest,
    such as a step's loss, which must not vary); a failed turn's message if any failed."""
    for r in results:
        if not isinstance(r, dict):
            return r
    out = dict(results[-1])
    for k, v in results[-1].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in results)
        elif k == "problems":
            out[k] = max(r[k] for r in results)
    if "loss" in out:
        out["loss_turns"] = [r["loss"] for r in results]
    return out


def _compute_sanitizer() -> str | None:
    p = shutil.which("compute-sanitizer")
    if p:
        return p
    for cand in ("/usr/local/cuda/bin/compute-sanitizer", "/opt/nvidia/compute-sanitizer/compute-sanitizer"):
        if os.path.exists(cand):
            return cand
    return None


def _print_pair(paired: dict | str) -> None:
    if not isinstance(paired, dict):
        print(f"torch.empty + free: {paired}")
        return
    for k in _PAIR_SIZES:
        r = paired[k]
        print(f"torch.empty + free {k}, µs per pair (medians of {paired['rounds']} paired rounds): caching "
              f"{r['caching_us']:.2f}, guard {r['guard_us']:.2f}: x{r['ratio']:.2f} (rounds' ratios: median; "
              f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}, quartiles {r['ratio_q1_q3'][0]:.2f}-{r['ratio_q1_q3'][1]:.2f}; "
              f"target <= 5); CPU time per pair {r['caching_cpu_us']:.2f} / {r['guard_cpu_us']:.2f}: x{r['cpu_ratio']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--memcheck-steps", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3, help="turns of the caching allocator's and the guard's step children")
    ap.add_argument("--pair-rounds", type=int, default=21, help="paired rounds of the pair (one repeat of each contender)")
    ap.add_argument("--pair-only", action="store_true", help="the pair only (no step, memcheck or ops)")
    ap.add_argument("--guard-opts", default="{}", help="use_guard options for the pair, as JSON")
    ap.add_argument("--emulated", action="store_true",
                    help="time the guard's allocate + free on the emulated backend (no GPU, no PyTorch)")
    a = ap.parse_args()
    if a.child:
        kind, rest = a.child[0], a.child[1:]
        if kind == "emulated":
            res = child_emulated(rest[0] == "host")
        elif kind == "pair_server":
            child_pair_server(rest[0] == "guard", rest[1] if len(rest) > 1 else "{}")
            return
        elif kind == "pair":
            res = child_pair(rest[0] == "guard", rest[1] if len(rest) > 1 else "{}")
        elif kind == "diag":
            res = child_diag()
        elif kind == "profile":
            res = child_profile(rest[0] if rest else "{}")
        elif kind == "step":
            res = child_step(rest[0] == "guard", int(rest[1]))
        else:
            res = child_ops(rest[0])
        print("RESULT " + json.dumps(res), flush=True)
        return

    report: dict = {}
    if a.emulated:
        os.environ["IGNIS_BACKEND"] = "emulated"
        report["emulated"] = {w: _child(["emulated", w]) for w in ("host", "device")}
        print(json.dumps(report, indent=2))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=2)
        return

    import torch
    report["device"] = torch.cuda.get_device_name(0)
    report["torch"] = torch.__version__
    # The pair: both contenders' processes alive together, one repeat each in turn
    # (paired_pairs). The step: each contender's child once a turn, the two in turns (the
    # host's speed drifts over a run); the figures are the medians over the turns.
    try:
        paired = paired_pairs(a.pair_rounds, a.guard_opts)
    except Exception as e:  # noqa: BLE001 - reported, the rest still runs
        paired = f"failed: {type(e).__name__}: {e}"
    report["pair"] = paired
    if isinstance(paired, dict):
        report["pair_us"] = {w: {k: paired[k][f"{w}_us"] for k in _PAIR_SIZES} for w in ("caching", "guard")}
        report["pair_ratio"] = {k: paired[k]["ratio"] for k in _PAIR_SIZES}
    steps: dict[str, list] = {"caching": [], "guard": []}
    for _ in range(0 if a.pair_only else a.turns):
        for who, arg in (("caching", "plain"), ("guard", "guard")):
            steps[who].append(_child(["step", arg, str(a.steps)]))
    report["turns"] = a.turns
    if a.pair_only:
        print(json.dumps(report, indent=2))
        _print_pair(paired)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=2)
        return
    sp, sg = _median_of(steps["caching"]), _median_of(steps["guard"])
    report["step"] = {"caching": sp, "guard": sg}
    report["step_turns"] = steps
    cs = _compute_sanitizer()
    report["compute_sanitizer"] = cs or "not found (which compute-sanitizer; /usr/local/cuda/bin)"
    if cs:
        mc = _child(["step", "plain", str(a.memcheck_steps)], prefix=[cs, "--tool", "memcheck",
                                                                       "--print-limit", "10"], timeout=420)
        report["step"]["memcheck"] = mc
    if isinstance(sp, dict) and isinstance(sg, dict):
        report["step_ratio_guard"] = sg["ms_per_step"] / sp["ms_per_step"]
        report["same_loss"] = all(abs(lg - lp) <= 1e-5 * max(1.0, abs(lp))
                                  for lp, lg in zip(sp["loss_turns"], sg["loss_turns"]))
        mc = report["step"].get("memcheck")
        if isinstance(mc, dict):
            report["step_ratio_memcheck"] = mc["ms_per_step"] / sp["ms_per_step"]
    report["ops"] = {m: _child(["ops", m]) for m in ("plain", "dispatch_mode", "guard")}
    print(json.dumps(report, indent=2))
    _print_pair(paired)
    if "step_ratio_guard" in report:
        line = (f"training step, ms (medians of {a.turns} turns): caching {sp['ms_per_step']:.3f}, guard {sg['ms_per_step']:.3f} "
                f"(x{report['step_ratio_guard']:.2f}, target <= 2; same loss: {report['same_loss']})")
        if "step_ratio_memcheck" in report:
            line += f", memcheck {report['step']['memcheck']['ms_per_step']:.3f} (x{report['step_ratio_memcheck']:.1f})"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
