"""The PyTorch front end's clock and lifetime logic, fed recorded trace sequences.

Each test replays what PyTorch's GPU trace and the dispatch mode hand the
sanitizer on a GPU (caching-allocator allocations and frees, event records
and waits, synchronizations, op accesses with byte ranges), with made-up
addresses and stream handles. No GPU and no PyTorch are needed.
"""

from __future__ import annotations

import pytest

import ignis as ig
from ignis.safety.frames import capture_frames
from ignis.safety.sanitizer import (HOST, NO_INIT_CHECK, OUTPUT, PINNED, READ, WRITE, Sanitizer,
                                    UninitializedReadError)

S0, S1, S2 = 0, 0x5A00, 0x5B00   # the default stream and two side streams
BLK = 0x7F00_0000_0000


class Trace:
    """A tiny recorder/replayer: each method is one trace event."""

    def __init__(self, mode: str = "collect") -> None:
        self.san = Sanitizer()
        self.san.mode = mode

    def alloc(self, base: int, stream: int = S0) -> None:
        self.san.extent_allocated(base, stream)

    def free(self, base: int) -> None:
        self.san.extent_freed(base)

    def op(self, stream, name: str, *items: tuple) -> None:
        self.san.foreign_access(stream, name, capture_frames(2), list(items))

    def record(self, event: int, stream: int) -> None:
        self.san.on_event_record(event, stream)

    def wait(self, event: int, stream: int) -> None:
        self.san.on_stream_wait_event(stream, event)

    def wait_stream(self, waiter: int, other: int, event: int = 0xE0) -> None:
        self.record(event, other)
        self.wait(event, waiter)

    @property
    def reports(self) -> list:
        return self.san.reports

    def kinds(self) -> list[str]:
        return [r.kind for r in self.san.reports]


def acc(base: int, off: int, n: int, mode: int, size: int = 4096, per: int = 0, ch: int = 0) -> tuple:
    return (base, size, base + off, base + off + n, per, ch, mode)


def fill(base: int, n: int = 4096) -> tuple:
    return acc(base, 0, n, WRITE | OUTPUT)


# -- races between streams ------------------------------------------------------------------

def test_read_after_write_race_names_both_accesses_and_stacks():
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))      # no wait: S1 may read before the fill lands
    [e] = t.reports
    assert isinstance(e, ig.RaceError) and e.kind == "read-after-write race"
    assert e.first["op"] == "aten::fill_.Scalar" and e.second["op"] == "aten::sum"
    assert e.first["stream_name"] == "the default stream (0x0)" and e.second["stream_name"] == f"stream {S1:#x}"
    assert e.first["range"] == (0, 4096) and e.second["generation"] == e.first["generation"] == 1
    assert "test_torch_trace.py" in e.first["stack"] and "test_torch_trace.py" in e.second["stack"]
    assert "make stream 0x5a00 wait for the default stream" in str(e)


@pytest.mark.parametrize("sync", ["event", "wait_stream", "stream_sync", "event_sync", "device_sync"])
def test_synchronization_orders_the_read(sync):
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    if sync == "event":
        t.record(0xE1, S0)
        t.wait(0xE1, S1)
    elif sync == "wait_stream":
        t.wait_stream(S1, S0)
    elif sync == "stream_sync":
        t.san.on_stream_synchronize(S0)
    elif sync == "event_sync":
        t.record(0xE1, S0)
        t.san.on_event_synchronize(0xE1)
    else:
        t.san.on_device_synchronize()
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))
    assert t.reports == []


def test_an_event_recorded_before_the_write_does_not_order_it():
    t = Trace()
    t.alloc(BLK)
    t.record(0xE1, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.wait(0xE1, S1)
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))
    assert t.kinds() == ["read-after-write race"]


def test_write_after_read_and_write_after_write():
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.san.on_device_synchronize()
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))
    t.op(S0, "aten::add_.Tensor", acc(BLK, 0, 4096, READ | WRITE))   # overwrites what S1 may still read
    assert t.kinds() == ["write-after-read race"]
    t.san.on_device_synchronize()
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.op(S2, "aten::zero_", acc(BLK, 0, 1024, WRITE))                 # S2 overwrites S0's write
    assert t.kinds() == ["write-after-read race", "write-after-write race"]


def test_disjoint_halves_on_two_streams_do_not_race():
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 0, 2048, WRITE | OUTPUT))
    t.op(S1, "aten::fill_.Scalar", acc(BLK, 2048, 2048, WRITE | OUTPUT))
    assert t.reports == []
    t.op(S1, "aten::fill_.Scalar", acc(BLK, 1024, 2048, WRITE))        # overlaps S0's half
    assert t.kinds() == ["write-after-write race"]


def test_column_halves_of_a_matrix_do_not_race():
    # a 16x16 float32 matrix: columns [0, 8) and [8, 16) are 32-byte chunks every 64 bytes
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 0, 15 * 64 + 32, WRITE | OUTPUT, 1024, per=64, ch=32))
    t.op(S1, "aten::fill_.Scalar", acc(BLK, 32, 15 * 64 + 32, WRITE | OUTPUT, 1024, per=64, ch=32))
    assert t.reports == []
    t.op(S1, "aten::sum", acc(BLK, 0, 64, READ, 1024))                    # row 0 touches both halves
    assert t.kinds() == ["read-after-write race"]


def test_reads_on_two_streams_do_not_race():
    t = Trace()
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.wait_stream(S1, S0)
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))
    assert t.reports == []


# -- frees, record_stream and reuse ----------------------------------------------------------

def _freed_while_read(record_stream: bool) -> Trace:
    """x allocated and written on the default stream, read on a side stream, freed on the
    host: the missing-record_stream bug, then the block's reuse by a new tensor."""
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.wait_stream(S1, S0)
    t.op(S1, "aten::mul.Tensor", acc(BLK, 0, 4096, READ))
    if record_stream:
        t.san.extent_record_stream(BLK, S1)
    t.free(BLK)                                   # del x: freed on S0 while S1 may still read it
    t.alloc(BLK, S0)                              # the caching allocator hands the block out again
    t.op(S0, "aten::fill_.Scalar", fill(BLK))     # the new owner writes it
    return t


def test_free_without_record_stream_is_flagged_and_so_is_the_reuse():
    t = _freed_while_read(record_stream=False)
    assert t.kinds() == ["use-after-free race", "reuse race"]
    uaf, reuse = t.reports
    assert uaf.first["op"] == "aten::mul.Tensor" and uaf.second["kind"] == "free"
    assert "record_stream" in str(uaf)
    assert reuse.first["op"] == "aten::mul.Tensor" and reuse.first["generation"] == 1
    assert reuse.second["generation"] == 2 and reuse.second["kind"] == "write"
    assert "test_torch_trace.py" in reuse.first["stack"]   # the read's stack


def test_record_stream_makes_the_free_and_the_reuse_safe():
    assert _freed_while_read(record_stream=True).reports == []


def test_a_free_ordered_after_the_use_is_safe():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.wait_stream(S1, S0)
    t.op(S1, "aten::mul.Tensor", acc(BLK, 0, 4096, READ))
    t.wait_stream(S0, S1, 0xE2)                   # the allocation stream waits for the reader
    t.free(BLK)
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    assert t.reports == []


def test_reuse_by_a_smaller_block_at_another_address_is_checked():
    # the freed 8 KiB block is split: the new 4 KiB tensor sits in its second half
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 0, 8192, WRITE | OUTPUT, 8192))
    t.wait_stream(S1, S0)
    t.op(S1, "aten::sum", acc(BLK, 4096, 4096, READ, 8192))
    t.free(BLK)
    t.alloc(BLK + 4096, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK + 4096))
    assert t.kinds() == ["use-after-free race", "reuse race"]
    assert t.reports[1].first["block"] == BLK and t.reports[1].second["block"] == BLK + 4096


def test_a_new_owner_on_another_stream_must_wait_for_the_free():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.free(BLK)
    t.alloc(BLK, S0)                                   # allocated on the default stream...
    t.op(S1, "aten::fill_.Scalar", fill(BLK))          # ...written on a side stream without a wait
    assert t.kinds() == ["reuse race"] and t.reports[0].first["generation"] == 1
    t2 = Trace()
    t2.alloc(BLK, S0)
    t2.op(S0, "aten::fill_.Scalar", fill(BLK))
    t2.free(BLK)
    t2.alloc(BLK, S0)
    t2.wait_stream(S1, S0)
    t2.op(S1, "aten::fill_.Scalar", fill(BLK))
    assert t2.reports == []


def test_a_synchronization_inside_an_op_covers_the_op():
    # .item(): the op queues its read, then the host waits for its stream, before the
    # front end can report the access; the access still counts as synchronized
    t = Trace()
    t.alloc(BLK, S1)
    t.op(S1, "aten::fill_.Scalar", fill(BLK))
    t.wait_stream(S0, S1)
    t.san.foreign_access(S0, "aten::_local_scalar_dense", None, [acc(BLK, 0, 4, READ)], True)
    t.free(BLK)                                        # freed on S1: the host saw S0's read finish
    assert t.reports == []


def test_host_synchronization_retires_history():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.op(S1, "aten::fill_.Scalar", acc(BLK + 8192, 0, 64, WRITE, 64))
    t.free(BLK)
    t.san.on_device_synchronize()
    assert not t.san._grave                            # nothing left that could race
    t.alloc(BLK, S1)
    t.op(S1, "aten::fill_.Scalar", fill(BLK))
    assert t.reports == []


def test_a_block_reused_without_a_write_keeps_a_bounded_history():
    # torch.empty in a loop (no synchronization): each lifetime never writes, so it hands the
    # older lifetimes' records on; the older frees of its own stream within its bytes are
    # covered by its own free's record, which races whatever they race. Before, one free record
    # piled up per lifetime and each free walked them all (a loop of 2000 slowed to 100 µs per
    # pair on an H200).
    t = Trace()
    t.san.outputs_fresh = True
    for _ in range(200):
        t.op(S0, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))
        t.san.extent_freed(BLK, S0)
    assert sum(len(v) for v in t.san._grave.values()) <= 2
    # what another stream did to the memory is still handed on, and still races a reuse
    t.op(S1, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ | NO_INIT_CHECK))
    t.san.extent_freed(BLK, S1)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))          # not ordered after S1's read
    assert "race" in " ".join(t.kinds())


def test_a_reuse_race_past_a_lifetime_that_never_wrote_names_the_access_that_held_the_memory():
    # a kernel writes the block on S0, which frees it; a lifetime that never writes takes it and
    # frees it; a third takes it and S1 writes it with no wait: the race names the kernel's
    # write (its op and stack), not the stackless free of the lifetime between
    t = Trace()
    t.san.outputs_fresh = True
    t.op(S0, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))
    t.op(S0, "my_kernel", fill(BLK))
    t.san.extent_freed(BLK, S0)
    t.op(S0, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))
    t.san.extent_freed(BLK, S0)
    t.op(S1, "aten::fill_.Scalar", fill(BLK))
    [e] = t.reports
    assert e.first["op"] == "my_kernel" and "test_torch_trace.py" in e.first["stack"]


def test_workspace_blocks_no_op_saw_are_forgotten():
    t = Trace()
    t.alloc(BLK, S0)
    t.free(BLK)
    assert BLK not in t.san._live and not t.san._grave


# -- uninitialized reads ----------------------------------------------------------------------

def test_read_of_bytes_nothing_wrote_names_the_allocation_site():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))     # allocated here
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))
    [e] = t.reports
    assert isinstance(e, UninitializedReadError) and e.kind == "uninitialized read"
    assert e.first["op"] == "aten::empty.memory_format" and e.second["op"] == "aten::sum"
    assert "test_torch_trace.py" in e.first["stack"] and "allocated at" in str(e)


def test_partly_written_bytes():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::empty.memory_format", acc(BLK, 0, 4096, OUTPUT))
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 0, 1024, WRITE))
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 2048, 1024, WRITE))
    t.op(S0, "aten::sum", acc(BLK, 0, 1024, READ))
    t.op(S0, "aten::sum", acc(BLK, 2048, 512, READ))
    assert t.reports == []
    t.op(S0, "aten::sum", acc(BLK, 512, 1024, READ))          # reaches into [1024, 2048)
    t.op(S0, "aten::index.Tensor", acc(BLK, 0, 4096, READ | NO_INIT_CHECK))   # a gather: rows picked by data
    assert [r.kind for r in t.reports] == ["uninitialized read"]
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 1024, 1024, WRITE))
    t.op(S0, "aten::fill_.Scalar", acc(BLK, 3072, 1024, WRITE))
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))
    assert len(t.reports) == 1 and t.san._live[BLK].written is None   # every byte written now


def test_an_input_nobody_saw_allocated_counts_as_written():
    # memory the dispatcher first meets as an input was written by something it cannot see
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))
    t.op(S0, "aten::sum", acc(BLK + 8192, 0, 4096, READ))     # memory from before the sanitizer
    assert t.reports == []


# -- pinned host memory ----------------------------------------------------------------------

PIN = 0x6000_0000


def test_host_write_while_an_async_copy_reads_pinned_memory():
    t = Trace()
    t.op(S1, "aten::copy_", acc(PIN, 0, 4096, READ | PINNED), fill(BLK))     # non_blocking H2D on S1
    t.op(HOST, "aten::copy_", acc(PIN, 0, 4096, WRITE))                          # next batch into the buffer
    [e] = t.reports
    assert e.kind == "write-after-read race" and e.second["stream_name"] == "the host (CPU)"
    assert e.first["stream_name"] == f"stream {S1:#x}"


def test_host_write_after_the_copy_finished_is_fine():
    t = Trace()
    t.op(S1, "aten::copy_", acc(PIN, 0, 4096, READ | PINNED), fill(BLK))
    t.record(0xE5, S1)
    t.san.on_event_synchronize(0xE5)
    assert PIN not in t.san.pinned                        # nothing left to check on the host
    t.op(HOST, "aten::copy_", acc(PIN, 0, 4096, WRITE))
    assert t.reports == []


def test_device_work_after_a_host_write_is_ordered_after_it():
    t = Trace()
    t.op(S1, "aten::copy_", acc(PIN, 0, 4096, READ | PINNED), fill(BLK))
    t.san.on_stream_synchronize(S1)
    t.op(S1, "aten::copy_", acc(PIN, 0, 4096, READ | PINNED), fill(BLK))
    t.san.on_stream_synchronize(S1)
    t.op(HOST, "aten::copy_", acc(PIN, 0, 4096, WRITE))
    t.op(S1, "aten::copy_", acc(PIN, 0, 4096, READ | PINNED), fill(BLK))   # queued after the host wrote
    assert t.reports == []


def test_host_read_of_an_async_device_to_host_copy():
    t = Trace()
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.op(S0, "aten::_to_copy", acc(BLK, 0, 4096, READ), acc(PIN, 0, 4096, WRITE | OUTPUT | PINNED))
    t.op(HOST, "aten::sum", acc(PIN, 0, 4096, READ))
    assert t.kinds() == ["read-after-write race"]


# -- reports ---------------------------------------------------------------------------------

def _racy_step(t: Trace) -> None:
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))


def test_reports_are_grouped_by_the_pair_of_sites():
    t = Trace()
    t.alloc(BLK)
    for _ in range(5):
        _racy_step(t)
    kinds = t.kinds()
    assert kinds == ["read-after-write race", "write-after-read race"]
    assert [r.count for r in t.reports] == [5, 4]
    text = t.san.summary()
    assert "2 problem(s) found (9 report(s)" in text and "(seen 5 times)" in text and "(seen 4 times)" in text


def test_raise_mode_raises_at_the_second_access():
    t = Trace(mode="raise")
    t.alloc(BLK)
    t.op(S0, "aten::fill_.Scalar", fill(BLK))
    with pytest.raises(ig.RaceError, match="read-after-write race"):
        t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))


def test_a_torch_access_inside_an_ignis_block_is_an_access_of_that_block(dev, streams):
    """A tensor that aliases an Ignis array (torch.from_dlpack) is checked against the
    block's own history, with the block's generation."""
    ig.sanitizer.disable()
    san = ig.sanitizer.enable("collect")
    try:
        with ig.ordering("manual"):
            a = streams[0]
            x = ig.zeros(1024, "float32", stream=a)
            ig.kernels.fill(x, 1.0, stream=a)
            san.foreign_access(S2, "aten::mul.Tensor", capture_frames(1),
                               [(x.device_ptr, 4096, x.device_ptr, x.device_ptr + 4096, 0, 0, READ)])
            [e] = san.reports
            assert e.kind == "read-after-write race"
            assert e.first["op"] == "ignis_fill_float32" and e.second["op"] == "aten::mul.Tensor"
            assert e.first["generation"] == e.second["generation"] == x.generation
            a.synchronize()
    finally:
        san.clear()
        ig.sanitizer.disable()


# -- a free made while another stream is current (PyTorch's reuse semantics) -------------------

def test_a_free_while_another_stream_is_current_is_checked_at_the_reuse():
    # FSDP2 frees its reduce-scatter stream's gradients from the default stream; CUDA graph trees
    # free default-stream tensors inside their warm-up stream: PyTorch hands such a block only to
    # its own stream's later work, which these programs order after their other streams.
    t = Trace()
    t.alloc(BLK, S1)
    t.op(S1, "aten::empty", fill(BLK))
    t.wait_stream(S0, S1)
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))       # used on S0, after S1's write
    t.san.extent_freed(BLK, S0)                          # freed while S0 is current: not checked here
    assert t.reports == []
    t.wait_stream(S1, S0)                                # S1 orders itself after S0, then reuses
    t.alloc(BLK, S1)
    t.op(S1, "aten::fill_.Scalar", fill(BLK))
    assert t.reports == []


def test_a_reuse_that_is_not_ordered_after_the_old_uses_is_still_a_reuse_race():
    t = Trace()
    t.alloc(BLK, S1)
    t.op(S1, "aten::empty", fill(BLK))
    t.wait_stream(S0, S1)
    t.op(S0, "aten::sum", acc(BLK, 0, 4096, READ))
    t.san.extent_freed(BLK, S0)
    t.alloc(BLK, S1)
    t.op(S1, "aten::fill_.Scalar", fill(BLK))           # S1 never waited for S0's read
    [e] = t.reports
    assert e.kind == "reuse race" and e.first["op"] == "aten::sum"


def test_a_free_on_its_own_streams_watch_is_checked_at_once():
    t = Trace()
    t.alloc(BLK, S0)
    t.op(S0, "aten::empty", fill(BLK))
    t.wait_stream(S1, S0)
    t.op(S1, "aten::sum", acc(BLK, 0, 4096, READ))
    t.san.extent_freed(BLK, S0)                          # the missing record_stream: reported at the free
    [e] = t.reports
    assert e.kind == "use-after-free race"
