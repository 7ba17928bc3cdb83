"""All-reduce bus bandwidth through Ignis against torch.distributed (NCCL), on 2 GPUs.

    python benchmarks/bench_allreduce.py [--min-mib 1] [--max-mib 1024] [--trials 5] [--json out.json]

Run without RANK in the environment, it launches itself on every GPU (``ignis
launch``) with NVLink multicast off (NCCL_NVLS_ENABLE=0, forced). Each rank
joins both an Ignis communicator and a torch.distributed NCCL group, in the
same processes, on the same GPUs, and measures, per size, alternating trials:

- torch: ``dist.all_reduce(t)`` on a float32 tensor;
- ignis: ``comm.all_reduce(a)`` on an NvArray allocated on the default
  stream (the realistic case: every call crosses streams, so it pays one
  event record for the tracked use, as torch pays its own stream handshake).

Bus bandwidth is nccl-tests': bytes / time x 2(n-1)/n; the best trial of each
counts. Then the ownership bookkeeping, on a 256-byte array:

- per call, host time of ``comm.all_reduce(tiny)`` minus that of the raw NCCL
  call on the same pointer and stream: batches of 200 enqueues of each contender in
  turns (raw, Ignis, Ignis on an array of the communicator's stream, torch), 16
  rounds in pairs (the order forward, then reversed); Ignis's addition is the
  median over the pairs of the pair's mean difference to raw;
- directly: acquire + tracked use (``NvArray.use``) + release, without
  NCCL, for an array of the default stream and one of the communicator's.

Rank 0 prints a table with the ratios (ignis / torch) and, with ``--json``,
writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v  # NVLink multicast stays off (it can take the host's GPUs down)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-mib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=1024)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--json", default=None, help="write the results here (rank 0)")
    return p.parse_args(argv)


def _iters(nbytes: int) -> int:
    return max(20, min(2000, (16 << 30) // nbytes))


def worker(args: argparse.Namespace) -> int:
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
    import torch
    import torch.distributed as dist

    import ignis as ig
    from ignis.memory import Access

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    comm = ig.collective.init_process_group(timeout=300)
    dist.init_process_group("nccl", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['BENCH_TORCH_PORT']}",
                            rank=rank, world_size=world)
    dev = comm.device
    factor = 2 * (world - 1) / world
    say = print if rank == 0 else (lambda *a, **k: None)
    nccl_torch = ".".join(map(str, torch.cuda.nccl.version()))
    say(f"# {torch.cuda.get_device_name(local)} x{world}; ignis via {comm.bindings} (NCCL {comm._engine.api.version}),"
        f" torch {torch.__version__} (NCCL {nccl_torch}); NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")

    # warm both communicators up (connection setup happens on first use)
    t = torch.ones(1 << 20, device="cuda")
    a = ig.full(1 << 20, 1.0, "float32", device=dev)
    for _ in range(5):
        dist.all_reduce(t)
        comm.all_reduce(a)
    torch.cuda.synchronize()
    dev.synchronize()
    del t
    a.free()

    rows = []
    size = args.min_mib << 20
    say(f"{'size':>9} {'torch GB/s':>11} {'ignis GB/s':>11} {'ignis/torch':>12}")
    while size <= args.max_mib << 20:
        n = size // 4
        k = _iters(size)
        t = torch.full((n,), float(rank + 1), device="cuda")
        a = ig.full(n, float(rank + 1), "float32", device=dev)
        dist.all_reduce(t)
        comm.all_reduce(a)
        want = world * (world + 1) / 2
        ok_t = float(t[0]) == want and float(t[-1]) == want
        got = a[n - 1:].to_numpy()[0], a[:1].to_numpy()[0]
        ok_i = got == (want, want)
        t.zero_()
        a.zero_()
        best = {"torch": 0.0, "ignis": 0.0}
        for _ in range(args.trials):
            for lib in ("torch", "ignis"):
                comm.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if lib == "torch":
                    for _ in range(k):
                        dist.all_reduce(t)
                    torch.cuda.synchronize()
                else:
                    for _ in range(k):
                        comm.all_reduce(a)
                    dev.synchronize()
                dt = (time.perf_counter() - t0) / k
                best[lib] = max(best[lib], size / dt * factor / 1e9)
        row = {"bytes": size, "iters": k, "torch_busbw_gbps": best["torch"], "ignis_busbw_gbps": best["ignis"],
               "ratio": best["ignis"] / best["torch"], "correct_torch": ok_t, "correct_ignis": bool(ok_i)}
        rows.append(row)
        flag = "" if ok_t and ok_i else "  WRONG SUM"
        say(f"{size >> 20:>5} MiB {best['torch']:>11.1f} {best['ignis']:>11.1f} {row['ratio']:>12.3f}{flag}")
        del t
        a.free()
        torch.cuda.empty_cache()
        size *= 2

    # -- bookkeeping cost per call -------------------------------------------------------
    tiny = ig.zeros(64, "float32", device=dev)
    tiny_t = torch.zeros(64, device="cuda")
    api, h, st = comm._engine.api, comm._engine.handle, comm.stream.handle
    ptr = tiny.device_ptr

    tiny_c = ig.zeros(64, "float32", stream=comm.stream)

    def per_call(fns: dict, batch: int = 200, rounds: int = 16) -> dict:
        """Host microseconds per call of each of ``fns``, in turns: every round times a batch of
        each, in pairs of rounds (the order forward, then reversed), so that a drift of the
        host's speed, and what a batch leaves to the next, reach every contender alike; the
        same calls on every rank (they are collectives)."""
        times: dict = {k: [] for k in fns}
        for r in range(rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                fn = fns[name]
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(batch):
                    fn()
                times[name].append((time.perf_counter() - t0) / batch * 1e6)
                dev.synchronize()
                torch.cuda.synchronize()
        return times

    turns = per_call({"raw": lambda: api.all_reduce(h, ptr, ptr, 64, 7, 0, st),
                      "ignis": lambda: comm.all_reduce(tiny),
                      "ignis_comm": lambda: comm.all_reduce(tiny_c),
                      "torch": lambda: dist.all_reduce(tiny_t)})
    med = {k: statistics.median(v) for k, v in turns.items()}
    raw, ig_us, ig_c_us, torch_us = med["raw"], med["ignis"], med["ignis_comm"], med["torch"]

    def added_to_raw(name: str) -> float:
        """``name``'s time less the raw call's, averaged over each pair of rounds (one of each
        order, so that an order effect cancels), the median over the pairs."""
        d = [i - r for i, r in zip(turns[name], turns["raw"])]
        return statistics.median((d[k] + d[k + 1]) / 2 for k in range(0, len(d) - 1, 2))

    added, added_c = added_to_raw("ignis"), added_to_raw("ignis_comm")

    def direct(arr, n: int = 20000) -> float:
        s, rw = comm.stream, Access.READ_WRITE
        acq, rel = ig.contract.acquire, ig.contract.release
        best_t = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                acq(arr, "collective")
                with arr.use(s, rw):  # the tracked use: its waits before, its record after
                    pass
                rel(arr, "collective")
            best_t = min(best_t, (time.perf_counter() - t0) / n)
        dev.synchronize()
        return best_t * 1e6

    own_default = direct(tiny)
    own_comm = direct(tiny_c)
    # (medians over the rounds; the additions over raw are medians over pairs of rounds of the
    # rounds' differences, not the difference of the medians)
    book = {"raw_nccl_call_us": raw, "ignis_call_us": ig_us, "torch_call_us": torch_us,
            "ignis_minus_raw_us": added, "ignis_comm_stream_call_us": ig_c_us,
            "ignis_comm_stream_minus_raw_us": added_c, "rounds_us": turns,
            "bookkeeping_direct_default_stream_us": own_default, "bookkeeping_direct_comm_stream_us": own_comm}
    say(f"per call, 256 B, host (medians of 16 rounds in turns): raw NCCL {raw:.2f} us, ignis {ig_us:.2f} us "
        f"(+{added:.2f} us over raw, round by round; target +5), torch {torch_us:.2f} us")
    say(f"  ignis on an array of the communicator's stream (no cross-stream ordering): {ig_c_us:.2f} us "
        f"(+{added_c:.2f} us)")
    say(f"ownership bookkeeping alone (acquire + tracked use + release): {own_default:.2f} us (array of another "
        f"stream: one event record), {own_comm:.2f} us (array of the communicator's stream)")
    big = [r for r in rows if r["bytes"] >= 64 << 20]
    if big:
        say(f"ignis/torch at >= 64 MiB: min {min(r['ratio'] for r in big):.3f}, "
            f"mean {statistics.mean(r['ratio'] for r in big):.3f} (target >= 0.97)")
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(local), "world_size": world, "bindings": comm.bindings,
                       "nccl_ignis": comm._engine.api.version, "nccl_torch": nccl_torch, "torch": torch.__version__,
                       "allreduce": rows, "bookkeeping": book}, f, indent=2)
    tiny.free()
    tiny_c.free()
    comm.barrier()
    dist.destroy_process_group()
    comm.close()
    return 0


def main(argv: list[str]) -> int:
    args = _args(argv)
    if "RANK" in os.environ:
        return worker(args)
    os.environ.setdefault("IGNIS_BACKEND", "cuda")
    import ignis as ig
    from ignis.collective.launch import free_port
    if ig.backend_name() != "cuda" or ig.device_count() < args.nproc:
        print(f"bench_allreduce: needs {args.nproc} GPUs (the {ig.backend_name()} backend has "
              f"{ig.device_count()}); skipped")
        return 0
    return ig.collective.launch(args.nproc, os.path.abspath(__file__), argv,
                                env={"BENCH_TORCH_PORT": str(free_port())})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
