"""Where the host time of one small Ignis all-reduce goes, on 2 GPUs (a diagnostic, not a benchmark).

    python scripts/diag_allreduce_cost.py

Launches itself on two GPUs. Every rank measures, in the same process and in turns, the
host time per call (batches of 200 enqueues, median of 15) of: the raw NCCL call; Ignis's
``comm.all_reduce``; the same with the call matcher's thread looking less often while calls
wait (20 and 50 ms, then its own interval again); and then, one piece switched off at a time
(for good, in this order),
Ignis with the call matcher's thread stopped (its log still appended), without the log
append, and without the watchdog. Rank 0 also prints a profile of 2000 calls.

DIAG_QUICK=1: the first row only, three times (the third with the garbage collector off), with
what the engine keeps between them. DIAG_SRC=DIR: import Ignis from DIR (another
tree's src, built), for an A/B of two trees in turns (scripts/gpu_coll_ab.sh).
DIAG_COMM_BARRIER=1: each batch starts after ``comm.barrier()`` (as bench_allreduce's per-call
row) instead of torch.distributed's barrier (=2: and starts at once, without the synchronizations
the other rows make first, as bench_allreduce does; =3: after a 20 ms sleep instead). DIAG_SWEEP=1: bench_allreduce's bandwidth sweep
(64-256 MiB, three trials) runs first. DIAG_NOPOLL=1: calls do not ask NCCL for an asynchronous
error. DIAG_NOMATCH=1: the call matcher's thread is stopped. DIAG_NOWAKE=1: the matcher's thread
wakes only on its clock (every 5 ms while calls wait), not on each message from a peer (its
mesh's ``wait_news`` sleeps the whole time-out): whether the peers' batches, each waking the
other's matcher at once, are what slows the first calls after a barrier.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v
# DIAG_SRC: another tree's src to measure (an A/B of two trees, scripts/gpu_coll_ab.sh).
sys.path.insert(0, os.environ.get("DIAG_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def worker() -> int:
    import torch
    import torch.distributed as dist

    import ignis as ig

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    comm = ig.collective.init_process_group(timeout=120)
    dist.init_process_group("nccl", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['DIAG_PORT']}",
                            rank=rank, world_size=world)
    dev = comm.device
    eng = comm._engine
    say = print if rank == 0 else (lambda *a, **k: None)
    tiny = ig.zeros(64, "float32", device=dev)
    tiny_c = ig.zeros(64, "float32", stream=comm.stream)
    tiny_t = torch.zeros(64, device="cuda")
    api, h, st = eng.api, eng.handle, comm.stream.handle
    ptr = tiny.device_ptr
    for _ in range(50):
        comm.all_reduce(tiny)
        dist.all_reduce(tiny_t)
    dev.synchronize()
    torch.cuda.synchronize()
    say(f"# {torch.cuda.get_device_name(local)} x{world}, switch interval {sys.getswitchinterval()} s, "
        f"matcher {'on' if eng.matcher is not None else 'off'}")

    comm_barrier = os.environ.get("DIAG_COMM_BARRIER", "")
    if os.environ.get("DIAG_NOPOLL"):  # calls no longer ask NCCL for an asynchronous error
        comm._poll = None
    # The call matcher's thread stopped (never with DIAG_COMM_BARRIER: the barrier's confirmation
    # waits for the peers' matchers to answer, until the communicator's time-out).
    if os.environ.get("DIAG_NOMATCH") and eng.matcher is not None:
        eng.matcher._stop = True
        eng.matcher.mesh.notify()
        eng.matcher._thread.join(5)
        eng._match = None

    if os.environ.get("DIAG_NOWAKE") and eng.matcher is not None:
        mesh = eng.matcher.mesh

        def clock_only(seen: int, timeout: float) -> int:
            time.sleep(timeout)
            with mesh._cond:
                return mesh._news

        mesh.wait_news = clock_only

    def per_call(fn, batch: int = 200, batches: int = 15) -> float:
        times = []
        for _ in range(batches):
            if comm_barrier:  # as bench_allreduce's per-call row does
                comm.barrier()
            else:
                dist.barrier()
            if comm_barrier == "2":  # exactly as bench_allreduce: the batch starts at once
                pass
            elif comm_barrier == "3":  # ... after 20 ms with the GIL free for the other threads
                time.sleep(0.02)
            else:
                torch.cuda.synchronize()
                dev.synchronize()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            times.append((time.perf_counter() - t0) / batch)
            dev.synchronize()
        return statistics.median(times) * 1e6

    def row(label: str) -> None:
        raw = per_call(lambda: api.all_reduce(h, ptr, ptr, 64, 7, 0, st))
        ig_d = per_call(lambda: comm.all_reduce(tiny))
        ig_c = per_call(lambda: comm.all_reduce(tiny_c))
        raw2 = per_call(lambda: api.all_reduce(h, ptr, ptr, 64, 7, 0, st))
        th = per_call(lambda: dist.all_reduce(tiny_t))
        r = min(raw, raw2)
        say(f"{label:<34} raw {r:7.2f} us | ignis (default-stream array) {ig_d:7.2f} (+{ig_d - r:6.2f}) | "
            f"ignis (comm-stream array) {ig_c:7.2f} (+{ig_c - r:6.2f}) | torch {th:7.2f}")

    row("everything on")
    if os.environ.get("DIAG_SWEEP"):  # bench_allreduce's bandwidth sweep first (64-256 MiB), then the rows
        size = 64 << 20
        while size <= 256 << 20:
            n, k = size // 4, max(20, min(2000, (16 << 30) // size))
            big_t = torch.full((n,), 1.0, device="cuda")
            big = ig.full(n, 1.0, "float32", device=dev)
            for _ in range(3):
                comm.barrier()
                for _ in range(k):
                    dist.all_reduce(big_t)
                torch.cuda.synchronize()
                comm.barrier()
                for _ in range(k):
                    comm.all_reduce(big)
                dev.synchronize()
            del big_t
            big.free()
            torch.cuda.empty_cache()
            size *= 2
        say("(after bench_allreduce's sweep)")
    if os.environ.get("DIAG_QUICK"):  # the first row only, three times (an A/B's turn)
        import gc

        def state() -> None:
            m = eng.matcher
            chans = m._channels() if m is not None and hasattr(m, "_channels") else []
            say(f"  (in flight {len(eng._flight)}, watchdog events {len(eng._pending)}, "
                f"matcher calls kept {sum(len(c.calls) for c in chans)}, "
                f"gc collections {[g['collections'] for g in gc.get_stats()]}, objects {len(gc.get_objects())})")
        state()
        row("everything on")
        state()
        row("everything on")
        state()
        gc.collect()
        gc.disable()
        row("everything on, gc off")
        gc.enable()
        state()
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)
    if rank == 0:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            comm.all_reduce(tiny)
        pr.disable()
        dev.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
    else:
        for _ in range(2000):
            comm.all_reduce(tiny)
        dev.synchronize()
    dist.barrier()
    m = eng.matcher
    if m is not None:
        from ignis.collective import matching
        busy = matching._BUSY
        for look in (0.02, 0.05):  # how often the matcher's thread looks while calls wait
            matching._BUSY = look
            row(f"matcher looks every {look * 1e3:.0f} ms")
        matching._BUSY = busy
        row(f"matcher looks every {busy * 1e3:.0f} ms")
        m._stop = True
        m.mesh.notify()
        m._thread.join(5)
        row("matcher thread stopped")
        eng._match = None
        row("... and no log append")
    eng._stop.set()
    if eng._watchdog is not None:
        eng._watchdog.join(5)
    row("... and no watchdog")
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def main() -> int:
    if "RANK" in os.environ:
        return worker()
    os.environ.setdefault("IGNIS_BACKEND", "cuda")
    import ignis as ig
    from ignis.collective.launch import free_port
    if ig.backend_name() != "cuda" or ig.device_count() < 2:
        print("diag_allreduce_cost: needs 2 GPUs; skipped")
        return 0
    return ig.collective.launch(2, os.path.abspath(__file__), [], env={"DIAG_PORT": str(free_port())})


if __name__ == "__main__":
    sys.exit(main())
