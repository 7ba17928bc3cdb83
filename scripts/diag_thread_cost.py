"""What ``ignis.torch``'s front end adds per op and per free on the main thread and on the
autograd engine's thread (a diagnostic, not a benchmark; one GPU):

    PYTHONPATH=src python3 scripts/diag_thread_cost.py [rounds]

- ``pair``: ``torch.empty`` + its free on the main thread (one op, one free each);
- ``fwd``: a chain of small elementwise ops on the main thread, µs per op;
- ``bwd``: the same chain's backward (run on the autograd engine's thread: each op's gradient
  op, and the frees of what the forward saved), µs per forward op;

each plain, under the front end as ``--sanitize`` runs it (``ignis``), and with its free handler
withdrawn (``nofree``), in turns, medians of the rounds. A large gap between ``fwd`` and ``bwd``
under ``ignis`` that plain does not show points at the engine's thread (taking the GIL there)."""

from __future__ import annotations

import statistics
import sys
import time


def main() -> int:
    import torch
    import torch.cuda._gpu_trace as gt

    import ignis.torch
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = 300
    x = torch.randn(4096, device="cuda", requires_grad=True)

    def pair() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(2000):
            torch.empty(1024, device="cuda")
        return (time.perf_counter() - t) / 2000 * 1e6

    def chain():
        y = x
        for _ in range(n):
            y = torch.sin(y)  # saves its input: freed in the backward pass
        return y

    def fwd() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        y = chain()
        dt = time.perf_counter() - t
        del y
        return dt / n * 1e6

    def bwd() -> float:
        y = chain().sum()
        torch.cuda.synchronize()
        t = time.perf_counter()
        y.backward()
        torch.cuda.synchronize()
        x.grad = None
        return (time.perf_counter() - t) / n * 1e6

    def variant(name: str) -> dict:
        if name != "plain":
            ignis.torch.enable("collect")
            fe = ignis.torch._fe
            kinds = fe._TRACE_KINDS
            if name in ("nofree", "nullfree", "freeonly"):
                # the free handler withdrawn (and the others: as diag_model_cost's), a
                # do-nothing one, or the sanitizer's alone
                free = {"nofree": None, "nullfree": lambda p, s: None, "freeonly": fe.san.extent_freed}[name]
                fe._obs.ignis_obs_trace_start(
                    tuple(free if k == "MemoryDeallocationCallbacks" else None for k in kinds),
                    tuple(getattr(gt, k).callback_list for k in kinds))
        try:
            for f in (pair, fwd, bwd):
                f()  # warm
            return {"pair": statistics.median(pair() for _ in range(3)),
                    "fwd": statistics.median(fwd() for _ in range(3)),
                    "bwd": statistics.median(bwd() for _ in range(3))}
        finally:
            if name != "plain":
                ignis.torch.disable()

    names = ["plain", "ignis", "nofree", "nullfree", "freeonly"]
    res: dict = {}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            for k, v in variant(name).items():
                res.setdefault((name, k), []).append(v)
    print(f"card: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; µs, medians of {rounds} rounds")
    for k in ("pair", "fwd", "bwd"):
        p = statistics.median(res[("plain", k)])
        row = "  ".join(f"{name} {statistics.median(res[(name, k)]):7.2f} (+{statistics.median(res[(name, k)]) - p:6.2f})"
                        for name in names)
        print(f"{k:5s} {row}")
    # the sanitizer's free alone, called from Python with the arguments the trace gives it
    ignis.torch.enable("collect")
    try:
        fe = ignis.torch._fe
        san = fe.san
        y = torch.empty(1024, device="cuda")
        ptr = y.data_ptr()
        del y
        h = torch.cuda.current_stream().cuda_stream
        t = time.perf_counter()
        for _ in range(20000):
            san.extent_freed(ptr, h)
        print(f"sanitizer.extent_freed from Python, an extent it never saw: "
              f"{(time.perf_counter() - t) / 20000 * 1e6:.2f} µs")
    finally:
        ignis.torch.disable()
    return 0


if __name__ == "__main__":
    sys.exit(main())
