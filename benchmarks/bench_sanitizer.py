"""Cost of a tracked kernel launch, with the sanitizer off and on, against PyTorch's
CUDA sanitizer off and on, in the same run on the same card.

- bare: the built-in fill kernel queued through the backend's ``kernel_launch`` (no
  tracking; on a GPU, cuda-bindings' Python ``cuLaunchKernel``);
- ignis tracked: ``ig.kernels.fill`` (preflight, prepare/finish, the launch: on a GPU the
  compiled launch calls the driver's own cuLaunchKernel; ``direct_launches`` counts them);
- ignis sanitizer: the same with ``ig.sanitizer`` enabled (vector clocks, ranges, frames);
- torch: ``x.fill_(1.0)`` without and with ``torch.cuda._sanitizer`` (CSAN), the latter
  in a child process because CSAN cannot be turned off once on.

Numbers are CPU-side µs per launch: the time to queue N launches, with the clock
stopped before the synchronize that follows (N is kept below the depth of the
driver's launch queue, so queuing never waits for the GPU; timing the synchronize
too would measure how fast the GPU runs the kernels, the same for every variant).
The three Ignis variants go round-robin, repeat by repeat; the median is reported.
Run: ``PYTHONPATH=src python3 benchmarks/bench_sanitizer.py [--json OUT]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time

import ignis as ig

N = 256          # launches per repeat: below the driver's launch-queue depth
REPEATS = 41

TORCH_CHILD_TEMPLATE = r"""
import sys, time, statistics, torch
if sys.argv[1] == "on":
    import torch.cuda._sanitizer as csan
    csan.enable_cuda_sanitizer()
x = torch.empty(1024, device="cuda")
for _ in range(200):
    x.fill_(1.0)
torch.cuda.synchronize()
out = []
for _ in range(%d):
    t = time.perf_counter()
    for _ in range(%d):
        x.fill_(1.0)
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    out.append(dt / %d * 1e6)
print(statistics.median(out))
"""


def per_launch(variants: dict, dev: ig.Device) -> dict:
    """Median µs per launch of each ``name -> (fn, context)``, repeats round-robin."""
    for fn, ctx in variants.values():
        with ctx():
            fn(64)
    dev.synchronize()
    out: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(REPEATS):
        for name, (fn, ctx) in variants.items():
            with ctx():
                t = time.perf_counter()
                fn(N)
                dt = time.perf_counter() - t
                dev.synchronize()
            out[name].append(dt / N * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="fewer launches and repeats")
    args = ap.parse_args()
    global N, REPEATS
    if args.quick:
        N, REPEATS = 256, 9
    dev = ig.Device(0)
    x = ig.empty(1024, "float32")
    s = x.stream
    k = ig.kernels.kernel("fill", 4)
    be = dev.backend
    res: dict = {"card": dev.name, "backend": ig.backend_name()}
    if be.name == "emulated":
        print("note: emulated backend: a launch is a queued Python function; numbers mean nothing about a GPU")

    if be.name == "cuda":
        import ctypes
        fn = k._function(dev)

        def bare(n: int) -> None:
            ptr, h = x.device_ptr, s.handle
            for _ in range(n):  # what any caller does per launch: marshal the arguments, launch
                params = [ctypes.c_void_p(ptr), ctypes.c_uint32(0x3F800000), ctypes.c_int64(1024)]
                be.kernel_launch(fn, (4, 1, 1), (256, 1, 1), 0, h, params)
    else:
        from ignis.array.launch import _host_call

        def bare(n: int) -> None:
            call = _host_call(k, be, (x, 0x3F800000, 1024))
            for _ in range(n):
                be.kernel_launch(call, (4, 1, 1), (256, 1, 1), 0, s.handle, ())

    def tracked(n: int) -> None:
        for _ in range(n):
            ig.kernels.fill(x, 1.0)

    from ignis.runtime.kernel import driver_calls
    direct0 = driver_calls()["kernel_launch"]
    times = per_launch({"bare_us": (bare, contextlib.nullcontext), "tracked_us": (tracked, contextlib.nullcontext),
                        "sanitized_us": (tracked, ig.sanitizer.enabled)}, dev)
    res.update(times)
    # the tracked launches that went straight to the driver's cuLaunchKernel (the compiled
    # launch's direct path; the bare variant goes through the backend's method)
    res["direct_launches"] = driver_calls()["kernel_launch"] - direct0
    res["tracked_launches"] = 2 * (64 + REPEATS * N)
    res["launches_per_repeat"], res["repeats"] = N, REPEATS
    try:
        import torch  # noqa: F401
        have_torch = torch.cuda.is_available()
    except Exception:
        have_torch = False
    if have_torch:
        for mode in ("off", "on"):
            child = TORCH_CHILD_TEMPLATE % (REPEATS, N, N)
            p = subprocess.run([sys.executable, "-c", child, mode], capture_output=True, text=True,
                               timeout=300)
            try:
                res[f"torch_csan_{mode}_us"] = float(p.stdout.strip().splitlines()[-1])
            except Exception:
                res[f"torch_csan_{mode}_us"] = None
                res[f"torch_csan_{mode}_error"] = p.stderr[-500:]
    print(f"card: {dev.name}   backend: {ig.backend_name()}")
    print(f"  bare launch through the backend    {res['bare_us']:8.2f} µs")
    print(f"  ignis tracked launch, sanitizer off {res['tracked_us']:8.2f} µs   "
          f"(+{res['tracked_us'] - res['bare_us']:.2f} over bare)")
    print(f"  ignis tracked launch, sanitizer on  {res['sanitized_us']:8.2f} µs   "
          f"(+{res['sanitized_us'] - res['bare_us']:.2f} over bare)")
    print(f"  tracked launches straight to the driver: {res['direct_launches']} of {res['tracked_launches']}")
    if have_torch:
        on, off = res.get("torch_csan_on_us"), res.get("torch_csan_off_us")
        print(f"  torch fill_, CSAN off               {off if off is None else f'{off:8.2f}'} µs")
        print(f"  torch fill_, CSAN on                {on if on is None else f'{on:8.2f}'} µs")
    x.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
