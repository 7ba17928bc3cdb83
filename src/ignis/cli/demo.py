"""``ignis demo``: a short end-to-end run of the runtime and the memory layer,
then the tour (``ignis.cli.tour``).

On whichever backend is active it fills a device block from the host on
stream A, hands it to stream B through an event, copies it device to device
on B with cross-stream tracking, copies it back and checks every byte; then
shows the caching pool reusing memory across streams behind an event wait,
and a double free being caught. Each step prints one line.

Rules: every check that fails raises ``DemoFailed``, and ``run`` turns it (or
an Ignis error) into one "FAILED: ..." line and exit status 1. Everything the
demo makes is released on the way out, success or not.
``add_parser(subparsers)`` adds the command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, TextIO

import numpy as np

from ..errors import DoubleFreeError, IgnisError
from ..memory import Access, BlockState, DeviceMemoryResource, PinnedHostResource, PoolResource, get_current_resource
from ..runtime import Device
from ..units import format_bytes
from .args import ordinal as _ordinal

__all__ = ["run", "DemoFailed", "add_parser"]

# Over the pool's 10 MiB large-block limit, each block gets a segment of its
# own with no split remainder, so which memory the reuse step gets is certain.
NBYTES = 12 << 20


class DemoFailed(Exception):
    """A check of the demo did not hold."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise DemoFailed(what)


def _pool_of(mr: DeviceMemoryResource) -> PoolResource | None:
    """The caching pool under ``mr`` (``mr`` itself, or below its adaptors)."""
    while mr is not None:
        if isinstance(mr, PoolResource):
            return mr
        mr = getattr(mr, "upstream", None)
    return None


def run(out: TextIO | None = None, *, device: int = 0) -> int:
    """Run the demo on ``device``, printing to ``out`` (default: ``sys.stdout`` as it is at the
    call). Returns 0 on success, 1 on failure."""
    out = sys.stdout if out is None else out

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    try:
        _run(say, device)
    except DemoFailed as e:
        say(f"FAILED: {e}")
        return 1
    except (IgnisError, ValueError, MemoryError, ImportError) as e:  # ImportError: no cuda-bindings
        say(f"FAILED: {type(e).__name__}: {e}")
        return 1
    say("demo passed: every check held")
    return 0


def _run(say: Callable[[str], None], ordinal: int) -> None:
    dev = Device(ordinal)
    backend = dev.backend
    mr = get_current_resource(dev)
    pool = _pool_of(mr)
    say(f"Ignis demo on device {dev.ordinal} ({dev.name}, {backend.name} backend)")
    say(f"current resource: {mr!r}")
    if pool is not None:
        pool.trim()  # start from an empty cache, so that the reuse step is predictable
    mr.reap_pending()
    outstanding_before = mr.bytes_outstanding

    pinned = PinnedHostResource(backend)
    streams: list[Any] = []
    live: list[Any] = []
    try:
        a = dev.create_stream()
        streams.append(a)
        b = dev.create_stream()
        streams.append(b)
        say(f" 1. created streams A (#{a.id}) and B (#{b.id})")

        data = np.random.default_rng(2024).integers(0, 256, NBYTES, dtype=np.uint8)
        src = mr.allocate(NBYTES, a, tag="demo.src")
        live.append(src)
        say(f" 2. allocated src: {format_bytes(NBYTES)} on A at {src.ptr:#x} (generation {src.generation})")

        stage = pinned.allocate(NBYTES)
        np.copyto(stage.array, data)
        mr.prepare_block_use(src, a, Access.WRITE)
        backend.memcpy_htod_async(src.ptr, stage.ptr, NBYTES, a.handle)
        mr.finish_block_use(src, a, Access.WRITE)
        stage.release(a)  # reused only once A is past the copy
        say(" 3. A: host data -> pinned buffer -> src (tracked WRITE); the host did not wait")

        ready = a.record()
        b.wait(ready)
        ready.close()
        say(" 4. A: recorded an event; B waits on it (only B waits, not the host)")

        dst = mr.allocate(NBYTES, b, tag="demo.dst")
        live.append(dst)
        waits = getattr(pool, "cross_stream_waits", 0)
        mr.prepare_block_use(src, b, Access.READ)
        mr.prepare_block_use(dst, b, Access.WRITE)
        backend.memcpy_dtod_async(dst.ptr, src.ptr, NBYTES, b.handle)
        mr.finish_block_use(src, b, Access.READ)
        mr.finish_block_use(dst, b, Access.WRITE)
        added = getattr(pool, "cross_stream_waits", 0) - waits
        say(f" 5. allocated dst on B at {dst.ptr:#x}; B: src -> dst (tracked READ of src, WRITE of dst; "
            f"tracking queued {added} wait(s) of its own)")

        back = pinned.allocate(NBYTES)
        mr.prepare_block_use(dst, b, Access.READ)
        backend.memcpy_dtoh_async(back.ptr, dst.ptr, NBYTES, b.handle)
        mr.finish_block_use(dst, b, Access.READ)
        b.synchronize()
        wrong = int(np.count_nonzero(back.array != data))
        back.release()
        _check(wrong == 0, f"{wrong} of {NBYTES} bytes came back different from what was written")
        say(f" 6. B: dst -> pinned buffer -> host; all {NBYTES} bytes match")

        src_ptr = src.ptr
        waits = getattr(pool, "cross_stream_waits", 0)
        mr.deallocate(src)
        live.remove(src)
        again = mr.allocate(NBYTES, b, tag="demo.again")
        live.append(again)
        if pool is not None:
            added = pool.cross_stream_waits - waits
            _check(again.ptr == src_ptr, f"the pool did not reuse src's memory ({src_ptr:#x}) for the same "
                                         f"size on B: it gave {again.ptr:#x}")
            _check(added >= 2, f"reuse across streams queued {added} event wait(s); expected A to wait for "
                               "B's read before the free and B to wait for A before the reuse")
            say(f" 7. freed src on A, allocated {format_bytes(NBYTES)} on B: the pool handed back {again.ptr:#x}, "
                f"src's memory, ordered by {added} event waits (A after B's read, B after A's free), "
                "no host sync")
        else:
            say(f" 7. freed src on A, allocated {format_bytes(NBYTES)} on B at {again.ptr:#x} "
                f"(the current resource is not a caching pool: no reuse to show)")

        try:
            mr.deallocate(src)
        except DoubleFreeError as e:
            _check(again.state is BlockState.LIVE, "the double free disturbed the block now at that address")
            say(f" 8. freeing src a second time is caught: DoubleFreeError: {e}")
        else:
            raise DemoFailed("a second deallocate of src was not caught")

        for block in (again, dst):
            mr.deallocate(block)
            live.remove(block)
        a.synchronize()
        b.synchronize()
        mr.reap_pending()
        _check(mr.bytes_outstanding == outstanding_before,
               f"{mr.bytes_outstanding - outstanding_before} bytes still outstanding after freeing everything")
        say(" 9. freed dst and the reused block; nothing left outstanding")

        if pool is not None:
            say(f"pool statistics: reserved {format_bytes(pool.bytes_reserved)}, outstanding "
                f"{format_bytes(pool.bytes_outstanding)}, cached {format_bytes(pool.bytes_cached)}, "
                f"segments allocated {pool.num_segment_allocs}, cross-stream waits {pool.cross_stream_waits}")
        else:
            say(f"resource statistics: outstanding {format_bytes(mr.bytes_outstanding)}")
    finally:
        _cleanup(mr, streams, live, pinned)


def _cleanup(mr: DeviceMemoryResource, streams: list[Any], live: list[Any], pinned: PinnedHostResource) -> None:
    """Release everything the run made. Best effort: on a failed run the
    failure is what gets reported, not a second error from here."""
    for s in streams:
        try:
            s.synchronize()
        except Exception:
            pass
    for block in live:
        try:
            mr.deallocate(block)
        except Exception:
            pass
    try:
        pinned.close()
        pool = _pool_of(mr)
        if pool is not None:
            pool.trim()  # no cache left on streams about to close
    except Exception:
        pass
    for s in streams:
        s.close()


# -- the command -------------------------------------------------------------------------
def _command(args: argparse.Namespace) -> int:
    """``ignis demo``: the demo, then the tour, on ``--device``; 1 when either failed."""
    from .tour import tour
    with Device(args.device):  # what the demo makes without naming a device lands there too
        rc = run(sys.stdout, device=args.device)
        return tour(sys.stdout, device=args.device) or rc


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); returns its parser."""
    demo = subparsers.add_parser("demo", help="a short end-to-end run and a tour: streams, tracked copies, pool "
                                              "reuse, safetensors, a KV cache, one caught bug of each class, a "
                                              "timeline",
                                 description="Part 1, the demo: copy bytes host -> device -> device -> host "
                                             "across two streams with cross-stream tracking, check them, show the "
                                             "pool reusing memory across streams and a double free caught. Part "
                                             "2, the tour: save a small model to safetensors from the device and "
                                             "load it back; a two-stream pipeline appending to a KV cache; one "
                                             "planted bug of each class caught with its report (a race, a use "
                                             "after free, a double free, a stale handle, an out-of-bounds write, "
                                             "a leak); the memory summary with its peaks; a snapshot for "
                                             "https://pytorch.org/memory_viz and a timeline PNG (with "
                                             "matplotlib). Runs in seconds, on a GPU or on the emulator.")
    demo.add_argument("--device", type=_ordinal, default=0, help="device to run on (default 0)")
    demo.set_defaults(func=_command)
    return demo
