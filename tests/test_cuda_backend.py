"""The cuda backend on a real device: every operation of the protocol, the
errors it raises, host functions, contexts across threads, fault injection
and context rebuild. Run on the GPU machine with IGNIS_BACKEND=cuda
(scripts/gpu_run.sh); skipped elsewhere."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ignis
from ignis.backends import OPS, get_backend
from ignis.errors import DriverError

pytestmark = pytest.mark.gpu

GiB = 1 << 30
WAIT_S = 30.0  # upper bound for anything a test waits on


@pytest.fixture
def be():
    """The cuda backend with device 0 initialised; faults cleared afterwards."""
    b = get_backend()
    assert b.name == "cuda"
    b.init_device(0)
    yield b
    b.clear_faults()


class Resources:
    """Streams, events and allocations made by a test, released at teardown
    (streams synchronized first), so a failing test leaks nothing."""

    def __init__(self, backend) -> None:
        self.b = backend
        self.streams: list[int] = []
        self.events: list[int] = []
        self.device: list[tuple[int, int]] = []
        self.host: list[int] = []

    def stream(self, ordinal: int = 0, priority: int = 0) -> int:
        s = self.b.stream_create(ordinal, priority)
        self.streams.append(s)
        return s

    def event(self, ordinal: int = 0, timing: bool = False) -> int:
        e = self.b.event_create(ordinal, timing)
        self.events.append(e)
        return e

    def alloc(self, nbytes: int, ordinal: int = 0) -> int:
        p = self.b.mem_alloc(ordinal, nbytes)
        self.device.append((ordinal, p))
        return p

    def pinned(self, nbytes: int) -> int:
        p = self.b.host_alloc(nbytes)
        self.host.append(p)
        return p

    def close(self) -> None:
        b = self.b
        for s in self.streams:
            try:
                b.stream_synchronize(s)
            except DriverError:
                pass  # a test's surfaced host-function error; the stream still goes
            b.stream_destroy(s)
        for e in self.events:
            b.event_destroy(e)
        for ordinal, p in self.device:
            b.mem_free(ordinal, p)
        for p in self.host:
            b.host_free(p)


@pytest.fixture
def res(be):
    r = Resources(be)
    yield r
    r.close()


def pinned_array(addr: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


def random_bytes(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Gate:
    """A host function that blocks its stream until ``open()`` (or WAIT_S)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        self._open.wait(WAIT_S)

    def open(self) -> None:
        self._open.set()


# -- devices -------------------------------------------------------------------
def test_count_and_versions(be):
    assert be.device_count() >= 1
    v = be.versions()
    assert re.fullmatch(r"\d+\.\d+", v["driver"]), v
    assert int(v["driver"].split(".")[0]) >= 12
    assert re.match(r"\d+\.\d+", v["cuda-bindings"]), v


def test_device_properties(be):
    p = be.device_properties(0)
    assert p.ordinal == 0
    assert "H100" in p.name or "H200" in p.name, p.name
    assert "\0" not in p.name and p.name == p.name.strip()
    assert p.total_memory >= 70 * GiB
    assert p.multiprocessor_count >= 100
    assert p.compute_capability >= (9, 0)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", p.uuid), p.uuid
    assert p.capabilities == {"vmm": True, "memory_pools": True, "posix_fd_ipc": True}
    assert re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]", p.extra["pci_bus_id"])
    assert p.extra["unified_addressing"] is True
    assert be.device_properties(0) is p  # cached


def test_uuid_matches_nvidia_smi(be):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not found")
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    for i in range(be.device_count()):
        assert be.device_properties(i).uuid in listing, listing


def test_bad_ordinal(be):
    n = be.device_count()
    with pytest.raises(DriverError) as ei:
        be.init_device(n)
    assert ei.value.name == "CUDA_ERROR_INVALID_DEVICE"
    with pytest.raises(DriverError):
        be.device_properties(n)


def test_set_current_and_device_synchronize(be, res):
    be.set_current(0)
    s = res.stream()
    p = res.alloc(1 << 20)
    be.memset_d8_async(p, 7, 1 << 20, s)
    be.device_synchronize(0)
    assert be.stream_query(s)


# -- memory --------------------------------------------------------------------
def test_alloc_roundtrip(be, res):
    n = (8 << 20) + 3
    s = res.stream()
    p = res.alloc(n)
    assert isinstance(p, int) and p != 0
    src, dst = random_bytes(n), np.zeros(n, np.uint8)
    be.memcpy_htod_async(p, src.ctypes.data, n, s)
    be.memcpy_dtoh_async(dst.ctypes.data, p, n, s)
    be.stream_synchronize(s)
    assert np.array_equal(src, dst)


def test_mem_get_info(be, res):
    free, total = be.mem_get_info(0)
    assert 0 < free <= total
    assert abs(total - be.device_properties(0).total_memory) <= total // 100
    res.alloc(GiB)
    free_after, _ = be.mem_get_info(0)
    assert free - free_after >= GiB - (64 << 20)


def test_async_alloc_free_and_trim(be, res):
    n = 4 << 20
    s = res.stream()
    p = be.mem_alloc_async(0, n, s)
    assert isinstance(p, int) and p != 0
    dst = np.zeros(n, np.uint8)
    be.memset_d8_async(p, 0x5A, n, s)
    be.memcpy_dtoh_async(dst.ctypes.data, p, n, s)
    be.mem_free_async(0, p, s)
    be.stream_synchronize(s)
    assert (dst == 0x5A).all()
    be.mem_pool_trim(0)
    be.mem_pool_trim(0, 1 << 20)


def test_pinned_host_roundtrip(be, res):
    n = 3 << 20
    s = res.stream()
    h_src, h_dst = res.pinned(n), res.pinned(n)
    assert isinstance(h_src, int) and h_src != 0
    a, b = pinned_array(h_src, n), pinned_array(h_dst, n)
    a[:] = random_bytes(n, 1)
    b[:] = 0
    p = res.alloc(n)
    be.memcpy_htod_async(p, h_src, n, s)
    be.memcpy_dtoh_async(h_dst, p, n, s)
    be.stream_synchronize(s)
    assert np.array_equal(a, b)


def test_dtod_and_memset_with_offsets(be, res):
    n = 1 << 20
    s = res.stream()
    a, b = res.alloc(n), res.alloc(n)
    be.memset_d8_async(a, 0xAB, n, s)
    be.memset_d8_async(b, 0x00, n, s)
    be.memcpy_dtod_async(b + 100, a + 7, 1000, s)
    be.memset_d8_async(b + 200, 0x11, 10, s)
    out = np.empty(n, np.uint8)
    be.memcpy_dtoh_async(out.ctypes.data, b, n, s)
    be.stream_synchronize(s)
    want = np.zeros(n, np.uint8)
    want[100:1100] = 0xAB
    want[200:210] = 0x11
    assert np.array_equal(out, want)


def test_memset_d32_fills_words_and_refuses_unaligned_pointers(be, res):
    n = 1 << 20
    s = res.stream()
    p = res.alloc(n)
    be.memset_d8_async(p, 0x11, n, s)
    be.memset_d32_async(p + 64, 0xA5A5A5A5, 1000, s)
    be.memset_d32_async(p + 8192, 0x04030201, 3, s)
    out = np.empty(n, np.uint8)
    be.memcpy_dtoh_async(out.ctypes.data, p, n, s)
    be.stream_synchronize(s)
    want = np.full(n, 0x11, np.uint8)
    want[64:4064] = 0xA5
    want[8192:8204] = [1, 2, 3, 4] * 3
    assert np.array_equal(out, want)
    with pytest.raises(DriverError) as ei:
        be.memset_d32_async(p + 2, 0, 4, s)
    assert ei.value.call == "cuMemsetD32Async"


def test_bad_free_is_driver_error(be):
    with pytest.raises(DriverError) as ei:
        be.mem_free(0, 0x10)
    e = ei.value
    assert (e.name, e.call, e.status) == ("CUDA_ERROR_INVALID_VALUE", "cuMemFree", 1)
    assert "cuMemFree" in str(e) and "CUDA_ERROR_INVALID_VALUE" in str(e)


def test_out_of_memory_is_driver_error(be, res):
    with pytest.raises(DriverError) as ei:
        be.mem_alloc(0, 1 << 50)
    assert (ei.value.name, ei.value.call) == ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc")
    s = res.stream()
    with pytest.raises(DriverError) as ei:
        be.mem_alloc_async(0, 1 << 50, s)
    assert (ei.value.name, ei.value.call) == ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAllocAsync")
    p = res.alloc(1 << 20)  # the device is still usable
    be.memset_d8_async(p, 1, 1 << 20, s)
    be.stream_synchronize(s)


# -- streams -------------------------------------------------------------------
def test_stream_handles_are_distinct_ints(be, res):
    ss = [res.stream(priority=pr) for pr in (0, -1, 0)]
    assert all(isinstance(s, int) and s != 0 for s in ss)
    assert len(set(ss)) == 3
    assert all(be.stream_query(s) for s in ss)


def test_stream_query_sees_pending_work(be, res):
    s = res.stream()
    gate = Gate()
    be.launch_host_func(s, gate)
    try:
        assert gate.entered.wait(WAIT_S)
        assert be.stream_query(s) is False
    finally:
        gate.open()
    be.stream_synchronize(s)
    assert be.stream_query(s) is True


def test_host_funcs_run_in_stream_order(be, res):
    n = 1 << 16
    s = res.stream()
    p = res.alloc(n)
    host = np.zeros(n, np.uint8)
    seen: list[tuple[str, int]] = []
    be.memset_d8_async(p, 3, n, s)
    be.memcpy_dtoh_async(host.ctypes.data, p, n, s)
    be.launch_host_func(s, lambda: seen.append(("first", int(host.sum()))))
    be.memset_d8_async(p, 4, n, s)
    be.memcpy_dtoh_async(host.ctypes.data, p, n, s)
    be.launch_host_func(s, lambda: seen.append(("second", int(host.sum()))))
    be.stream_synchronize(s)
    assert seen == [("first", 3 * n), ("second", 4 * n)]


def test_host_func_needs_a_callable(be, res):
    s = res.stream()
    with pytest.raises(DriverError) as ei:
        be.launch_host_func(s, 3)
    assert (ei.value.name, ei.value.call) == ("CUDA_ERROR_INVALID_VALUE", "cuLaunchHostFunc")


def test_host_func_callable_kept_alive(be, res):
    s = res.stream()
    gate = Gate()
    be.launch_host_func(s, gate)
    ran = threading.Event()

    def make():
        box = {"event": ran}
        return lambda: box["event"].set()

    be.launch_host_func(s, make())  # the only reference is the backend's
    gc.collect()
    gate.open()
    be.stream_synchronize(s)
    assert ran.is_set()


def test_host_func_exception_surfaces_at_synchronize(be, res):
    s = res.stream()
    after = threading.Event()

    def boom():
        raise ValueError("boom from a host function")

    be.launch_host_func(s, boom)
    be.launch_host_func(s, after.set)  # the stream goes on after the exception
    with pytest.raises(DriverError) as ei:
        be.stream_synchronize(s)
    e = ei.value
    assert (e.name, e.call) == ("CUDA_ERROR_LAUNCH_FAILED", "cuStreamSynchronize")
    assert "boom from a host function" in e.detail and "ValueError" in e.detail
    assert isinstance(e.__cause__, ValueError)
    assert after.is_set()
    be.stream_synchronize(s)  # reported once


def test_host_func_exception_after_destroy_surfaces_at_device_synchronize(be):
    s = be.stream_create(0)
    gate = Gate()
    be.launch_host_func(s, gate)

    def boom():
        raise RuntimeError("late boom")

    be.launch_host_func(s, boom)
    be.stream_destroy(s)  # returns at once; the queued work still runs
    gate.open()
    with pytest.raises(DriverError) as ei:
        be.device_synchronize(0)
    assert (ei.value.name, ei.value.call) == ("CUDA_ERROR_LAUNCH_FAILED", "cuCtxSynchronize")
    assert "late boom" in ei.value.detail
    be.device_synchronize(0)


# -- events --------------------------------------------------------------------
def test_event_handles_and_query(be, res):
    e = res.event()
    assert isinstance(e, int) and e != 0
    assert be.event_query(e) is True  # never recorded
    s = res.stream()
    gate = Gate()
    be.launch_host_func(s, gate)
    be.event_record(e, s)
    try:
        assert gate.entered.wait(WAIT_S)
        assert be.event_query(e) is False
    finally:
        gate.open()
    be.event_synchronize(e)
    assert be.event_query(e) is True


def test_a_destroyed_event_is_refused_not_handed_to_the_driver(be, res):
    # The driver's behaviour on a destroyed event's handle is undefined (a query of one crashed
    # the process): the backend refuses its own dead handles, until the driver reuses one.
    e = be.event_create(0)
    be.event_destroy(e)
    s = res.stream()
    for call, name in ((lambda: be.event_query(e), "cuEventQuery"), (lambda: be.event_synchronize(e), "cuEventSynchronize"),
                       (lambda: be.event_record(e, s), "cuEventRecord"), (lambda: be.stream_wait_event(s, e), "cuStreamWaitEvent")):
        with pytest.raises(DriverError, match="was destroyed") as info:
            call()
        assert info.value.name == "CUDA_ERROR_INVALID_HANDLE" and name in str(info.value)
    again = [be.event_create(0) for _ in range(4)]  # a handle the driver hands out again works
    try:
        for h in again:
            assert be.event_query(h) is True
    finally:
        for h in again:
            be.event_destroy(h)


def test_elapsed_ms(be, res):
    s = res.stream()
    start, end = res.event(timing=True), res.event(timing=True)
    be.event_record(start, s)
    be.launch_host_func(s, lambda: time.sleep(0.05))
    be.event_record(end, s)
    be.event_synchronize(end)
    ms = be.event_elapsed_ms(start, end)
    assert isinstance(ms, float)
    assert 45.0 <= ms < 5000.0, ms


def test_elapsed_ms_needs_timing_events(be, res):
    s = res.stream()
    a, b = res.event(timing=False), res.event(timing=False)
    be.event_record(a, s)
    be.event_record(b, s)
    be.stream_synchronize(s)
    with pytest.raises(DriverError) as ei:
        be.event_elapsed_ms(a, b)
    assert ei.value.call == "cuEventElapsedTime"
    assert ei.value.name == "CUDA_ERROR_INVALID_HANDLE"


def test_stream_wait_event_orders_streams(be, res):
    n = 1 << 20
    s1, s2 = res.stream(), res.stream()
    e = res.event()
    p = res.alloc(n)
    out = pinned_array(res.pinned(n), n)  # pageable destinations make the copy synchronous
    out[:] = 0
    gate = Gate()
    be.memset_d8_async(p, 1, n, s1)
    be.launch_host_func(s1, gate)
    be.memset_d8_async(p, 2, n, s1)  # runs only after the gate opens
    be.event_record(e, s1)
    be.stream_wait_event(s2, e)
    be.memcpy_dtoh_async(out.ctypes.data, p, n, s2)
    try:
        assert gate.entered.wait(WAIT_S)
        time.sleep(0.05)
        assert be.event_query(e) is False
        assert be.stream_query(s2) is False  # s2 waits on s1's record
    finally:
        gate.open()
    be.stream_synchronize(s2)
    assert (out == 2).all()


def test_wait_captures_the_record_at_call_time(be, res):
    s1, s2 = res.stream(), res.stream()
    e = res.event()
    be.event_record(e, s1)
    be.stream_synchronize(s1)
    be.stream_wait_event(s2, e)  # waits for the completed record
    gate = Gate()
    be.launch_host_func(s1, gate)
    be.event_record(e, s1)  # a later record must not hold s2 back
    try:
        t = time.monotonic()
        be.stream_synchronize(s2)
        assert time.monotonic() - t < WAIT_S / 3
        assert be.stream_query(s2)
    finally:
        gate.open()


# -- contexts and threads -------------------------------------------------------
def test_fresh_thread_uses_the_handles_context(be, res):
    n = 1 << 16
    s = res.stream()
    e = res.event(timing=True)
    p = res.alloc(n)
    out = np.zeros(n, np.uint8)
    errors: list[BaseException] = []

    def work():
        try:  # no set_current on this thread
            be.memset_d8_async(p, 9, n, s)
            be.memcpy_dtoh_async(out.ctypes.data, p, n, s)
            be.event_record(e, s)
            be.event_synchronize(e)
            assert be.event_query(e)
            be.stream_synchronize(s)
            assert be.stream_query(s)
            q = be.mem_alloc(0, 4096)
            be.mem_free(0, q)
            h = be.host_alloc(4096)
            be.host_free(h)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive()
    assert not errors, errors
    assert (out == 9).all()


def test_many_threads(be, res):
    n = 1 << 14
    errors: list[BaseException] = []

    def work(i: int):
        try:
            s = be.stream_create(0)
            p = be.mem_alloc_async(0, n, s)
            out = np.zeros(n, np.uint8)
            for _ in range(20):
                be.memset_d8_async(p, i, n, s)
                be.memcpy_dtoh_async(out.ctypes.data, p, n, s)
            be.mem_free_async(0, p, s)
            be.stream_synchronize(s)
            be.stream_destroy(s)
            assert (out == i).all()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not errors, errors


def test_second_device(be, res):
    if be.device_count() < 2:
        pytest.skip("needs two GPUs")
    n = 1 << 16
    be.init_device(1)
    s1 = res.stream(1)
    p1 = res.alloc(n, ordinal=1)
    s0 = res.stream(0)
    out = np.zeros(n, np.uint8)
    be.memset_d8_async(p1, 6, n, s1)
    be.memcpy_dtoh_async(out.ctypes.data, p1, n, s1)
    be.stream_synchronize(s1)
    assert (out == 6).all()
    with pytest.raises(DriverError) as ei:
        be.mem_alloc_async(0, n, s1)  # a device-1 stream for a device-0 pool
    assert ei.value.name == "CUDA_ERROR_INVALID_VALUE"
    be.memset_d8_async(res.alloc(n), 1, n, s0)
    be.device_synchronize(0)
    be.device_synchronize(1)


def test_peer_access_and_peer_copies(be, res):
    """What the emulator models of two devices: cuMemcpyPeerAsync works between them on a
    stream of either, with or without peer access; once device 1 was given access to device 0's
    memory, a plain device-to-device copy on a device-1 stream may read it."""
    if be.device_count() < 2:
        pytest.skip("needs two GPUs")
    n = 1 << 20
    be.init_device(1)
    assert not be.device_can_access_peer(0, 0)
    can = be.device_can_access_peer(1, 0)
    s0, s1 = res.stream(0), res.stream(1)
    p0, p1 = res.alloc(n, ordinal=0), res.alloc(n, ordinal=1)
    out = np.zeros(n, np.uint8)
    be.memset_d8_async(p0, 9, n, s0)
    be.stream_synchronize(s0)
    be.memcpy_peer_async(p1, 1, p0, 0, n, s1)          # on the destination's stream
    be.memcpy_dtoh_async(out.ctypes.data, p1, n, s1)
    be.stream_synchronize(s1)
    assert (out == 9).all()
    be.memset_d8_async(p1, 4, n, s1)
    be.stream_synchronize(s1)
    be.memcpy_peer_async(p0, 0, p1, 1, n, s1)          # on the source's stream
    be.stream_synchronize(s1)
    be.memcpy_dtoh_async(out.ctypes.data, p0, n, s0)
    be.stream_synchronize(s0)
    assert (out == 4).all()
    if not can:
        with pytest.raises(DriverError) as ei:
            be.enable_peer_access(1, 0)
        assert ei.value.name == "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"
        return
    be.enable_peer_access(1, 0)
    be.enable_peer_access(1, 0)  # enabled already: success
    be.memset_d8_async(p0, 2, n, s0)
    be.stream_synchronize(s0)
    be.memcpy_dtod_async(p1, p0, n, s1)
    be.memcpy_dtoh_async(out.ctypes.data, p1, n, s1)
    be.stream_synchronize(s1)
    assert (out == 2).all()


# -- fault injection --------------------------------------------------------------
def test_fault_injection_every_op(be, res):
    s, s2 = res.stream(), res.stream()
    e, t0, t1 = res.event(), res.event(timing=True), res.event(timing=True)
    p = res.alloc(4096)
    h = res.pinned(4096)
    be.event_record(t0, s)
    be.event_record(t1, s)
    be.stream_synchronize(s)
    calls = {
        "init_device": lambda: be.init_device(0),
        "rebuild_context": lambda: be.rebuild_context(0),
        "mem_alloc": lambda: be.mem_alloc(0, 4096),
        "mem_free": lambda: be.mem_free(0, p),
        "mem_alloc_async": lambda: be.mem_alloc_async(0, 4096, s),
        "mem_free_async": lambda: be.mem_free_async(0, p, s),
        "mem_get_info": lambda: be.mem_get_info(0),
        "mem_pool_trim": lambda: be.mem_pool_trim(0),
        "host_alloc": lambda: be.host_alloc(4096),
        "host_free": lambda: be.host_free(h),
        "memcpy_htod_async": lambda: be.memcpy_htod_async(p, h, 16, s),
        "memcpy_dtoh_async": lambda: be.memcpy_dtoh_async(h, p, 16, s),
        "memcpy_dtod_async": lambda: be.memcpy_dtod_async(p, p + 2048, 16, s),
        "memcpy_peer_async": lambda: be.memcpy_peer_async(p, 0, p + 2048, 0, 16, s),
        "memset_d8_async": lambda: be.memset_d8_async(p, 0, 16, s),
        "memset_d32_async": lambda: be.memset_d32_async(p, 0, 4, s),
        "stream_create": lambda: be.stream_create(0),
        "stream_destroy": lambda: be.stream_destroy(s2),
        "stream_wait_event": lambda: be.stream_wait_event(s, e),
        "stream_query": lambda: be.stream_query(s),
        "stream_synchronize": lambda: be.stream_synchronize(s),
        "launch_host_func": lambda: be.launch_host_func(s, lambda: None),
        "event_create": lambda: be.event_create(0),
        "event_destroy": lambda: be.event_destroy(e),
        "event_record": lambda: be.event_record(e, s),
        "event_query": lambda: be.event_query(e),
        "event_synchronize": lambda: be.event_synchronize(e),
        "event_elapsed_ms": lambda: be.event_elapsed_ms(t0, t1),
        "device_synchronize": lambda: be.device_synchronize(0),
        "device_can_access_peer": lambda: be.device_can_access_peer(0, 0),
        "enable_peer_access": lambda: be.enable_peer_access(0, 1),
        # the fault fires before the driver is called, so dummy arguments do
        "vmm_granularity": lambda: be.vmm_granularity(0),
        "vmm_create": lambda: be.vmm_create(0, 2 << 20),
        "vmm_release": lambda: be.vmm_release(0),
        "vmm_export_fd": lambda: be.vmm_export_fd(0),
        "vmm_import_fd": lambda: be.vmm_import_fd(0),
        "vmm_reserve": lambda: be.vmm_reserve(0, 2 << 20),
        "vmm_free_address": lambda: be.vmm_free_address(0, 2 << 20),
        "vmm_map": lambda: be.vmm_map(0, 2 << 20, 0),
        "vmm_unmap": lambda: be.vmm_unmap(0, 2 << 20),
        "vmm_set_access": lambda: be.vmm_set_access(0, 0, 2 << 20),
        "kernel_compile": lambda: be.kernel_compile(0, "", "k"),
        "kernel_launch": lambda: be.kernel_launch(0, (1, 1, 1), (1, 1, 1), 0, s, ()),
    }
    assert set(calls) == set(OPS)
    for op, call in calls.items():
        be.inject_fault(op, error="CUDA_ERROR_UNKNOWN")
        with pytest.raises(DriverError) as ei:
            call()
        assert (ei.value.name, ei.value.call, ei.value.detail) == ("CUDA_ERROR_UNKNOWN", OPS[op], "injected fault"), op
        assert not be.armed_faults()
    be.stream_synchronize(s)  # nothing reached the driver


def test_fault_injection_nth_and_times(be, res):
    be.inject_fault("mem_alloc", nth=2, times=2)
    p = res.alloc(4096)  # 1st call passes
    for _ in range(2):
        with pytest.raises(DriverError) as ei:
            be.mem_alloc(0, 4096)
        assert (ei.value.name, ei.value.call) == ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc")
    q = res.alloc(4096)  # disarmed again
    assert p != q


# -- context rebuild ---------------------------------------------------------------
# A primary-context reset invalidates everything on the device, including what
# other tests' objects may hold, so the scenario runs in its own process.
REBUILD_SCRIPT = r"""
import threading
import numpy as np
from ignis.backends import get_backend
from ignis.errors import DriverError

be = get_backend()
assert be.name == "cuda", be.name
be.init_device(0)
phase_two, done_one = threading.Event(), threading.Event()
errors = []

def other_thread():  # caches the old context, then works after the rebuild
    try:
        be.mem_free(0, be.mem_alloc(0, 4096))
        done_one.set()
        assert phase_two.wait(30)
        be.mem_free(0, be.mem_alloc(0, 4096))
        s = be.stream_create(0)
        be.stream_synchronize(s)
        be.stream_destroy(s)
    except BaseException as exc:
        errors.append(exc)
        done_one.set()

t = threading.Thread(target=other_thread)
t.start()
assert done_one.wait(30)

s = be.stream_create(0)
be.mem_alloc(0, 1 << 20)            # gone with the context
be.mem_alloc_async(0, 1 << 20, s)   # likewise
be.launch_host_func(s, lambda: None)
be.stream_synchronize(s)
old_event = be.event_create(0)
be.event_record(old_event, s)
be.rebuild_context(0)
for call in (lambda: be.event_query(old_event), lambda: be.event_synchronize(old_event),
             lambda: be.event_record(old_event, be.stream_create(0))):
    try:  # an event of the reset context: refused, never handed to the driver
        call()
        raise AssertionError("an event of the reset context was used")
    except DriverError as e:
        assert e.name == "CUDA_ERROR_INVALID_HANDLE" and "context was reset" in str(e), e

n = 1 << 20
s = be.stream_create(0)
p = be.mem_alloc(0, n)
q = be.mem_alloc_async(0, n, s)
src = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
out = np.zeros(n, np.uint8)
be.memcpy_htod_async(q, src.ctypes.data, n, s)
be.memcpy_dtod_async(p, q, n, s)
be.memcpy_dtoh_async(out.ctypes.data, p, n, s)
be.mem_free_async(0, q, s)
ran = threading.Event()
be.launch_host_func(s, ran.set)
be.stream_synchronize(s)
assert np.array_equal(src, out)
assert ran.is_set()
free, total = be.mem_get_info(0)
assert 0 < free <= total
be.mem_pool_trim(0)
be.mem_free(0, p)
be.stream_destroy(s)
be.device_synchronize(0)

phase_two.set()
t.join(30)
assert not t.is_alive()
assert not errors, errors
print("REBUILD-OK")
"""


def test_rebuild_context_then_allocate():
    env = dict(os.environ, IGNIS_BACKEND="cuda")
    src = str(Path(ignis.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", REBUILD_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "REBUILD-OK" in proc.stdout, proc.stdout + proc.stderr
