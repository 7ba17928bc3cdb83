"""Runtime objects (layer 1) on the active backend: devices, streams, events."""

from __future__ import annotations

from contextlib import closing
import pickle
import threading
import time

import numpy as np
import pytest

import ignis as ig
from helpers import read, sleep_on, write


def test_device_is_a_singleton_per_ordinal(dev):
    assert ig.Device(0) is dev
    assert ig.Device(dev) is dev
    assert dev.ordinal == 0 and int(dev.__index__()) == 0


def test_device_properties(dev):
    assert isinstance(dev.name, str) and dev.name
    assert dev.total_memory > 0
    caps = dev.capabilities
    assert set(caps) == {"vmm", "memory_pools", "posix_fd_ipc"}
    assert dev.properties.multiprocessor_count > 0
    assert dev.uuid


@pytest.mark.parametrize("bad", [-1, 1000])
def test_invalid_ordinal_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="out of range"):
        ig.Device(bad)


def test_ordinal_must_be_int():
    with pytest.raises(TypeError, match="int"):
        ig.Device("0")


def test_stream_copy_round_trip(dev):
    with closing(dev.create_stream()) as s:
        mr = ig.DirectResource(dev)
        b = mr.allocate(4096, s)
        data = np.arange(4096, dtype=np.uint8)
        keep = write(b.ptr, data, s)
        assert read(b.ptr, 4096, s) == data.tobytes()
        del keep
        mr.deallocate(b)


def test_stream_protocol_and_repr(dev):
    s = dev.create_stream()
    assert s.__cuda_stream__() == (0, s.handle)
    assert "Stream" in repr(s)
    s.close()
    s.close()  # idempotent
    assert s.is_closed


def test_closed_stream_and_event_are_refused(dev):
    s = dev.create_stream()
    s.close()
    with pytest.raises(ig.ClosedError, match="closed"):
        s.synchronize()
    with pytest.raises(ig.ClosedError):
        s.record()
    e = dev.create_event()
    e.close()
    with pytest.raises(ig.ClosedError):
        e.query()


def test_event_orders_another_stream(dev):
    a, b = dev.create_stream(), dev.create_stream()
    seen = []
    sleep_on(a, 0.2)
    a.launch_host_func(lambda: seen.append("a"))
    ev = a.record()
    assert not ev.query()
    b.wait(ev)
    b.launch_host_func(lambda: seen.append("b"))
    b.synchronize()
    assert seen == ["a", "b"]
    assert ev.query()
    a.close(), b.close(), ev.close()


def test_stream_wait_on_stream(dev):
    a, b = dev.create_stream(), dev.create_stream()
    seen = []
    sleep_on(a, 0.1)
    a.launch_host_func(lambda: seen.append("a"))
    b.wait(a)
    b.launch_host_func(lambda: seen.append("b"))
    dev.synchronize()
    assert seen == ["a", "b"]
    with pytest.raises(TypeError):
        b.wait(42)
    a.close(), b.close()


def test_timing_events(dev):
    s = dev.create_stream()
    start = s.record(timing=True)
    sleep_on(s, 0.05)
    end = s.record(timing=True)
    end.synchronize()
    assert start.elapsed_ms(end) >= 0.0
    untimed = s.record()
    with pytest.raises(ValueError, match="timing"):
        start.elapsed_ms(untimed)
    s.close()


def test_host_func_needs_callable(dev):
    with closing(dev.create_stream()) as s:
        with pytest.raises(TypeError):
            s.launch_host_func(3)


def test_default_stream_is_reused(dev):
    assert dev.default_stream is dev.default_stream


def test_shutdown_refuses_new_work():
    # Use the last device so other tests keep a working device 0.
    d = ig.Device(ig.device_count() - 1)
    if d.ordinal == 0:
        pytest.skip("needs a second device")
    s = d.create_stream()
    d.shutdown()
    try:
        assert not d.accepting_ops
        with pytest.raises(ig.StaleHandleError, match="shutting down"):
            d.create_stream()
        with pytest.raises(ig.StaleHandleError, match="shutting down"):
            s.synchronize()
    finally:
        d.state.accepting_ops = True  # restore for other tests
        s.close()


def test_rebuild_bumps_generation_and_stales_streams():
    d = ig.Device(ig.device_count() - 1)
    s = d.create_stream()
    gen = d.generation
    assert d.rebuild() == gen + 1
    assert d.generation == gen + 1
    with pytest.raises(ig.StaleHandleError, match="context rebuilt") as ei:
        s.synchronize()
    assert ei.value.generation == gen and ei.value.current_generation == gen + 1
    # New work goes on working.
    with closing(d.create_stream()) as s2:
        mr = ig.DirectResource(d)
        b = mr.allocate(64, s2)
        write(b.ptr, b"x" * 64, s2)
        assert read(b.ptr, 64, s2) == b"x" * 64
        mr.deallocate(b)
    s.close()


def test_errors_pickle_with_their_fields():
    errs = [
        ig.DriverError(2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc"),
        ig.OutOfBudgetError(10, 5, 20),
        ig.OutOfMemoryError(100, device=0, device_total=1000, device_free=10, live_bytes=5,
                            cached_bytes=3, largest_free_block=2),
        ig.DoubleFreeError("twice", generation=7, ptr=16),
        ig.StaleHandleError("context rebuilt", generation=1, current_generation=2, device_id=0),
        ig.MemoryContractViolation("x", array_id=1, owner="io", caller="compute"),
    ]
    for e in errs:
        e2 = pickle.loads(pickle.dumps(e))
        assert type(e2) is type(e) and str(e2) == str(e)
        assert e2.__dict__ == e.__dict__
    assert isinstance(errs[1], MemoryError) and isinstance(errs[2], MemoryError)
    assert isinstance(errs[3], ig.UseAfterFreeError)
    assert "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)" in str(errs[0])


def test_threads_create_and_use_streams(dev):
    errors = []

    def work():
        try:
            for _ in range(20):
                with closing(dev.create_stream()) as s:
                    s.record().synchronize()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors


def test_streams_overlap(dev):
    a, b = dev.create_stream(), dev.create_stream()
    mr = ig.DirectResource(dev)
    blk = mr.allocate(1 << 20, b)
    sleep_on(a, 1.0)  # wide margins: CI machines can be slow
    t0 = time.perf_counter()
    dev.backend.memset_d8_async(blk.ptr, 1, 1 << 20, b.handle)  # not a host function: CUDA runs
    b.synchronize()                                              # those on one thread for all streams
    assert time.perf_counter() - t0 < 0.8, "stream B waited for stream A"
    a.synchronize()
    mr.deallocate(blk)
    a.close(), b.close()


# -- construction with wrong arguments (issue #14, item 15) -----------------------------

@pytest.mark.parametrize("make,exc,match", [
    (lambda dev: ig.Stream(), TypeError, None),                                 # missing arguments
    (lambda dev: ig.Stream(0, 5, owned=True), TypeError, "needs an ignis.Device"),
    (lambda dev: ig.Stream(dev, "5", owned=True), ValueError, "positive int"),
    (lambda dev: ig.Stream(dev, 0, owned=True), ValueError, "positive int"),
    (lambda dev: ig.Stream.from_handle(-1, dev), ValueError, "positive int"),
    (lambda dev: ig.Event(), TypeError, None),
    (lambda dev: ig.Event(0), TypeError, "needs an ignis.Device"),
    (lambda dev: ig.Event("cuda:0", timing=True), TypeError, "create_event"),
], ids=["stream-no-args", "stream-int-device", "stream-str-handle", "stream-zero-handle", "adopt-negative",
        "event-no-args", "event-int-device", "event-str-device"])
def test_half_built_streams_and_events_raise_cleanly(dev, monkeypatch, capfd, make, exc, match):
    """A constructor that refuses its arguments raises a clear error, and the half-built
    object's finalizer stays silent (no 'Exception ignored in __del__')."""
    import gc
    import sys
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(exc, match=match):
        make(dev)
    gc.collect()
    assert not unraisable, [f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}" for u in unraisable]
    assert "Exception ignored" not in capfd.readouterr().err


def test_half_built_repr_does_not_raise():
    s = ig.Stream.__new__(ig.Stream)  # compiled: its fields start as None
    e = object.__new__(ig.Event)
    assert "not constructed" in repr(s) and "not constructed" in repr(e)
    s.__del__()
    e.__del__()


# -- the current device and the current stream (issue 17, items 1 and 2) ------------------------

def test_current_device_is_per_thread_and_what_device_none_means():
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    assert ig.current_device() is ig.Device(0)
    with ig.Device(1) as d1:
        assert ig.current_device() is d1
        a = ig.zeros(4)
        assert a.device is d1 and a.stream is d1.default_stream
        assert ig.get_current_resource().device is d1 and ig.PoolResource().device is d1
        seen = []
        t = threading.Thread(target=lambda: seen.append(ig.current_device()))
        t.start()
        t.join()
        assert seen == [ig.Device(0)]  # a new thread starts on device 0
        with ig.Device(0):
            assert ig.zeros(2).device is ig.Device(0)
        assert ig.current_device() is d1
        a.free()
    assert ig.current_device() is ig.Device(0) and ig.zeros(2).device is ig.Device(0)
    ig.Device(1).set_current()
    try:
        assert ig.current_device() is ig.Device(1) and ig.empty(3).device is ig.Device(1)
    finally:
        ig.Device(0).set_current()
    assert ig.current_device() is ig.Device(0)


def test_with_stream_makes_it_current_and_does_not_close_it(dev):
    if ig.device_count() < 2:
        pytest.skip("needs two devices")
    s = dev.create_stream()
    other = ig.Device(1).create_stream()
    try:
        x = ig.zeros(8)  # made on the default stream
        with s:
            assert ig.current_stream() is s and ig.current_stream(dev) is s
            y = ig.ones(8)
            assert y.stream is s
            x.fill_(2.0)  # stream=None: the current stream, not x's own
            assert x.to_numpy().tolist() == [2.0] * 8
            with other:  # a stream on another device makes that device current too
                assert ig.current_device() is ig.Device(1) and ig.current_stream() is other
                assert ig.zeros(2).stream is other
            assert ig.current_device() is dev and ig.current_stream() is s
        assert not s.closed  # leaving the block does not close it
        assert ig.current_stream() is dev.default_stream and ig.zeros(2).stream is dev.default_stream
        s2 = dev.create_stream()
        s.__enter__()
        s2.__enter__()
        with pytest.raises(RuntimeError, match="must nest"):
            s.__exit__(None, None, None)
        s2.__exit__(None, None, None)
        s.__exit__(None, None, None)
        assert ig.current_stream() is dev.default_stream
        s2.close()
    finally:
        s.close()
        other.close()
    with pytest.raises(ig.ClosedError):
        with s:
            pass


def test_streams_as_context_managers_across_threads(dev):
    s = dev.create_stream()
    out = {}

    def work():
        out["stream"] = ig.current_stream()
        out["array"] = ig.zeros(4).stream

    with s:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert out == {"stream": dev.default_stream, "array": dev.default_stream}
    s.close()


# -- the constructors a new user tries first ----------------------------------------------------------
def test_device_takes_pytorchs_spelling_and_says_what_it_takes():
    import numpy as np
    assert ig.Device("cuda:0") is ig.Device(0) and ig.Device(np.int64(0)) is ig.Device(0)
    for bad in ("gpu", "cuda", "cuda:x", 1.0, None, True):
        with pytest.raises(TypeError, match=r"a device is an int ordinal \(0, 1, \.\.\.\), 'cuda:N' or an ig.Device"):
            ig.Device(bad)
    with pytest.raises(ValueError):
        ig.Device(f"cuda:{ig.device_count()}")


def test_stream_alone_says_how_streams_are_made():
    with pytest.raises(TypeError, match=r"device\.create_stream\(\).*Stream\.from_handle"):
        ig.Stream()
