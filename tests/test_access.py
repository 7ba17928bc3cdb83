"""The one public tracked-access API: ``NvArray.access`` and ``NvArray.access_all``.

Acquire for the owner ``by`` -> prepare the tracked use (cross-stream waits, the
sanitizer) -> the device pointer -> record the use -> release, also when the block
raises. Each test runs on the active backend (the emulator here)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import ignis as ig
from helpers import read, sleep_on, write

K = ig.kernels
SRC = Path(__file__).resolve().parents[1] / "src" / "ignis"


def _state(x: ig.NvArray, streams: list) -> tuple:
    """What the memory layer recorded about x's block: (last writer, readers), as stream indices."""
    writer, _, readers = x._block.hazard_record()
    idx = {id(s): i for i, s in enumerate(streams)}
    ws = None if writer is None else idx.get(id(writer), "other")
    rd = None if readers is None else sorted(idx.get(id(s), "other") for s in readers)
    return ws, rd


# -- modes and pointers ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["read", "write", "read_write", "READ-WRITE", ig.Access.READ, ig.Access.WRITE,
                                  ig.Access.READ_WRITE])
def test_each_mode_is_recorded_as_its_access(dev, streams, mode):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    with x.access(s1, mode) as ptr:
        assert ptr == x.device_ptr
    acc = mode if isinstance(mode, ig.Access) else ig.Access[mode.upper().replace("-", "_")]
    if acc.writes:
        assert _state(x, streams) == (1, None)     # s1 is the last writer now
    else:
        assert _state(x, streams) == (0, [1])      # s0 still the writer; s1 a reader


@pytest.mark.parametrize("mode", ["sideways", None, 3, "", b"read"])
def test_a_bad_mode_is_refused_before_anything_happens(dev, mode):
    x = ig.zeros(8)
    with pytest.raises(ValueError, match="unknown access mode.*'read', 'write', 'read_write'"):
        x.access(mode=mode)
    with pytest.raises(ValueError, match="unknown access mode"):
        ig.NvArray.access_all([(x, mode or "bad")])


def test_a_write_through_the_pointer_lands_in_the_array(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(4096, "uint8", stream=s0)
    with x.access(s1, "write", offset=1024, nbytes=16) as ptr:
        assert ptr == x.device_ptr + 1024
        dev.backend.memset_d8_async(ptr, 7, 16, s1.handle)
    got = x.to_numpy()  # on s0: waits for s1's write, which access() recorded
    assert (got[1024:1040] == 7).all() and got[:1024].sum() == 0 and got[1040:].sum() == 0


def test_stream_none_is_the_current_stream_else_the_arrays_own(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    with s1:
        with x.access(mode="write"):
            pass
    assert _state(x, streams)[0] == 1
    with x.access(mode="write"):
        pass
    assert _state(x, streams)[0] == 0
    with pytest.raises(TypeError, match="ignis.Stream"):
        x.access(s1.handle)


# -- the same ordering as use() --------------------------------------------------------------

def test_cross_stream_ordering_is_recorded_exactly_as_use_does(dev, streams):
    s0, s1, s2 = streams
    via_use = ig.zeros(4096, "uint8", stream=s0)
    via_access = ig.zeros(4096, "uint8", stream=s0)
    dev.synchronize()
    steps = [(s1, "write"), (s2, "read"), (s0, "read"), (s2, "read_write"), (s1, "read")]
    for s, mode in steps:
        with via_use.use(s, mode):
            pass
        with via_access.access(s, mode):
            pass
        assert _state(via_access, streams) == _state(via_use, streams), (s, mode)


class _CountingPool(ig.PoolResource):
    """A pool subclass that overrides the tracking methods (as a user's resource may)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def prepare_block_use(self, block, stream, access, span=None):
        self.calls.append(("prepare", stream.id))
        super().prepare_block_use(block, stream, access, span)

    def finish_block_use(self, block, stream, access):
        self.calls.append(("finish", stream.id))
        super().finish_block_use(block, stream, access)


def test_use_calls_a_resources_own_tracking_methods(dev, streams):
    # The compiled tracked use calls TrackedResource's bodies directly only where nothing
    # overrides them: a subclass's methods, and methods set on the instance, are called.
    s0, s1, _ = streams
    mr = _CountingPool(ig.AsyncResource(dev))
    a = ig.empty(256, "uint8", mr=mr, stream=s0)
    with a.use(s1, "write"):
        pass
    assert mr.calls == [("prepare", s1.id), ("finish", s1.id)]
    plain = ig.PoolResource(ig.AsyncResource(dev))
    seen = []
    real_prepare, real_finish = plain.prepare_block_use, plain.finish_block_use
    plain.prepare_block_use = lambda *args: (seen.append("prepare"), real_prepare(*args))
    plain.finish_block_use = lambda *args: (seen.append("finish"), real_finish(*args))
    b = ig.empty(256, "uint8", mr=plain, stream=s0)
    with b.use(s1, "read"):
        pass
    assert seen == ["prepare", "finish"]
    dev.synchronize()
    a.free()
    b.free()


def test_a_read_on_another_stream_waits_for_a_slow_write(dev, streams):
    s0, s1, s2 = streams
    x = ig.zeros(4096, "uint8", stream=s0)
    dev.synchronize()
    sleep_on(s1, 0.2)
    with x.access(s1, "write") as ptr:
        keep = write(ptr, b"\x07" * 4096, s1)  # queued behind the sleep
    with x.access(s2, "read") as ptr:  # queues the wait for s1's write on s2
        got = read(ptr, 4096, s2)
    assert got == b"\x07" * 4096
    s1.synchronize()
    del keep


# -- owners ----------------------------------------------------------------------------------

def test_a_layer_holds_the_array_for_the_block_and_releases_it(dev):
    ig.register_owner("prefetcher")
    x = ig.zeros(32)
    with x.access(mode="write", by="prefetcher"):
        assert x.owner == "prefetcher"
        with pytest.raises(ig.MemoryContractViolation, match="owned by 'prefetcher'"):
            x.free()
    assert x.owner == "compute"
    x.free()


def test_compute_is_refused_while_a_layer_holds_the_array(dev):
    x = ig.zeros(32)
    ig.contract.acquire(x, "io")
    try:
        with pytest.raises(ig.MemoryContractViolation, match=r"held by 'io'; 'compute' cannot access it \(mine\)") as ei:
            with x.access(op="mine"):
                pytest.fail("the block ran")
        assert ei.value.owner == "io" and ei.value.caller == "compute"
        with pytest.raises(ig.MemoryContractViolation, match="held by 'io'"):
            x.access(by="collective").__enter__()
        with pytest.raises(ig.MemoryContractViolation, match="already owned by 'io': double acquire"):
            x.access(by="io").__enter__()
        with x.access(by=None) as ptr:  # no ownership: a plain tracked use whoever holds it
            assert ptr == x.device_ptr and x.owner == "io"
        assert x.owner == "io"
    finally:
        ig.contract.release(x, "io")


def test_unknown_owner_and_shared_array_are_refused(dev):
    x = ig.zeros(32)
    with pytest.raises(ValueError, match="unknown owner 'nobody'"):
        x.access(by="nobody")
    x.incref()
    x.incref()
    with pytest.raises(ig.MemoryContractViolation, match="shared"):
        with x.access(by="io"):
            pass
    with x.access():  # compute's own use of a shared array is fine
        pass
    assert x.owner == "compute"
    x.decref()
    x.decref()


@pytest.mark.parametrize("op", ["acquire", "release", "assert_owner", "track", "untrack", "holding"])
def test_the_contract_refuses_what_is_not_an_array(op):
    """A NumPy array (or anything else) is a clear TypeError, not an AttributeError from inside."""
    c = ig.contract
    call = {"acquire": lambda x: c.acquire(x, "io"), "release": lambda x: c.release(x, "io"),
            "assert_owner": lambda x: c.assert_owner(x, "io"), "track": c.track, "untrack": c.untrack,
            "holding": lambda x: c.holding(x, "io").__enter__()}[op]
    for bad in (np.zeros(3), None, "array"):
        with pytest.raises(TypeError, match=f"contract.{'acquire' if op == 'holding' else op} takes an NvArray"):
            call(bad)


def test_a_view_is_held_through_its_root(dev):
    x = ig.zeros((4, 8))
    row = x[1]
    with row.access(mode="write", by="io") as ptr:
        assert ptr == x.device_ptr + 32
        assert x.owner == row.owner == "io"
    assert x.owner == row.owner == "compute"
    with ig.NvArray.access_all([(x[0], "read"), (x[2], "write"), (x, "read", 0, 4)], by="io") as ptrs:
        assert ptrs == [x.device_ptr, x.device_ptr + 64, x.device_ptr]
        assert x.owner == "io"  # acquired once for the three
    assert x.owner == "compute"



@pytest.mark.parametrize("n", [3, 12])  # a few uses, compared one by one; many: a set of roots
def test_many_uses_hold_each_root_once_and_a_refusal_gives_all_back(dev, n):
    roots = [ig.zeros((2, 8)) for _ in range(n)]
    uses = [(r[i % 2], "read") for i, r in enumerate(roots)] + [(r, "write", 0, 8) for r in roots]
    with ig.NvArray.access_all(uses, by="io") as ptrs:
        assert len(ptrs) == 2 * n
        assert all(r.owner == "io" for r in roots)
    assert all(r.owner == "compute" for r in roots)
    ig.contract.acquire(roots[-1], "ipc")  # the last one is refused: every root taken before goes back
    with pytest.raises(ig.MemoryContractViolation, match="held by 'ipc'"):
        with ig.NvArray.access_all(uses, by="io"):
            pytest.fail("the block ran")
    assert [r.owner for r in roots] == ["compute"] * (n - 1) + ["ipc"]
    ig.contract.release(roots[-1], "ipc")


# -- exceptions in the block -----------------------------------------------------------------

def test_an_exception_in_the_block_still_records_the_use_and_releases(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    with pytest.raises(KeyError, match="boom"):
        with x.access(s1, "write", by="io"):
            raise KeyError("boom")
    assert x.owner == "compute"
    assert _state(x, streams) == (1, None)  # the work queued before the error is waited for


def test_finish_on_error_false_records_nothing_for_a_failed_block(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    with pytest.raises(KeyError):
        with x.access(s1, "write", by="io", finish_on_error=False):
            raise KeyError("boom")
    assert x.owner == "compute"
    assert _state(x, streams) == (0, None)
    with x.access(s1, "write", by="io", finish_on_error=False):  # a block that succeeds records
        pass
    assert _state(x, streams) == (1, None)


def test_a_failed_preparation_releases_and_records_nothing(dev, streams):
    s0, s1, _ = streams
    direct = ig.DirectResource(dev)
    x = ig.zeros(16, mr=direct, stream=s0)
    with pytest.raises(ig.StreamMisuseError, match="own stream"):
        with x.access(s1, by="io"):
            pytest.fail("the block ran")
    assert x.owner == "compute"
    with x.access(s0, "write", by="io") as ptr:  # its own stream is fine
        assert ptr == x.device_ptr
    x.free()
    closed = dev.create_stream()
    closed.close()
    y = ig.zeros(16)
    with pytest.raises(ig.ClosedError):
        with y.access(closed, by="io"):
            pass
    assert y.owner == "compute"


# NumPy hands DLPack tensors in host memory: device memory on the emulated backend only.
def test_a_write_to_read_only_memory_is_refused(dev, on_emulated):
    src = np.arange(8, dtype=np.float32)
    src.flags.writeable = False
    x = ig.from_dlpack(src)
    assert x.readonly
    with x.access():
        pass
    with pytest.raises(ig.ReadOnlyError, match="my write"):
        with x.access(mode="write", by="io", op="my write"):
            pass
    assert x.owner == "compute"


# -- ranges ----------------------------------------------------------------------------------

def test_byte_ranges_are_checked(dev):
    x = ig.zeros(16, "float32")  # 64 bytes
    with x.access(offset=60, nbytes=4) as ptr:
        assert ptr == x.device_ptr + 60
    with x.access(offset=np.int64(64), nbytes=0) as ptr:  # an empty range at the end
        assert ptr == x.device_ptr + 64
    with x.access(offset=8) as ptr:  # nbytes None: to the end
        assert ptr == x.device_ptr + 8
    with pytest.raises(ig.OutOfBoundsError, match=r"bytes \[60, 68\) of NvArray#\d+, which has 64 bytes") as ei:
        x.access(offset=60, nbytes=8)
    assert ei.value.side == "after" and ei.value.offset == 68
    with pytest.raises(ig.OutOfBoundsError) as ei:
        x.access(offset=-4, nbytes=4)
    assert ei.value.side == "before"
    with pytest.raises(ig.OutOfBoundsError):
        x.access(offset=65)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        x.access(nbytes=-1)
    with pytest.raises(TypeError, match="offset must be an int"):
        x.access(offset=1.5)
    with pytest.raises(TypeError, match="offset must be an int"):
        x.access(offset=True)
    with pytest.raises(TypeError, match="nbytes must be an int"):
        x.access(nbytes="4")


def test_the_sanitizer_sees_exactly_the_bytes_accessed(dev, streams, san, manual):
    s0, s1, _ = streams
    x = ig.empty(1024, "uint8", stream=s0)
    dev.synchronize()
    with x.access(s0, "write", offset=0, nbytes=512, op="left half"):
        pass
    with x.access(s1, "write", offset=512, nbytes=512, op="right half"):
        pass  # disjoint bytes on another stream: no race
    with pytest.raises(ig.RaceError) as ei:
        with x.access(s1, "read", offset=256, nbytes=16, op="peek"):
            pytest.fail("the block ran")
    e = ei.value
    assert e.kind == "read-after-write race"
    assert e.first["op"] == "left half" and e.second["op"] == "peek"
    assert e.second["range"] == (256, 272)


# -- freed arrays, nesting, reuse ------------------------------------------------------------

def test_a_freed_array_is_refused(dev):
    x = ig.zeros(8)
    pending = x.access(mode="write")
    x.free()
    with pytest.raises(ig.UseAfterFreeError, match=rf"NvArray#{x.id}: it was freed"):
        with pending:
            pytest.fail("the block ran")
    with pytest.raises(ig.UseAfterFreeError):
        with x.access(by="io"):
            pass
    with pytest.raises(ig.UseAfterFreeError):
        with ig.NvArray.access_all([(x, "read")], by=None):
            pass


def test_nested_accesses(dev, streams):
    s0, s1, s2 = streams
    x = ig.zeros(64, "uint8", stream=s0)
    y = ig.zeros(64, "uint8", stream=s0)
    with x.access(s1, "read") as p1:
        with x.access(s2, "read") as p2:  # two readers of one array, on two streams
            assert p1 == p2
    assert _state(x, streams) == (0, [1, 2])
    with x.access(s1, "write", by="io"):
        with y.access(s1, "read", by="io"):  # another array for the same layer
            assert (x.owner, y.owner) == ("io", "io")
        assert y.owner == "compute"
        with x.access(s1, "read", by=None, offset=8, nbytes=8):  # the holder's own further use
            pass
        with pytest.raises(ig.MemoryContractViolation, match="double acquire"):
            with x.access(s1, by="io"):
                pass
        with pytest.raises(ig.MemoryContractViolation, match="held by 'io'"):
            with x.access(s1):
                pass
        assert x.owner == "io"  # the refused inner accesses left the outer hold alone
    assert x.owner == "compute"


def test_an_access_is_entered_once(dev):
    x = ig.zeros(8)
    acc = x.access()
    with acc:
        pass
    with pytest.raises(RuntimeError, match="already entered"):
        with acc:
            pass


# -- several arrays --------------------------------------------------------------------------

def test_access_all_is_all_or_nothing(dev, streams, san, manual):
    s0, s1, _ = streams
    x = ig.empty(256, "uint8", stream=s0)
    y = ig.empty(256, "uint8", stream=s0)
    dev.synchronize()
    ig.contract.acquire(y, "ipc")
    with pytest.raises(ig.MemoryContractViolation, match="held by 'ipc'"):
        with ig.NvArray.access_all([(x, "write"), (y, "read")], s1, by="io"):
            pytest.fail("the block ran")
    assert (x.owner, y.owner) == ("compute", "ipc")
    assert _state(x, streams) == (0, None)
    K.fill(x, 1, stream=s0)  # no phantom write of x on s1 for the sanitizer to race with
    ig.contract.release(y, "ipc")


def test_access_all_holds_without_using_and_checks_its_uses(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    y = ig.zeros(64, "uint8", stream=s0)
    with ig.NvArray.access_all([(x, None), (y, "write", 0, 32)], s1, by="io") as ptrs:
        assert ptrs == [x.device_ptr, y.device_ptr]
        assert (x.owner, y.owner) == ("io", "io")
    assert _state(x, streams) == (0, None)  # held only: no tracked use
    assert _state(y, streams) == (1, None)
    with ig.NvArray.access_all([]) as ptrs:
        assert ptrs == []
    for bad in ([x], [(x,)], [(x, "read", 0)], [(np.zeros(3), "read")]):
        with pytest.raises(TypeError, match=r"\(NvArray, mode\)"):
            ig.NvArray.access_all(bad)
    with pytest.raises(ig.OutOfBoundsError):
        ig.NvArray.access_all([(x, "read", 32, 64)])
    with pytest.raises(ValueError, match="unknown access mode"):
        x.access(mode=None)  # holding without a use is access_all's only


def test_access_all_on_an_exception_records_then_releases(dev, streams):
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    y = ig.zeros(64, "uint8", stream=s0)
    with pytest.raises(OSError):
        with ig.NvArray.access_all([(x, "read"), (y, "write")], s1, by="io"):
            raise OSError("disk full")
    assert (x.owner, y.owner) == ("compute", "compute")
    assert _state(x, streams) == (0, [1]) and _state(y, streams) == (1, None)


def test_a_block_held_without_with_enters_and_exits_as_the_with_statement(dev, streams):
    """``access_block`` + ``enter()`` / ``exit(ok)`` (the collective enqueue path's form of the
    block): the same checks, holds, records and releases as ``with NvArray.access_all``."""
    from ignis.array.nvarray import access_block
    s0, s1, _ = streams
    x = ig.zeros(64, "uint8", stream=s0)
    y = ig.zeros(64, "uint8", stream=s0)
    block = access_block([(x, "read"), (y, "write")], s1, "io", "test", False)
    assert block.enter() == [x.device_ptr, y.device_ptr]
    assert (x.owner, y.owner) == ("io", "io")
    block.exit(True)
    assert (x.owner, y.owner) == ("compute", "compute")
    assert _state(x, streams) == (0, [1]) and _state(y, streams) == (1, None)
    block.exit(True)  # finished already: nothing more
    assert (x.owner, y.owner) == ("compute", "compute")
    with pytest.raises(RuntimeError, match="already entered"):
        block.enter()
    # A block that did not run to its end, not finishing on error: released, nothing recorded.
    z = ig.zeros(64, "uint8", stream=s0)
    block = access_block([(z, "write")], s1, "io", "test", False)
    block.enter()
    block.exit(False)
    assert z.owner == "compute" and _state(z, streams) == (0, None)
    # finish_on_error: recorded all the same, as the with statement does when its block raised.
    block = access_block([(z, "write")], s1, "io", "test", True)
    block.enter()
    block.exit(False)
    assert z.owner == "compute" and _state(z, streams) == (1, None)
    # An exit before the block was entered is refused, and leaves the block to be entered.
    block = access_block([(z, "read")], s1, "io", "test", False)
    with pytest.raises(RuntimeError, match=r"exit\(\) before enter\(\)"):
        block.exit(True)
    block.enter()
    assert z.owner == "io"
    block.exit(True)
    assert z.owner == "compute"
    # The uses are checked as access_all checks them, before anything is held.
    with pytest.raises(TypeError, match=r"\(NvArray, mode\)"):
        access_block([x], s1, "io", "test", False)
    assert x.owner == "compute"


# -- layering ---------------------------------------------------------------------------------

def test_the_array_layer_imports_nothing_above_it():
    """Layer 4 (ignis.array) uses only the layers below: never io, collective, ipc,
    interop (layer 5) or what sits on them."""
    above = {"io", "collective", "ipc", "interop", "torch", "cupy", "telemetry", "cli", "runner", "demo"}
    found = []
    for path in sorted((SRC / "array").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                names = [mod.split(".")[0]] if node.level == 2 and mod else []
                if node.level == 2 and not mod:
                    names = [a.name for a in node.names]
                if node.level == 0 and mod.startswith("ignis."):
                    names = [mod.split(".")[1]]
                found += [f"{path.name}: {n}" for n in names if n in above]
            elif isinstance(node, ast.Import):
                found += [f"{path.name}: {a.name}" for a in node.names
                          if a.name.startswith("ignis.") and a.name.split(".")[1] in above]
    assert not found, f"ignis.array imports from layers above it: {found}"


# NumPy hands DLPack tensors in host memory: device memory on the emulated backend only.
def test_dlpack_export_lives_in_the_array_layer(dev, on_emulated):
    from ignis.array import dlpack_export
    from ignis.interop import dlpack
    assert dlpack.export is dlpack_export.export  # the interop names still work
    x = ig.full(8, 2.0)
    n = np.from_dlpack(x)
    assert len([v for v in dlpack_export._exports.values() if v[2] is x]) == 1
    assert (n == 2.0).all()
    del n
