"""Model-based test: random allocate / deallocate / use sequences on several
streams against a simple reference model (hypothesis stateful testing)."""

from __future__ import annotations


import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import ignis as ig
from helpers import read, write
from ignis.memory import Access, BlockState

SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, 3 << 20), st.sampled_from([512, 1 << 20, 12 << 20]))


class ResourceModel(RuleBasedStateMachine):
    """Reference model: the set of live blocks with their requested sizes and a
    byte pattern each holds. Checked against the resource after every step."""

    factory = staticmethod(lambda dev: ig.StatisticsResource(ig.PoolResource(ig.DirectResource(dev))))

    def __init__(self) -> None:
        super().__init__()
        self.dev = ig.Device(0)
        self.mr = self.factory(self.dev)
        self.streams = [self.dev.create_stream() for _ in range(3)]
        self.live: list[tuple[ig.DeviceBlock, int, int]] = []  # block, requested, pattern byte
        self.dead: list[ig.DeviceBlock] = []
        self.keep: list[np.ndarray] = []
        self.counter = 0

    @rule(size=SIZES, s=st.integers(0, 2))
    def allocate(self, size, s):
        stream = self.streams[s]
        b = self.mr.allocate(size, stream, tag=f"t{s}")
        self.counter = (self.counter % 250) + 1
        n = min(size, 256)
        self.keep.append(write(b.ptr, bytes([self.counter]) * n, stream))
        self.mr.finish_block_use(b, stream, Access.WRITE)
        self.live.append((b, size, self.counter))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000), s=st.integers(0, 2), acc=st.sampled_from(list(Access)))
    def use(self, i, s, acc):
        b, size, pat = self.live[i % len(self.live)]
        stream = self.streams[s]
        self.mr.prepare_block_use(b.id, stream, acc)
        if acc.writes:
            self.keep.append(write(b.ptr, bytes([pat]) * min(size, 256), stream))
        self.mr.finish_block_use(b.id, stream, acc)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000))
    def deallocate(self, i):
        b, size, pat = self.live.pop(i % len(self.live))
        # The bytes are still this block's own: no other live block overlapped them.
        self.mr.prepare_block_use(b.id, b.alloc_stream, Access.READ)
        got = read(b.ptr, min(size, 256), b.alloc_stream)
        assert got == bytes([pat]) * min(size, 256)
        self.mr.deallocate(b)
        self.dead.append(b)

    @precondition(lambda self: self.dead)
    @rule()
    def double_free_is_caught(self):
        b = self.dead[-1]
        try:
            self.mr.deallocate(b)
        except ig.DoubleFreeError:
            pass
        else:
            raise AssertionError("double free not detected")

    @rule()
    def trim(self):
        self.mr.upstream.trim()

    @invariant()
    def counts_states_and_no_overlap(self):
        assert self.mr.bytes_outstanding == sum(b.bytes for b, _, _ in self.live)
        stats = self.mr.statistics
        assert stats.bytes.value == sum(n for _, n, _ in self.live)
        assert stats.count.value == len(self.live)
        spans = sorted((b.ptr, b.ptr + b.bytes) for b, _, _ in self.live)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
        assert all(b.state is BlockState.LIVE for b, _, _ in self.live)
        assert all(b.state is not BlockState.LIVE for b in self.dead)

    def teardown(self):
        for b, _, _ in self.live:
            self.mr.deallocate(b)
        self.dev.synchronize()
        for s in self.streams:
            s.close()
        self.mr.upstream.trim()
        assert self.mr.upstream.bytes_reserved == 0


class AsyncPoolModel(ResourceModel):
    factory = staticmethod(lambda dev: ig.StatisticsResource(ig.PoolResource(
        ig.AsyncResource(dev) if dev.capabilities["memory_pools"] else ig.DirectResource(dev))))


TestPoolModel = ResourceModel.TestCase
TestPoolModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestAsyncPoolModel = AsyncPoolModel.TestCase
TestAsyncPoolModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
