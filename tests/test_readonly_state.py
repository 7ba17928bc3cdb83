"""The compiled classes' state is read-only from Python: each class's own compiled code is the
one writer of its fields (issue 35: no Python code, a subsystem's or a user's, can write a
block's slot, an array's shape or owner, a stream's handle, a pool's free lists or the
sanitizer's records). The few settings meant to be set stay writable, and are named here."""

from __future__ import annotations

import pytest

import ignis as ig
from ignis.memory.block import DeviceBlock
from ignis.memory.pool import PoolResource
from ignis.memory.resource import TrackedResource
from ignis.runtime.kernel import Kernel
from ignis.runtime.stream import Stream
from ignis.safety import sanitizer as _san_mod
from ignis.safety.sanitizer import Sanitizer

COMPILED = type(Sanitizer.__dict__.get("mode")).__name__ == "getset_descriptor"
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled build enforces it (this run is pure Python)")


def _read_only(obj: object, names: "tuple[str, ...]") -> None:
    for name in names:
        value = getattr(obj, name)  # readable
        with pytest.raises(AttributeError):
            setattr(obj, name, value)


@needs_compiled
def test_an_arrays_public_fields_are_read_only(dev):
    a = ig.empty((4, 4), dtype="float32")
    _read_only(a, ("id", "shape", "dtype", "device", "stream", "owner", "ref_count", "created_at", "numel",
                   "nbytes"))
    a.incref()  # its own methods still change them
    assert a.ref_count == 1
    a.decref()
    a.free()


@needs_compiled
def test_a_streams_handle_and_lifecycle_are_read_only_its_ordering_a_setting(dev):
    s = dev.create_stream()
    assert type(s) is Stream
    _read_only(s, ("handle", "device", "id", "_generation", "_closed", "_owned", "_keepalive"))
    s.ordering = None  # the ordering policy is a setting (memory.ordering sets it)
    s.close()
    assert s._closed


@needs_compiled
def test_a_blocks_slot_is_read_only(dev):
    a = ig.empty(16, dtype="float32")
    blk = a._block
    assert isinstance(blk, DeviceBlock)
    _read_only(blk, ("ptr", "alloc_stream", "bytes", "requested", "tag", "generation", "state", "_impl"))
    a.free()


@needs_compiled
def test_a_pools_free_lists_and_a_tracking_resources_state_are_read_only(dev):
    pool = PoolResource(device=dev)
    blk = pool.allocate(4096)
    pool.deallocate(blk)
    assert isinstance(pool, TrackedResource)
    _read_only(pool, ("upstream", "_lock", "_live", "_events", "cross_stream_waits"))
    segs = pool.segments()
    assert segs  # the one segment, cached
    from ignis.memory import pool as _pool_mod
    seg = _pool_mod._Segment.__new__(_pool_mod._Segment)
    _read_only(seg, ("block", "ptr", "size", "small"))
    fl = _pool_mod._FreeList()
    _read_only(fl, ("small", "large", "count", "dirty"))
    pool.trim()
    pool.close()


@needs_compiled
def test_a_resources_identity_is_read_only_an_adaptor_takes_its_upstreams(dev):
    from ignis.memory.adaptors import StatisticsResource
    pool = PoolResource(device=dev)
    stats = StatisticsResource(pool)
    for r in (pool, stats):
        _read_only(r, ("device", "_backend", "_generation", "_closed"))
    assert stats.device is pool.device and stats._generation is pool._generation and not stats._closed
    guard = ig.DebugGuardResource(pool)
    guard.close()  # a resource written in Python closes through the base's method
    assert guard._closed
    pool.close()
    assert pool._closed


@needs_compiled
def test_a_kernels_plan_is_read_only():
    k = Kernel.__new__(Kernel)
    _read_only(k, ("source", "name", "host_impl", "options", "specs", "nargs", "array_args", "plan",
                   "param_types", "_last", "_compiled"))


@needs_compiled
def test_the_sanitizers_state_is_read_only_its_settings_writable():
    san = Sanitizer()
    _read_only(san, ("active", "reports", "notes", "pinned", "checked", "checked_foreign", "_lock", "_live",
                     "_grave", "_clock", "_host_version", "_regions", "_capturing"))
    san.mode, san.outputs_fresh, san.capture = "collect", True, san.capture  # the three settings
    from ignis.safety.records import _Rec
    rec = _Rec.__new__(_Rec)
    _read_only(rec, ("sid", "stream_id", "epoch", "kind", "lo", "hi", "op", "frames", "gen", "block", "per", "ch"))
    ext = _san_mod._Extent(0, 8, 1, 1)
    _read_only(ext, ("base", "end", "gen", "sid", "recs", "written", "frames", "op", "rs", "held", "pinned", "hv",
                     "lib"))


@needs_compiled
def test_the_guards_state_is_read_only_its_settings_writable(dev):
    g = ig.DeferredGuardResource(PoolResource(device=dev))
    blk = g.allocate(4096)
    _read_only(g, ("upstream", "canary_bytes", "poison", "canary", "quarantine_count", "quarantine_bytes", "stack_depth",
                   "_live", "_quarantine", "_live_bytes", "_quarantined_bytes", "reused", "resized",
                   "formatted_fresh", "batch", "_ready", "_ready_bytes", "_checker", "_state", "_lock"))
    assert g._live_bytes == 4096  # its own code keeps the counts
    g.capture_stacks, g.ready_limit = False, 0  # the two settings
    entry = blk._impl
    _read_only(entry, ("block", "up", "stack"))
    g.deallocate(blk)
    assert g._live_bytes == 0 and g._quarantined_bytes > 0
    g.check()
    g.close()


@needs_compiled
def test_a_guard_keeps_its_upstream_read_only_an_adaptor_its_own(dev):
    from ignis.memory.adaptors import StatisticsResource
    pool = PoolResource(device=dev)
    g = ig.DebugGuardResource(pool)
    assert g.upstream is pool and g.device is pool.device  # set by _serve_as, with what it serves
    _read_only(g, ("upstream",))
    stats = StatisticsResource(pool)
    assert stats.upstream is pool
    g.close()
    pool.close()


@needs_compiled
def test_the_framework_allocators_state_is_read_only_written_through_its_methods():
    from ignis.memory.guard_alloc import State
    st = State()
    _read_only(st, ("opts", "lock", "guards", "streams", "blocks", "torch", "cupy", "lib", "problems", "groups",
                    "tls", "deferred", "last_live", "atexit", "hooks", "saved", "rs_ptrs", "tag", "capturing",
                    "graph_blocks", "graph_free", "after_capture", "graph_alloc", "current_stream"))
    st.configure({"tag": "mine"})
    assert st.opts == {"tag": "mine"} and st.tag == "mine"
    st.configure({"tag": None})
    assert st.tag == "torch"  # no tag of the user's: the framework's
    st.use_framework("cupy")
    assert st.cupy and not st.torch
    with pytest.raises(ValueError, match="unknown framework 'jax'"):
        st.use_framework("jax")
    fn = (lambda device: 7)
    st.bind(current_stream=fn, graph_alloc=None)
    assert st.current_stream is fn and st.graph_alloc is None and st.lib is None
    with pytest.raises(TypeError, match="unknown slot 'streams'"):
        st.bind(streams={})
    assert st.current_stream is fn  # a refused call set nothing
    st.note_live_check(12.5)
    assert st.last_live == 12.5
    st.problems.append("p")
    st.groups["k"] = 1
    assert st.take_problems() == ["p"] and st.problems == [] and st.groups == {}
    st.mark_atexit()
    assert st.atexit
    st.use_framework("torch")
    blocks, rs = st.blocks, st.rs_ptrs
    blocks[1] = "b"
    rs.add(1)
    st.reset()
    # All as new but the PyTorch flag, and the two maps the compiled poison path holds: the same
    # objects, emptied.
    assert st.torch and not st.cupy and st.opts is None and not st.atexit and st.current_stream is None
    assert st.blocks is blocks and not blocks and st.rs_ptrs is rs and not rs
