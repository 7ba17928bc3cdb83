"""Telemetry: exact statistics, snapshots in PyTorch's layout, timeline plots, log replay,
the CLI commands and the tour (all on whichever backend runs the suite)."""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import io
import json
import os
import pickle
import pickletools
import random
import struct
import sys
import textwrap

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant

import ignis as ig
from ignis.cli.telemetry import add_parsers
from ignis.memory import history
from ignis.telemetry import stats as tstats
from test_memory_model import ResourceModel

SMALL = 1 << 20
THIS_FILE = os.path.basename(__file__)
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture
def collecting():
    ig.telemetry.enable_stats()
    try:
        yield
    finally:
        ig.telemetry.disable_stats()


@pytest.fixture
def recording():
    ig.record_memory_history(True, clear_history=True)
    try:
        yield
    finally:
        ig.record_memory_history(False, clear_history=True)


@pytest.fixture
def streams(dev):
    ss = [dev.create_stream() for _ in range(2)]
    yield ss
    dev.synchronize()
    for s in ss:
        s.close()


def pool_stack(dev):
    return ig.PoolResource(ig.DirectResource(dev))


def release(mr, blocks):
    for b in blocks:
        mr.deallocate(b)
    mr.reap_pending()
    trim = getattr(mr, "trim", None)
    if trim is not None:
        trim()


# -- statistics ----------------------------------------------------------------------------------

def test_current_values_need_no_collection_and_cost_nothing(dev, streams):
    assert history.recorder is None  # nothing on the hot path while telemetry is off
    mr = pool_stack(dev)
    blocks = [mr.allocate(n, streams[i % 2], tag=t) for i, (n, t) in
              enumerate([(100, "a"), (5000, "a"), (3 << 20, "b"), (700, "c")])]
    s = ig.memory_stats(resource=mr)
    assert s["allocated_bytes.all.current"] == sum(b.bytes for b in blocks) == mr.bytes_outstanding
    assert s["requested_bytes.all.current"] == 100 + 5000 + (3 << 20) + 700
    assert s["allocation.all.current"] == 4 and s["allocation.large_pool.current"] == 1
    assert s["reserved_bytes.all.current"] == mr.bytes_reserved
    assert s["segment.all.current"] == len(mr.segments()) == s["num_device_alloc"]
    assert s["allocated_bytes.tag:a.current"] == blocks[0].bytes + blocks[1].bytes
    assert s["allocation.tag:c.current"] == 1
    assert not any(k.endswith(".peak") for k in s)  # peaks and totals only while collecting
    assert history.recorder is None
    assert "enable_stats" in ig.memory_summary(resource=mr)
    release(mr, blocks)
    assert ig.memory_stats(resource=mr)["reserved_bytes.all.current"] == 0


class StatsModel(ResourceModel):
    """The memory issue's model-based test, with telemetry's numbers checked after every step."""

    def __init__(self) -> None:
        ig.telemetry.enable_stats()
        super().__init__()
        self.pool = self.mr.upstream
        ig.memory_stats(resource=self.mr)   # meet the allocator before its first allocation: totals from zero
        self.ref = {"peak": 0, "res_peak": 0, "total": 0, "freed": 0, "count_total": 0}
        self.seen: set[int] = set()

    @invariant()
    def telemetry_is_exact(self):
        live = [b for b, _, _ in self.live]
        for b in live:
            if b.generation not in self.seen:
                self.seen.add(b.generation)
                self.ref["total"] += b.bytes
                self.ref["count_total"] += 1
        for b in self.dead:
            if b.generation in self.seen:
                self.seen.discard(b.generation)
                self.ref["freed"] += b.bytes
        now = sum(b.bytes for b in live)
        self.ref["peak"] = max(self.ref["peak"], now)
        self.ref["res_peak"] = max(self.ref["res_peak"], self.pool.bytes_reserved)
        s = ig.memory_stats(resource=self.mr)
        assert s["allocated_bytes.all.current"] == now
        assert s["allocated_bytes.small_pool.current"] == sum(b.bytes for b in live if b.bytes <= SMALL)
        assert s["requested_bytes.all.current"] == sum(n for _, n, _ in self.live)
        assert s["allocation.all.current"] == len(live)
        assert s["active_bytes.all.current"] == now
        assert s["reserved_bytes.all.current"] == self.pool.bytes_reserved
        assert s["segment.all.current"] == self.pool.num_segment_allocs - self.pool.num_segment_frees
        assert s["allocated_bytes.all.peak"] == self.ref["peak"]
        assert s["reserved_bytes.all.peak"] == self.ref["res_peak"]
        assert s["allocated_bytes.all.allocated"] == self.ref["total"]
        assert s["allocated_bytes.all.freed"] == self.ref["freed"]
        assert s["allocation.all.allocated"] == self.ref["count_total"]
        for tag in ("t0", "t1", "t2"):
            assert s.get(f"allocated_bytes.tag:{tag}.current", 0) == sum(b.bytes for b in live if b.tag == tag)

    def teardown(self):
        try:
            super().teardown()
        finally:
            ig.telemetry.disable_stats()


TestStatsModel = StatsModel.TestCase
TestStatsModel.settings = settings(max_examples=15, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize("kind", ["direct", "async", "guard"])
def test_stats_exact_under_random_sequences(dev, streams, collecting, kind):
    if kind == "async" and not dev.capabilities.get("memory_pools"):
        pytest.skip("no stream-ordered memory pools on this device")
    pool = None
    if kind == "direct":
        mr = alloc = ig.DirectResource(dev)
    elif kind == "async":
        mr = alloc = ig.AsyncResource(dev)
    else:
        pool = alloc = pool_stack(dev)
        mr = ig.DebugGuardResource(pool, quarantine_count=3, capture_stacks=False)
    ig.memory_stats(resource=mr)
    rng = random.Random(11)
    live: list = []
    peak_alloc = peak_active = 0
    for _ in range(120):
        if live and rng.random() < 0.45:
            mr.deallocate(live.pop(rng.randrange(len(live))))
        else:
            n = rng.choice([rng.randint(1, 4096), rng.randint(4097, 3 << 20)])
            live.append(mr.allocate(n, streams[rng.randrange(2)], tag=f"t{rng.randrange(3)}"))
        alloc_bytes = pool.bytes_outstanding if kind == "guard" else sum(b.bytes for b in live)
        # An AsyncResource's frees complete at once in stream order (the driver may reuse the
        # address right away), so its active memory is what is allocated; bytes_outstanding
        # still counts frees the host has not seen complete.
        active = alloc_bytes if kind == "async" else alloc.bytes_outstanding
        peak_alloc, peak_active = max(peak_alloc, alloc_bytes), max(peak_active, active)
        if kind == "async" and rng.random() < 0.2:
            mr.reap_pending()
        s = ig.memory_stats(resource=mr)
        if kind == "guard":
            assert s["quarantined_bytes"] == mr.quarantined_bytes
            assert s["quarantined_blocks"] == mr.quarantined_count
        else:
            assert s["requested_bytes.all.current"] == sum(b.requested for b in live)
            assert s["allocation.all.current"] == len(live)
        assert s["allocated_bytes.all.current"] == alloc_bytes
        assert s["active_bytes.all.current"] == active
        assert s["allocated_bytes.all.peak"] == peak_alloc
        assert s["active_bytes.all.peak"] == peak_active
        assert s["allocated_bytes.all.allocated"] - s["allocated_bytes.all.freed"] == alloc_bytes
        if kind != "guard":
            assert s["reserved_bytes.all.current"] == active  # without a pool each block is its own segment
    release(mr, live)
    if kind == "guard":
        mr.close()
        pool.close()
    s = ig.memory_stats(resource=mr)
    assert s["allocated_bytes.all.current"] == 0 and s["allocated_bytes.all.peak"] == peak_alloc


@pytest.mark.parametrize("backlog", [None, 7])
def test_peaks_exact_when_many_events_are_counted_at_once(dev, streams, collecting, monkeypatch, backlog):
    # Events are queued on the hot path and counted in batches: when read, or every
    # `backlog` events. Peaks of every class and tag must come out as if counted one by one.
    if backlog:
        monkeypatch.setattr(tstats, "_BACKLOG", backlog)
    mr = pool_stack(dev)
    ig.memory_stats(resource=mr)
    rng = random.Random(3)
    live: list = []
    peaks: dict[str, int] = {}

    def note(key, value):
        peaks[key] = max(peaks.get(key, 0), value)

    for _ in range(400):
        if live and rng.random() < 0.5:
            mr.deallocate(live.pop(rng.randrange(len(live))))
        else:
            n = rng.choice([rng.randint(1, 2048), rng.randint(SMALL + 1, 4 << 20)])
            live.append(mr.allocate(n, streams[rng.randrange(2)], tag=f"t{rng.randrange(4)}"))
        note("all", sum(b.bytes for b in live))
        note("small", sum(b.bytes for b in live if b.bytes <= SMALL))
        note("count", len(live))
        note("reserved", mr.bytes_reserved)
        for tag in ("t0", "t1", "t2", "t3"):
            note(tag, sum(b.requested for b in live if b.tag == tag))
    s = ig.memory_stats(resource=mr)
    assert s["allocated_bytes.all.peak"] == peaks["all"]
    assert s["allocated_bytes.small_pool.peak"] == peaks["small"]
    assert s["allocation.all.peak"] == peaks["count"]
    assert s["reserved_bytes.all.peak"] == peaks["reserved"]
    assert s["active_bytes.all.peak"] == peaks["all"]  # a pool's frees complete at once
    for tag in ("t0", "t1", "t2", "t3"):
        assert s[f"requested_bytes.tag:{tag}.peak"] == peaks[tag]
        assert s[f"requested_bytes.tag:{tag}.current"] == sum(b.requested for b in live if b.tag == tag)
    release(mr, live)


def test_reset_peak_and_summary(dev, collecting):
    mr = pool_stack(dev)
    big = mr.allocate(4 << 20, tag="weights")
    small = mr.allocate(1000, tag="kv")
    mr.deallocate(big)
    s = ig.memory_stats(resource=mr)
    assert s["allocated_bytes.all.peak"] == (4 << 20) + small.bytes
    assert s["allocated_bytes.tag:weights.peak"] == 4 << 20 and s["allocated_bytes.tag:weights.current"] == 0
    text = ig.memory_summary(resource=mr)
    for needle in ("Allocated memory", "Reserved memory", "weights", "kv", "PoolResource > DirectResource",
                   "collecting peaks"):
        assert needle in text
    ig.reset_peak_stats(resource=mr)
    s = ig.memory_stats(resource=mr)
    assert s["allocated_bytes.all.peak"] == small.bytes == s["allocated_bytes.all.current"]
    assert s["allocated_bytes.tag:weights.peak"] == 0
    release(mr, [small])


def test_hook_keeps_a_foreign_recorder_and_restores_it(dev):
    seen = []

    def foreign(action, *rest):
        seen.append(action)

    prev = history.set_recorder(foreign)
    try:
        ig.telemetry.enable_stats()
        ig.record_memory_history(True)
        mr = ig.DirectResource(dev)
        b = mr.allocate(64)
        mr.deallocate(b)
        assert seen == ["alloc", "free_requested", "free_completed"]
        assert ig.memory_stats(resource=mr)["allocation.all.allocated"] == 1
        ig.record_memory_history(False, clear_history=True)
        ig.telemetry.disable_stats()
        assert history.recorder is foreign
    finally:
        ig.telemetry.disable_stats()
        history.set_recorder(prev)


# -- snapshots -------------------------------------------------------------------------------------

BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def check_layout(snap):
    """The structure of torch.cuda.memory._snapshot(), as its docstring and the viewer read it."""
    assert isinstance(snap, dict) and isinstance(snap["segments"], list) and isinstance(snap["device_traces"], list)
    for seg in snap["segments"]:
        for key, typ in (("device", int), ("address", int), ("total_size", int), ("stream", int),
                         ("segment_type", str), ("allocated_size", int), ("active_size", int),
                         ("requested_size", int), ("blocks", list), ("frames", list)):
            assert isinstance(seg[key], typ), (key, seg)
        assert seg["segment_type"] in ("small", "large")
        at = seg["address"]
        for b in seg["blocks"]:  # the viewer computes each block's address by adding sizes
            assert b["address"] == at and b["size"] > 0 and b["state"] in BLOCK_STATES
            assert isinstance(b["requested_size"], int) and isinstance(b["frames"], list)
            if b["state"] == "active_allocated":
                assert 0 < b["requested_size"] <= b["size"]
            at += b["size"]
        assert at == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        assert seg["active_size"] == seg["allocated_size"] + sum(
            b["size"] for b in seg["blocks"] if b["state"] == "active_pending_free")
    for trace in snap["device_traces"]:
        assert isinstance(trace, list)
        for e in trace:
            assert e["action"] in ACTIONS
            assert isinstance(e["size"], int) and isinstance(e["stream"], int) and isinstance(e["time_us"], int)
            assert "addr" in e or e["action"] == "oom"
            assert "device_free" in e or e["action"] != "oom"
            for f in e["frames"]:
                assert isinstance(f["filename"], str) and isinstance(f["line"], int) and isinstance(f["name"], str)


# The opcodes MemoryViz.js's own unpickler reads (protocols 2 to 4).
VIEWER_OPCODES = {"PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
                  "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
                  "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SHORT_BINUNICODE", "BINUNICODE", "BININT",
                  "BININT1", "BININT2", "LONG1", "NEWTRUE", "NEWFALSE", "NONE", "BINFLOAT"}


def check_viewer_pickle(path):
    with open(path, "rb") as f:
        data = f.read()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4
    assert {op.name for op, _, _ in ops} <= VIEWER_OPCODES


def check_viewer(snap):
    """Replay each device's trace backwards from the final state as MemoryViz.js does: every
    block must lie in a segment at every step, and every free_requested must find its block."""
    for device, events in enumerate(snap["device_traces"]):
        segs = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}
        blocks = {}
        for s in snap["segments"]:
            at = s["address"]
            for b in s["blocks"]:
                if s["device"] == device and b["state"] in ("active_allocated", "active_pending_free"):
                    blocks[at] = b["size"]
                at += b["size"]
        merged = []
        for e in events:  # annotate_snapshot: a free_requested followed by its free_completed is one 'free'
            if e["action"] == "free_completed" and merged and merged[-1]["action"] == "free_requested" \
                    and merged[-1]["addr"] == e["addr"]:
                merged[-1] = dict(merged[-1], action="free")
                continue
            merged.append(e)

        def consistent(where):
            for addr, size in blocks.items():
                assert any(a <= addr < a + n for a, n in segs.items()), f"block {addr:#x} outside segments {where}"

        consistent("at the end")
        for i in range(len(merged) - 1, -1, -1):
            e = merged[i]
            a = e["action"]
            if a in ("free", "free_completed"):
                blocks[e["addr"]] = e["size"]
            elif a == "free_requested":
                assert e["addr"] in blocks, f"free_requested of unknown block at event {i}"
            elif a == "alloc":
                blocks.pop(e["addr"], None)
            elif a == "segment_free":
                segs[e["addr"]] = e["size"]
            elif a == "segment_alloc":
                assert segs.pop(e["addr"], None) is not None, f"segment_alloc of unknown segment at event {i}"
            consistent(f"before event {i} ({a})")


def work(mr, streams):
    """Allocations on two streams, some freed, in this file (so frames point here)."""
    a, b = streams
    keep = [mr.allocate(1000, a, tag="act"), mr.allocate(3 << 20, b, tag="kv"), mr.allocate(200, b, tag="kv")]
    gone = [mr.allocate(5000, a, tag="tmp"), mr.allocate(12 << 20, a, tag="tmp")]
    for blk in gone:
        mr.deallocate(blk)
    keep.append(mr.allocate(5000, b, tag="act"))
    return keep


@pytest.mark.parametrize("kind", ["pool", "guard", "direct", "async"])
def test_snapshot_layout_and_viewer_consistency(dev, streams, recording, tmp_path, kind):
    if kind == "async" and not dev.capabilities.get("memory_pools"):
        pytest.skip("no stream-ordered memory pools on this device")
    inner = None
    if kind == "pool":
        mr = pool_stack(dev)
    elif kind == "guard":
        inner = pool_stack(dev)
        mr = ig.DebugGuardResource(inner, quarantine_count=8, capture_stacks=False)
    elif kind == "direct":
        mr = ig.DirectResource(dev)
    else:
        mr = ig.AsyncResource(dev)
    keep = work(mr, streams)
    path = ig.dump_snapshot(tmp_path / "snap.pickle", resource=mr)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    check_layout(snap)
    check_viewer(snap)
    check_viewer_pickle(path)
    trace = snap["device_traces"][dev.ordinal]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert [e["tag"] for e in allocs] == ["act", "kv", "kv", "tmp", "tmp", "act"]
    assert all(e["frames"] and e["frames"][0]["filename"].endswith(THIS_FILE) for e in allocs)
    assert {e["stream"] for e in allocs} == {s.handle for s in streams}
    live = {b["address"]: b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    for blk in keep:
        got = live[blk.ptr]
        assert got["requested_size"] == blk.requested and got["tag"] == blk.tag
        assert got["frames"][0]["name"] == "work"
    states = {b["state"] for s in snap["segments"] for b in s["blocks"]}
    if kind == "guard":
        assert "active_pending_free" in states  # the quarantined blocks, still held
    if kind == "pool":
        assert {e["action"] for e in trace} == {"alloc", "free_requested", "free_completed", "segment_alloc"}
        assert len(snap["segments"]) == len(mr.segments())
    if kind == "direct":
        assert len(snap["segments"]) == len(keep)  # each allocation is its own segment
    release(mr, keep)
    if inner is not None:
        mr.close()
        inner.close()
    final = ig.snapshot(resource=mr)
    check_layout(final)
    check_viewer(final)


def test_snapshot_of_current_resources_and_state_mode(dev, tmp_path):
    ig.record_memory_history("state", clear_history=True)
    try:
        x = ig.empty(1000, "float32", tag="state-mode")
        snap = ig.snapshot(dev)
        assert all(not t for t in snap["device_traces"])  # 'state': where live blocks came from, no trace
        mine = [b for s in snap["segments"] for b in s["blocks"] if b.get("tag") == "state-mode"]
        assert len(mine) == 1 and mine[0]["frames"][0]["filename"].endswith(THIS_FILE)
        assert snap["segments"] and all(s["device"] == dev.ordinal for s in snap["segments"])
        check_layout(snap)
        x.free()
    finally:
        ig.record_memory_history(False, clear_history=True)
    with pytest.raises(ValueError, match="max_entries"):
        ig.record_memory_history(True, max_entries=-1)


def test_ring_keeps_the_newest_entries(dev, recording):
    ig.record_memory_history(True, max_entries=10)
    mr = ig.DirectResource(dev)
    for _ in range(20):
        mr.deallocate(mr.allocate(64))
    snap = ig.snapshot(resource=mr)
    assert len(snap["device_traces"][dev.ordinal]) <= 10 * 2  # each direct event becomes block + segment entries
    assert snap["ignis"]["kept_events"] == 10 and snap["ignis"]["recorded_events"] == 60
    check_viewer(snap)


def test_torch_memory_viz_reads_the_snapshot(dev, streams, recording):
    mv = pytest.importorskip("torch.cuda._memory_viz", reason="PyTorch is not installed here")
    mr = pool_stack(dev)
    keep = work(mr, streams)
    snap = ig.snapshot(resource=mr)
    assert "total_reserved" in mv.segsum(copy.deepcopy(snap))
    assert "cudaMalloc" in mv.trace(copy.deepcopy(snap))
    identity = lambda lines: lines  # noqa: E731 - no flamegraph.pl download
    assert "active_allocated" in mv.segments(copy.deepcopy(snap), format_flamegraph=identity)
    assert "work" in mv.memory(copy.deepcopy(snap), format_flamegraph=identity)
    assert "MemoryViz.js" in mv.trace_plot(copy.deepcopy(snap))
    release(mr, keep)


# -- plots -----------------------------------------------------------------------------------------

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_plot_timeline_png(dev, streams, recording, tmp_path):
    if not HAVE_MATPLOTLIB:
        pytest.skip("matplotlib is not installed (pip install 'ignis[plot]')")
    mr = pool_stack(dev)
    keep = work(mr, streams)
    path = ig.dump_snapshot(tmp_path / "s.pickle", resource=mr)
    info = ig.plot_timeline(path, tmp_path / "by_tag.png", size=(800, 400))
    assert png_size(tmp_path / "by_tag.png") == (800, 400)
    assert set(info["groups"]) == {"act", "kv", "tmp"}
    peak = sum(b.bytes for b in keep[:3]) + 5120 + (12 << 20)  # just before the two 'tmp' frees
    assert info["peak_bytes"] == peak
    assert info["reserved_peak_bytes"] == mr.bytes_reserved
    info = ig.plot_timeline(ig.telemetry.load_snapshot(path), tmp_path / "by_site.png", by="site", top=1)
    assert png_size(tmp_path / "by_site.png") == (1200, 600)
    assert info["groups"][0].startswith(THIS_FILE) and info["groups"][-1].startswith("other")
    with pytest.raises(ValueError, match="by must be"):
        ig.plot_timeline(path, tmp_path / "x.png", by="color")
    release(mr, keep)


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'ignis\[plot\]'"):
        ig.plot_timeline({"segments": [], "device_traces": []}, tmp_path / "x.png")


# -- replay ----------------------------------------------------------------------------------------

def test_replay_of_a_logging_resource_log_reproduces_its_peak(dev, streams, tmp_path):
    log = tmp_path / "log.csv"
    pool = pool_stack(dev)
    mr = ig.LoggingResource(pool, str(log), extra_columns=True)
    rng = random.Random(5)
    live: list = []
    peak_reserved = peak_live = 0
    for _ in range(300):
        if live and rng.random() < 0.5:
            mr.deallocate(live.pop(rng.randrange(len(live))))
        else:
            n = rng.choice([rng.randint(1, 8192), rng.randint(8193, 6 << 20), 12 << 20])
            live.append(mr.allocate(n, streams[rng.randrange(2)], tag="layer%d" % rng.randrange(3)))
            peak_reserved = max(peak_reserved, pool.bytes_reserved)
            peak_live = max(peak_live, sum(b.requested for b in live))
    release(mr, live)
    mr.close()
    r = ig.telemetry.replay(log, "pool")
    assert r["peak_reserved_bytes"] == peak_reserved
    assert r["peak_live_bytes"] == peak_live
    assert r["failures"] == {"oom": 0, "out_of_budget": 0, "unmatched_frees": 0}
    assert r["streams"] == 2 and r["left_allocated"] == 0 and r["allocations"] == r["frees"]
    assert r["fragmentation"] >= 1.0
    for kind in ("direct", "guard"):
        other = ig.telemetry.replay(log, kind)
        assert other["peak_live_bytes"] == peak_live and other["allocations"] == r["allocations"]
    d = ig.telemetry.replay(log, "direct")
    assert d["peak_reserved_bytes"] == d["live_at_peak_bytes"] <= peak_live  # no cache: reserved is live


RMM_LOG = """\
Thread,Time,Action,Pointer,Size,Stream
140,10:00:00.000001,allocate,0x7f0000000000,1000,0x0
140,10:00:00.000002,allocate,0x7f0000100000,2097152,0x5
141,10:00:00.000003,allocate failure,0x0,999999999999,0x5
141,10:00:00.000004,free,0x7f0000000000,1000,0x0
141,10:00:00.000005,free,0x7f00000fffff,10,0x0
140,10:00:00.000006,allocate,0x7f0000200000,8388608,0x9
140,10:00:00.000007,free,0x7f0000100000,2097152,0x5
"""


def test_replay_of_an_rmm_log_with_streams_failures_and_a_budget(tmp_path):
    log = tmp_path / "rmm.csv"
    log.write_text(RMM_LOG)
    r = ig.telemetry.replay(log, "pool")
    assert r["events"] == 6 and r["allocations"] == 3 and r["frees"] == 2
    assert r["streams"] == 3 and r["threads"] == 2 and r["left_allocated"] == 1
    assert r["failures"]["unmatched_frees"] == 1 and r["skipped"]["allocate_failures"] == 1
    assert r["log_span_s"] == pytest.approx(6e-6)
    assert r["peak_live_bytes"] == 2097152 + 8388608
    b = ig.telemetry.replay(log, "pool", budget="4MiB")
    assert b["failures"]["out_of_budget"] == 1 and b["allocations"] == 2 and b["budget_bytes"] == 4 << 20
    epoch = tmp_path / "epoch.csv"
    epoch.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,1700000000.5,allocate,4096,64,0\n"
                     "1,1700000001.0,free,4096,64,0\n")
    e = ig.telemetry.replay(epoch, "direct")
    assert e["log_span_s"] == pytest.approx(0.5) and e["frees"] == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="Thread,Time,Action,Pointer,Size,Stream"):
        ig.telemetry.replay(bad)
    with pytest.raises(ValueError, match="unknown resource"):
        ig.telemetry.replay(log, "magic")


# -- the command line ------------------------------------------------------------------------------

def run_cli(argv, capsys):
    p = argparse.ArgumentParser(prog="ignis")
    add_parsers(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_snapshot_and_replay(dev, streams, recording, tmp_path, capsys):
    mr = pool_stack(dev)
    keep = work(mr, streams)
    snap = ig.dump_snapshot(tmp_path / "s.pickle", resource=mr)
    rc, out, _ = run_cli(["snapshot", "summary", snap], capsys)
    assert rc == 0 and "segments:" in out and "active_allocated" in out and "kv" in out
    rc, out, err = run_cli(["snapshot", "plot", snap, "-o", str(tmp_path / "p.png"), "--by", "site",
                            "--size", "640x480"], capsys)
    if HAVE_MATPLOTLIB:
        assert rc == 0 and "wrote" in out and png_size(tmp_path / "p.png") == (640, 480)
    else:
        assert rc == 1 and "pip install" in err
    rc, _, err = run_cli(["snapshot", "plot", str(tmp_path / "missing.pickle")], capsys)
    assert rc == 2 and "no such snapshot file" in err  # a missing input file: 2, as for ignis run

    log = tmp_path / "rmm.csv"
    log.write_text(RMM_LOG)
    rc, out, _ = run_cli(["replay", str(log), "--resource", "direct"], capsys)
    assert rc == 0 and "peak reserved" in out and "fragmentation" in out and "1 free(s) of unknown" in out
    rc, out, err = run_cli(["replay", str(log), "--budget", "4MiB", "--json"], capsys)
    assert rc == 1 and json.loads(out)["failures"]["out_of_budget"] == 1 and "1 allocation(s) of the log failed" in err
    rc, out, _ = run_cli(["replay", str(log), "--budget", "4MiB"], capsys)
    assert rc == 1 and "allocation(s) FAILED" in out.splitlines()[0]
    with pytest.raises(SystemExit):
        run_cli(["replay", str(log), "--budget", "lots"], capsys)
    rc, _, err = run_cli(["replay", str(tmp_path / "nope.csv")], capsys)
    assert rc == 2 and "no such log file" in err
    release(mr, keep)


FAKE_BENCH = textwrap.dedent('''\
    """A stand-in for bench_alloc.py: same flags, same JSON layout."""
    import argparse, json
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    print("quick" if a.quick else "full")
    r = {"pairs": {"256 B": {"ignis_pool": {"median_us": 2.0}, "torch": {"median_us": 4.0}}},
         "labels": {"torch": "torch.empty"},
         "tracked_use": {"same_stream": {"median_us": 1.0, "calls_per_use": {"total": 0.0}}}}
    json.dump(r, open(a.json, "w"))
''')


def test_cli_bench_runs_benchmarks_and_writes_tables(tmp_path, capsys):
    bdir = tmp_path / "benchmarks"
    bdir.mkdir()
    (bdir / "bench_alloc.py").write_text(FAKE_BENCH)
    (bdir / "bench_broken.py").write_text("import sys\nif '--help' in sys.argv: print('--quick'); sys.exit(0)\n"
                                          "print('boom'); sys.exit(3)\n")
    (bdir / "bench_slow.py").write_text("print('no flags')\n")
    out_dir = tmp_path / "out"
    rc, out, _ = run_cli(["bench", "--bench-dir", str(bdir), "--out", str(out_dir)], capsys)
    assert rc == 1  # bench_broken failed
    assert "broken: failed (exit 3)" in out and "boom" in out
    data = json.loads((out_dir / "bench.json").read_text())
    rows = [r for r in data["rows"] if r["bench"] == "alloc"]
    pair = next(r for r in rows if r["metric"] == "allocate+free 256 B")
    assert pair["ratio"] == 0.5 and pair["anchor"] == "torch.empty"
    assert any(r["unit"] == "calls/use" and r["meaningful_here"] for r in rows)
    assert data["meta"]["runs"]["slow"]["status"].startswith("skipped: no --quick")
    md = (out_dir / "bench.md").read_text()
    assert "| alloc | allocate+free 256 B | 2 |" in md and "ignis / anchor" in md
    if ig.backend_name() == "emulated":
        assert "mean nothing about a GPU" in md and "no (emulated)" in md
    rc, out, _ = run_cli(["bench", "--bench-dir", str(bdir), "--only", "nothing", "--out", str(out_dir)], capsys)
    assert rc == 2 and "nothing to run" in out


def test_cli_bench_reads_the_real_array_benchmark(tmp_path, capsys):
    if ig.backend_name() != "emulated":
        pytest.skip("a full benchmark run belongs to ignis bench on the GPU, not to the test suite")
    from ignis.cli.bench import find_bench_dir
    if find_bench_dir() is None:
        pytest.skip("no benchmarks/ directory next to the sources")
    rc, out, _ = run_cli(["bench", "--only", "array", "--out", str(tmp_path)], capsys)
    assert rc == 0, out
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert any(r["metric"].startswith("from_numpy") and r["ratio"] for r in rows)


# -- the tour --------------------------------------------------------------------------------------

def test_tour_catches_every_planted_bug(tmp_path):
    from ignis.cli.tour import tour
    out = io.StringIO()
    assert history.recorder is None
    rc = tour(out, out_dir=str(tmp_path))
    text = out.getvalue()
    assert rc == 0, text
    for needle in ("1. model", "2. pipeline", "caught RaceError", "caught UseAfterFreeError", "caught DoubleFreeError",
                   "caught OutOfBoundsError", "caught by contract.audit()", "Allocated memory", "5. snapshot",
                   "tour passed"):
        assert needle in text, needle
    if ig.backend_name() == "emulated" and ig.device_count() > 1:
        assert "caught StaleHandleError" in text
    assert os.path.exists(tmp_path / "tour-snapshot.pickle")
    if HAVE_MATPLOTLIB:
        assert png_size(tmp_path / "tour-timeline.png") == (1200, 600)
    else:
        assert "timeline: skipped" in text
    assert history.recorder is None and not tstats.stats_enabled()  # put back as it was


def test_a_reused_resource_id_keeps_the_new_resources_frames(dev):
    # A resource that is gone leaves its id behind, and the next object may get the same
    # id. The history then holds a dead reference under the new resource's id: the new
    # resource's blocks must keep their frames (they are not the dead one's).
    sn = importlib.import_module("ignis.telemetry.snapshot")
    ig.record_memory_history("state", clear_history=True)
    try:
        old = ig.PoolResource(ig.DirectResource(dev))
        old.deallocate(old.allocate(512, tag="old"))
        dead = sn._h.resources[id(old)]
        old.close()
        del old
        gc.collect()
        assert dead() is None
        mr = ig.PoolResource(ig.DirectResource(dev))
        sn._h.resources[id(mr)] = dead  # what an address reuse leaves (made certain here)
        blk = mr.allocate(512, tag="reused-id")
        ig.snapshot()  # prunes resources that are gone
        snap = ig.snapshot(resource=mr)
        mine = [b for s in snap["segments"] for b in s["blocks"] if b.get("tag") == "reused-id"]
        assert len(mine) == 1 and mine[0]["frames"] and mine[0]["frames"][0]["filename"].endswith(THIS_FILE)
        mr.deallocate(blk)
        mr.close()
    finally:
        ig.record_memory_history(False, clear_history=True)


# -- snapshots are untrusted input --------------------------------------------------------------

class _RunsCode:
    """Unpickling this calls ``fn(*args)``: what a crafted "snapshot" does."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _crafted(tmp_path, protocol: int, marker) -> str:
    payload = {"segments": [], "device_traces": [[{"action": "alloc", "frames": [_RunsCode(
        os.system, f"touch {marker}")]}]]}
    path = tmp_path / f"crafted{protocol}.pickle"
    path.write_bytes(pickle.dumps(payload, protocol=protocol))
    return str(path)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_snapshot_that_names_code_is_refused_before_it_runs(tmp_path, protocol):
    marker = tmp_path / "ran"
    path = _crafted(tmp_path, protocol, marker)
    readers = [ig.telemetry.load_snapshot]
    if HAVE_MATPLOTLIB:  # without it, plot_timeline refuses before it reads anything
        readers.append(lambda p: ig.plot_timeline(p, tmp_path / "x.png"))
    for read in readers:
        with pytest.raises(ValueError, match="not a memory snapshot.*posix.system|not a memory snapshot.*os.system"):
            read(path)
    assert not marker.exists(), "unpickling the file ran its code"
    for other in (pickle.dumps(_RunsCode(eval, "1"), protocol=protocol),      # any name at all
                  pickle.dumps({"segments": [_RunsCode(set, ())]}, protocol=protocol)[:-3]):   # cut short
        bad = tmp_path / "other.pickle"
        bad.write_bytes(other)
        with pytest.raises(ValueError, match="not a memory snapshot"):
            ig.telemetry.load_snapshot(bad)


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_plain_snapshots_still_load(tmp_path, protocol):
    snap = {"segments": [{"blocks": [{"size": 512, "state": "active_allocated", "tag": "kv"}], "total_size": 512}],
            "device_traces": [[{"action": "alloc", "addr": 1 << 40, "size": 512, "frames": [],
                                "ignis": (1, 2.5, None, True, b"\x00", {3}, frozenset({4}))}]]}
    path = tmp_path / "plain.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    assert ig.telemetry.load_snapshot(path) == snap


@pytest.mark.parametrize("action", ["summary", "plot"])
def test_cli_snapshot_commands_refuse_a_crafted_pickle(tmp_path, action):
    from helpers import IMPORT_ROOT
    marker = tmp_path / "ran"
    path = _crafted(tmp_path, pickle.DEFAULT_PROTOCOL, marker)
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    import subprocess
    args = [sys.executable, "-m", "ignis", "snapshot", action, path]
    if action == "plot":
        args += ["-o", str(tmp_path / "out.png")]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    expected = "not a memory snapshot" if action == "summary" or HAVE_MATPLOTLIB else "matplotlib"
    assert p.returncode == 1 and expected in p.stderr, p.stdout + p.stderr
    assert not marker.exists(), "the snapshot command ran the file's code"


def test_a_peak_asked_for_before_statistics_are_on_says_how_to_get_it():
    assert not ig.telemetry.stats_enabled()
    stats = ig.memory_stats()
    with pytest.raises(KeyError, match=r"'allocated_bytes.all.peak': peaks and running totals are counted only "
                                       r"while statistics are on: call ig.telemetry.enable_stats\(\)"):
        stats["allocated_bytes.all.peak"]
    with pytest.raises(KeyError, match="^'no.such.key'$"):
        stats["no.such.key"]
    assert stats.get("allocated_bytes.all.peak", 0) == 0 and isinstance(stats, dict)
    ig.telemetry.enable_stats()
    try:
        assert ig.memory_stats()["allocated_bytes.all.peak"] >= 0
    finally:
        ig.telemetry.disable_stats()


def test_cli_bench_without_a_gpu_runs_what_applies_and_succeeds(tmp_path, capsys):
    """The two real benchmarks that used to fail here: ipc (its driver floor) and the PyTorch
    sanitizer's (it needs a CUDA GPU: skipped, saying so)."""
    if ig.get_backend().cuda_driver:
        pytest.skip("on a GPU these benchmarks run in full: ignis bench's job, not the test suite's")
    from ignis.cli.bench import find_bench_dir
    if find_bench_dir() is None:
        pytest.skip("no benchmarks/ directory next to the sources")
    rc, out, _ = run_cli(["bench", "--only", "ipc", "torch_sanitizer", "--out", str(tmp_path)], capsys)
    runs = json.loads((tmp_path / "bench.json").read_text())["meta"]["runs"]
    assert rc == 0, out
    assert runs["ipc"]["status"] == "ok", (tmp_path / "ipc.log").read_text()
    assert runs["torch_sanitizer"]["status"] == "skipped: needs a CUDA GPU"


def test_the_tours_memory_table_shows_what_happened_and_one_reserved_peak(tmp_path):
    """The table lists only rows with something in them; the snapshot the tour writes (and the
    timeline drawn from it) has the table's reserved peak, not another one."""
    from ignis.cli.tour import tour
    from ignis.telemetry.plot import timeline
    from ignis.telemetry.snapshot import load_snapshot
    from ignis.units import parse_bytes
    out = io.StringIO()
    assert tour(out, out_dir=str(tmp_path)) == 0, out.getvalue()
    text = out.getvalue()
    table = text.split("4. memory summary of the tour:")[1].split("5. snapshot")[0]
    rows = [ln for ln in table.splitlines() if ln.strip().startswith("| ") and ln.count("|") == 6
            and "Metric" not in ln]
    assert rows and "from large pool" not in table and "from small pool" not in table, table
    for ln in rows:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")[1:]]
        assert any(c not in ("0", "0 B", "-") for c in cells), f"an all-zero row: {ln}"
    reserved = next(ln for ln in rows if "Reserved memory" in ln)
    peak = parse_bytes(reserved.strip().strip("|").split("|")[2].strip().replace(" ", ""))
    snap = load_snapshot(tmp_path / "tour-snapshot.pickle")
    assert max(timeline(snap, device=0)["reserved"]) == peak, (peak, table)


def test_memory_summary_abbreviated_leaves_out_pools_and_empty_rows(dev, collecting):
    mr = pool_stack(dev)
    blk = mr.allocate(1000, tag="kv")
    full = ig.memory_summary(resource=mr)
    short = ig.memory_summary(resource=mr, abbreviated=True)
    assert "from small pool" in full and "from small pool" not in short
    assert "Allocated memory" in short and "kv" in short and len(short.splitlines()) < len(full.splitlines()) - 20
    for ln in short.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")[1:]]
        if len(cells) == 4 and "Cur Usage" not in cells:
            assert any(c not in ("0", "0 B", "-") for c in cells), f"an all-zero row: {ln}"
    mr.deallocate(blk)


def test_demo_help_describes_the_whole_demo():
    from ignis.cli import build_parser
    demo = next(a for a in build_parser()._actions if a.dest == "command").choices["demo"]
    text = " ".join(demo.format_help().split())
    for part in ("host -> device -> device -> host", "double free", "safetensors", "KV cache", "race",
                 "use after free", "stale handle", "out-of-bounds", "leak", "memory summary", "snapshot", "timeline"):
        assert part in text, part
