#!/usr/bin/env python3
"""One planted bug of each class, each caught with its report.

On a GPU these bugs corrupt memory or read stale bytes without a word; here
each one is a Python exception that says what happened and what to do:

==========================  ==============================================  =============================
bug                         how it is planted                               caught by
==========================  ==============================================  =============================
race between streams        a write on one stream, a read on another,       the sanitizer (``RaceError``,
                            no event between them (``manual`` ordering)     with both stacks)
use after free              a kernel launched on a freed array              ``UseAfterFreeError``
double free                 ``free()`` twice                                ``DoubleFreeError``
stale handle                a ``GpuRef`` used after its device's context    ``StaleHandleError``
                            was rebuilt (emulator only)
out-of-bounds write         a raw write 4 bytes past the end of a block     the guard (``OutOfBoundsError``)
write after free            a raw write into a freed block in quarantine    the guard (``UseAfterFreeError``)
free while owned elsewhere  ``free()`` while the ``"io"`` layer holds it    ``MemoryContractViolation``
free while exported         ``free()`` while a DLPack consumer (NumPy on    ``MemoryContractViolation``
                            the emulator, PyTorch on a GPU) holds it
write to read-only memory   ``fill_`` on an import of a read-only array     ``ReadOnlyError``
implicit host copy          ``np.asarray(array)``                           ``TypeError`` (use to_numpy())
pickling device memory      ``pickle.dumps(array)``                         ``TypeError`` (use ignis.ipc)
leak                        an array nobody frees                           ``contract.audit()``
==========================  ==============================================  =============================

Each bug runs in its own sandbox and cleans up after itself. Run from the
repository root, on either backend::

    .venv/bin/python examples/catch_bugs.py

It prints one line per bug (``caught ...`` or ``skipped: why``) and
``every planted bug was caught`` (exit status 0); a bug that got through
is a ``MISSED`` line and exit status 1.
"""

from __future__ import annotations

import pickle
import sys
from typing import Callable

import numpy as np

import ignis as ig

K = ig.kernels
dev = ig.Device(0)
missed = 0


def first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return text if len(text) <= 200 else text[:197] + "..."


def caught(label: str, expected: type[BaseException], plant: Callable[[], object]) -> BaseException | None:
    """Run ``plant``; report whether it raised ``expected``."""
    global missed
    try:
        plant()
    except expected as e:
        print(f"{label:<27} caught {first_line(e)}")
        return e
    except Exception as e:  # noqa: BLE001 - the wrong error is a miss, and says which
        print(f"{label:<27} MISSED: expected {expected.__name__}, got {first_line(e)}")
    else:
        print(f"{label:<27} MISSED: nothing was raised")
    missed += 1
    return None


def skipped(label: str, why: str) -> None:
    print(f"{label:<27} skipped: {why}")


# -- the bugs ---------------------------------------------------------------------------------
def race() -> None:
    a, b = dev.create_stream(), dev.create_stream()
    x = ig.empty(4096, "float32", stream=a)
    y = ig.empty(4096, "float32", stream=b)
    dev.synchronize()
    try:
        # manual: Ignis queues no waits of its own, so the program's events must order
        # its streams (as with raw CUDA); the sanitizer checks that they do.
        with ig.ordering("manual"), ig.sanitizer.enabled("raise"):
            K.fill(x, 1.0, stream=a)
            K.copy(y, x, stream=b)           # BUG: reads x on b with no event after a's write
    finally:
        dev.synchronize()
        x.free()
        y.free()
        a.close()
        b.close()


def use_after_free() -> None:
    x = ig.zeros(8)
    x.free()
    K.fill(x, 1.0)                           # BUG


def double_free() -> None:
    x = ig.zeros(8)
    x.free()
    x.free()                                 # BUG


def stale_handle(spare: ig.Device) -> None:
    x = ig.zeros(8, device=spare)
    ref = x.ref()                            # a generation-checked handle
    spare.rebuild()                          # the context is gone, and every pointer made in it
    del x
    ref.access()                             # BUG


def out_of_bounds() -> None:
    pool = ig.PoolResource(ig.DirectResource(dev))
    guard = ig.DebugGuardResource(pool)      # canaries around every block, checked on free
    x = ig.empty(1000, "uint8", mr=guard)
    try:
        # BUG: an off-by-four kernel: 1004 bytes written into a 1000-byte buffer
        dev.backend.memset_d8_async(x.device_ptr, 7, 1004, x.stream.handle)
        x.free()
    finally:
        guard.close()
        pool.close()


def write_after_free() -> None:
    pool = ig.PoolResource(ig.DirectResource(dev))
    guard = ig.DebugGuardResource(pool)      # freed blocks wait, poisoned, in a quarantine
    x = ig.empty(1000, "uint8", mr=guard)
    ptr, stream = x.device_ptr, x.stream
    x.free()
    try:
        dev.backend.memset_d8_async(ptr + 100, 1, 8, stream.handle)   # BUG: a stale raw pointer
        guard.flush()                        # the quarantine is checked as blocks leave it
    finally:
        guard.close()
        pool.close()


def free_while_owned() -> None:
    x = ig.zeros(8)
    ig.contract.acquire(x, by="io")          # the io layer is writing it, say
    try:
        x.free()                             # BUG: "compute" frees what "io" holds
    finally:
        ig.contract.release(x, by="io")
        x.free()


def free_while_exported(consume: Callable[[ig.NvArray], object]) -> None:
    x = ig.zeros(8)
    held = consume(x)                        # a consumer imports the memory, zero-copy
    try:
        x.free()                             # BUG: the consumer still uses the memory
    finally:
        del held                             # once the consumer lets go, free works
        x.free()


def write_read_only() -> None:
    frozen = np.arange(8, dtype=np.float32)
    frozen.flags.writeable = False
    x = ig.from_dlpack(frozen)               # zero-copy and read-only, as the producer said
    x.fill_(0.0)                             # BUG


def implicit_host_copy() -> None:
    x = ig.zeros(8)
    try:
        np.asarray(x)                        # BUG: would hide a device-to-host copy
    finally:
        x.free()


def pickle_device_memory() -> None:
    x = ig.zeros(8)
    try:
        pickle.dumps(x)                      # BUG: a pointer means nothing in another process
    finally:
        x.free()


def leak() -> bool:
    prev = ig.contract.track_all
    ig.contract.track_all = True             # what `ignis run --leaks` turns on
    try:
        forgotten = ig.zeros(256, tag="leaky_cache")   # BUG: a cache nobody empties
    finally:
        ig.contract.track_all = prev
    rows = [r for r in ig.contract.audit(older_than=0.0) if r.get("tag") == "leaky_cache"]
    forgotten.free()
    if rows:
        r = rows[0]
        print(f"{'leak':<27} caught by contract.audit(): NvArray#{r['array_id']}, {r['nbytes']} B, tag "
              f"{r['tag']!r}, owner {r['owner']!r}, alive {r['age_ms']} ms")
        return True
    print(f"{'leak':<27} MISSED: contract.audit() did not list the forgotten array")
    return False


def main() -> int:
    global missed
    emulated = ig.backend_name() == "emulated"
    print(f"planting bugs on device 0 ({dev.name}, {ig.backend_name()} backend):")

    err = caught("race between streams", ig.RaceError, race)
    if err is not None:
        print("  the full report names both accesses and both stacks:")
        print("\n".join("  | " + line for line in str(err).splitlines()))
    caught("use after free", ig.UseAfterFreeError, use_after_free)
    caught("double free", ig.DoubleFreeError, double_free)
    if emulated and ig.device_count() > 1:
        spare = ig.Device(ig.device_count() - 1)
        caught("stale handle", ig.StaleHandleError, lambda: stale_handle(spare))
    else:
        skipped("stale handle", "needs a spare emulated device (this example does not rebuild a real GPU's context)")
    caught("out-of-bounds write", ig.OutOfBoundsError, out_of_bounds)
    caught("write after free", ig.UseAfterFreeError, write_after_free)
    caught("free while owned elsewhere", ig.MemoryContractViolation, free_while_owned)
    if emulated:   # the emulated backend exports CPU tensors, which NumPy imports
        caught("free while exported", ig.MemoryContractViolation, lambda: free_while_exported(np.from_dlpack))
    else:
        try:
            import torch
            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
        if not has_cuda:
            skipped("free while exported", "needs a CUDA build of PyTorch on a GPU (NumPy cannot import "
                                           "device memory)")
        else:
            caught("free while exported", ig.MemoryContractViolation,
                   lambda: free_while_exported(torch.from_dlpack))
    if emulated:
        caught("write to read-only memory", ig.ReadOnlyError, write_read_only)
    else:
        skipped("write to read-only memory", "the example's read-only producer is a NumPy array (emulator only)")
    caught("implicit host copy", TypeError, implicit_host_copy)
    caught("pickling device memory", TypeError, pickle_device_memory)
    if not leak():
        missed += 1

    if missed:
        print(f"{missed} planted bug(s) were MISSED")
        return 1
    print("every planted bug was caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
