"""Differential fuzz of the sanitizer: random traces of its entry points (allocations, frees,
foreign accesses, pinned host memory, event records and waits, synchronizations, record_stream)
replayed into two trees' sanitizers, whose reports must be the same, call by call, and whose
state at the end of each trace (live extents, graveyard, clocks) must be the same.

    python scripts/fuzz_sanitizer_ab.py OLD_SRC [NEW_SRC] [--traces N] [--seed S] [--calls C]

OLD_SRC and NEW_SRC are ``src`` folders of two built trees (NEW_SRC defaults to this tree's).
Each tree runs in its own process (both are the package ``ignis``); every trace is made from
the seed, so both see the same calls. Prints the first trace and call where they differ, with
both sides' reports, or how many traces and reports agreed. Exit status 1 on a difference.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

STREAMS = [0x10, 0x20, 0x30]
EVENTS = [0xE1, 0xE2, 0xE3, 0xE4]
BASES = [4096 * k for k in range(1, 7)]


def make_trace(rng: random.Random, calls: int) -> list:
    from_list = rng.choice
    out = []
    sizes: dict[int, int] = {}
    calm = rng.random() < 0.5  # half the traces order most of their work (waits and synchronizations)
    for i in range(calls):
        r = rng.random()
        if calm and r > 0.45 and r < 0.65:
            r = 0.75 + (r - 0.45)  # (an event wait or a synchronization instead of an access)
        if r < 0.12:
            base = from_list(BASES)
            sizes[base] = from_list([256, 1024, 4096, 6144])
            out.append(("extent_allocated", [base, from_list(STREAMS)]))
        elif r < 0.22:
            out.append(("extent_freed", [from_list(BASES), from_list([None, None, *STREAMS])]))
        elif r < 0.65:
            items = []
            for _ in range(rng.randint(1, 3)):
                base = from_list(BASES)
                size = sizes.get(base) or from_list([256, 1024, 4096])
                lo = base + rng.randrange(0, size, 64)
                hi = min(base + size, lo + from_list([64, 128, 256, 1024, 4096]))
                per, ch = (0, 0) if rng.random() < 0.8 or hi - lo < 128 else (128, 64)  # (a period within the span)
                mode = from_list([1, 1, 2, 2, 3, 6, 4, 9, 33, 5])  # READ, WRITE, OUTPUT, NO_INIT, MAYBE_WRITE
                items.append([base, size, lo, hi, per, ch, mode])
            stream = from_list(STREAMS) if rng.random() < 0.95 else None
            if stream is None and rng.random() < 0.5:  # the host's access to pinned memory
                for it in items:
                    it[6] = (it[6] & ~4) | 16
            out.append(("foreign_access", [stream, f"op{i}", None, items, rng.random() < 0.05, 0]))
        elif r < 0.75:
            out.append(("on_event_record", [from_list(EVENTS), from_list(STREAMS)]))
        elif r < 0.85:
            out.append(("on_stream_wait_event", [from_list(STREAMS), from_list(EVENTS)]))
        elif r < 0.89:
            out.append(("on_stream_synchronize", [from_list(STREAMS)]))
        elif r < 0.92:
            out.append(("on_event_synchronize", [from_list(EVENTS)]))
        elif r < 0.93:
            out.append(("on_device_synchronize", []))
        elif r < 0.975:
            out.append(("extent_record_stream", [from_list(BASES), from_list(STREAMS), rng.random() < 0.3]))
        elif r < 0.99:
            out.append(("extent_release", [from_list(BASES)]))
        else:
            out.append(("extent_dropped", [from_list(BASES)]))
    return out


def run(seed: int, traces: int, calls: int) -> None:
    """In a child: replay every trace, print one JSON line per call that changed the reports."""
    from ignis.safety.sanitizer import Sanitizer, pack_items
    for t in range(traces):
        rng = random.Random(seed * 1_000_003 + t)
        san = Sanitizer()
        san.mode = "collect"
        san.capture = lambda: None
        seen = 0
        for c, (name, args) in enumerate(make_trace(rng, calls)):
            if name == "foreign_access":
                items = [tuple(it) for it in args[3]]  # every other call packed, as the op observer hands them
                args = [args[0], args[1], args[2], pack_items(items) if c % 2 else items, args[4], args[5]]
            try:
                getattr(san, name)(*args)
            except ValueError as e:
                print(json.dumps([t, c, "error", str(e)]))
            reps = [(type(e).__name__, getattr(e, "count", 1), str(e)) for e in san.reports]
            total = sum(rep[1] for rep in reps)
            if total != seen:
                print(json.dumps([t, c, reps]))
                seen = total
        print(json.dumps([t, "end", [(type(e).__name__, e.count, str(e)) for e in san.reports], state(san)]))


def state(san) -> list:
    """What a trace leaves: each live extent (base, end, generation, records), the graveyard's
    extents and records, the host's clock and each stream's (entries above 0)."""
    def recs(rl) -> list:
        return [(r.sid, r.epoch, r.kind, r.lo, r.hi, r.per, r.ch, r.gen, r.block) for r in rl]

    def clock(c) -> list:
        return sorted((k, v) for k, v in c.items() if v)
    live = sorted((b, e.end, e.gen, e.pinned, recs(e.recs)) for b, e in san._live.items())
    grave = [(k, recs(v)) for k, v in zip(san._grave.keys(), san._grave.values())]
    return [live, grave, clock(san._host), sorted((s, clock(c)) for s, c in san._clock.items())]


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--child":
        run(int(args[1]), int(args[2]), int(args[3]))
        return 0
    opts = {"--traces": "200", "--seed": "1", "--calls": "120"}
    paths = []
    while args:
        a = args.pop(0)
        if a in opts:
            opts[a] = args.pop(0)
        else:
            paths.append(os.path.abspath(a))
    if not paths:
        sys.exit(__doc__)
    if len(paths) == 1:
        paths.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    outs = []
    for src in paths:
        env = dict(os.environ, PYTHONPATH=src)
        p = subprocess.run([sys.executable, __file__, "--child", opts["--seed"], opts["--traces"], opts["--calls"]],
                           env=env, capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"{src}: the replay failed:\n{p.stderr[-3000:]}")
        outs.append(p.stdout.splitlines())
    old, new = outs
    for a, b in zip(old, new):
        if a != b:
            print("DIFFERENT\n--- old:", a[:4000], "\n--- new:", b[:4000], sep="\n")
            return 1
    if len(old) != len(new):
        print(f"DIFFERENT: {len(old)} lines against {len(new)}")
        return 1
    reports = sum(len(json.loads(line)[2]) for line in old if json.loads(line)[1] == "end")
    print(f"same: {opts['--traces']} traces of {opts['--calls']} calls (seed {opts['--seed']}), "
          f"{len(old)} report changes, {reports} reports at the ends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
