"""The emulated backend on its own: memory, streams, events, jitter, faults.

Every test builds its own ``EmulatedBackend`` so the file runs whatever
backend the process selected.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import pytest

from helpers import IMPORT_ROOT, run_threads
from ignis.backends.base import CU_STATUS, OPS
from ignis.backends.emulated import ALIGNMENT, EmulatedBackend
from ignis.backends.faults import FaultInjectingBackend
from ignis.errors import DriverError


@pytest.fixture
def emu():
    b = EmulatedBackend(devices=2, memory="64MiB", jitter=False)
    yield b
    for ordinal in range(b.device_count()):  # stops every worker thread
        b.rebuild_context(ordinal)


@pytest.fixture
def faulty(emu):
    """``emu`` wrapped for fault injection (ignis.backends.faults)."""
    b = FaultInjectingBackend(emu)
    yield b
    b.clear_faults()


def raises_driver(name: str, call: str):
    """Context manager: a DriverError with this status name and driver call."""

    class _Check:
        def __enter__(self):
            self.cm = pytest.raises(DriverError)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.cm.__exit__(*exc)
            err = self.info.value
            assert err.name == name, str(err)
            assert err.status == CU_STATUS[name]
            assert err.call == call, str(err)
            return handled

    return _Check()


def host(buf: np.ndarray) -> int:
    return buf.ctypes.data


def upload(b: EmulatedBackend, ptr: int, data: np.ndarray, stream: int) -> None:
    b.memcpy_htod_async(ptr, host(data), data.nbytes, stream)


def download(b: EmulatedBackend, ptr: int, nbytes: int, stream: int) -> np.ndarray:
    out = np.zeros(nbytes, dtype=np.uint8)
    b.memcpy_dtoh_async(host(out), ptr, nbytes, stream)
    b.stream_synchronize(stream)
    return out


def gate(b: EmulatedBackend, stream: int) -> threading.Event:
    """Block ``stream`` until the returned event is set."""
    ev = threading.Event()
    b.launch_host_func(stream, lambda: ev.wait(5))
    return ev


# -- configuration and devices ------------------------------------------------

def test_environment_configures_devices_memory_and_jitter(monkeypatch):
    monkeypatch.setenv("IGNIS_EMULATED_DEVICES", "3")
    monkeypatch.setenv("IGNIS_EMULATED_MEMORY", "512MiB")
    monkeypatch.setenv("IGNIS_EMU_JITTER", "7:50")
    b = EmulatedBackend()
    assert b.device_count() == 3
    assert b.mem_get_info(2) == (512 << 20, 512 << 20)
    assert b.jitter == (7, 50.0)
    monkeypatch.setenv("IGNIS_EMU_JITTER", "9")
    assert EmulatedBackend().jitter == (9, 200.0)
    assert EmulatedBackend(devices=1, memory=1 << 20, jitter=False).device_count() == 1
    assert EmulatedBackend(memory="1.5GiB").mem_get_info(0)[1] == 3 << 29
    assert EmulatedBackend(memory="100MB").mem_get_info(0)[1] == 100_000_000
    monkeypatch.setenv("IGNIS_EMULATED_MEMORY", "lots")
    with pytest.raises(ValueError, match="IGNIS_EMULATED_MEMORY"):
        EmulatedBackend()
    monkeypatch.setenv("IGNIS_EMU_JITTER", "x:1")
    with pytest.raises(ValueError, match="IGNIS_EMU_JITTER"):
        EmulatedBackend(memory=1 << 20)
    monkeypatch.delenv("IGNIS_EMU_JITTER")
    monkeypatch.setenv("IGNIS_EMULATED_PEER_ACCESS", "0")
    assert not EmulatedBackend(memory=1 << 20).device_can_access_peer(0, 1)
    assert EmulatedBackend(memory=1 << 20, peer_access=True).device_can_access_peer(0, 1)
    monkeypatch.setenv("IGNIS_EMULATED_PEER_ACCESS", "maybe")
    with pytest.raises(ValueError, match="IGNIS_EMULATED_PEER_ACCESS"):
        EmulatedBackend(memory=1 << 20)


def test_defaults(monkeypatch):
    for var in ("IGNIS_EMULATED_DEVICES", "IGNIS_EMULATED_MEMORY", "IGNIS_EMU_JITTER", "IGNIS_EMULATED_PEER_ACCESS"):
        monkeypatch.delenv(var, raising=False)
    b = EmulatedBackend()
    assert b.device_count() == 2
    assert b.mem_get_info(0) == (4 << 30, 4 << 30)
    assert b.jitter is None
    assert b.peer_access and b.device_can_access_peer(0, 1)


def test_device_properties_and_invalid_ordinals(emu):
    p0, p1 = emu.device_properties(0), emu.device_properties(1)
    assert p0.name == "Ignis Emulated Device 0"
    assert p0.total_memory == 64 << 20
    assert p0.compute_capability == (9, 0)
    assert p0.capabilities == {"vmm": True, "memory_pools": True, "posix_fd_ipc": True}
    assert p0.uuid != p1.uuid
    assert EmulatedBackend().device_properties(0).uuid == p0.uuid  # deterministic
    assert emu.versions()["numpy"] == np.__version__
    with raises_driver("CUDA_ERROR_INVALID_DEVICE", "cuDeviceGet"):
        emu.device_properties(2)
    with raises_driver("CUDA_ERROR_INVALID_DEVICE", OPS["init_device"]):
        emu.init_device(-1)
    with raises_driver("CUDA_ERROR_INVALID_DEVICE", OPS["mem_alloc"]):
        emu.mem_alloc(5, 16)
    emu.init_device(1)
    emu.set_current(1)


# -- memory ---------------------------------------------------------------------

def test_addresses_are_aligned_distinct_per_device_and_reused(emu):
    a = emu.mem_alloc(0, 100)
    b = emu.mem_alloc(0, 1000)
    c = emu.mem_alloc(1, 100)
    assert len({a, b, c}) == 3
    assert all(p % ALIGNMENT == 0 and p > 1 << 32 for p in (a, b, c))
    assert emu.host_address(a) % ALIGNMENT == 0
    assert emu.host_address(a + 17) == emu.host_address(a) + 17
    emu.mem_free(0, a)
    assert emu.mem_alloc(0, 100) == a  # the driver reuses freed addresses too


def test_address_window_exhaustion_falls_back_to_gaps(emu):
    dev = emu._devices[0]  # shrink the 1 TiB window to 8 slots to reach the fallback
    dev.limit = dev.window + 8 * ALIGNMENT
    slot = [emu.mem_alloc(0, ALIGNMENT) for _ in range(8)]
    assert slot == [dev.window + i * ALIGNMENT for i in range(8)]
    for i in (6, 7, 1, 2):
        emu.mem_free(0, slot[i])
    assert emu.mem_alloc(0, 2 * ALIGNMENT) == slot[6]  # restarts above the top allocation
    assert emu.mem_alloc(0, 2 * ALIGNMENT) == slot[1]  # then takes the first gap
    with raises_driver("CUDA_ERROR_OUT_OF_MEMORY", OPS["mem_alloc"]) as info:
        emu.mem_alloc(0, 1)
    assert "address space" in info.value.detail


def test_copies_and_memset_round_trip_at_interior_offsets(emu):
    s = emu.stream_create(0)
    n = 4096
    src = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    a, b = emu.mem_alloc(0, n), emu.mem_alloc(0, n)
    emu.memset_d8_async(a, 0, n, s)
    emu.memset_d8_async(b, 0xEE, n, s)
    upload(emu, a + 100, src[:1000], s)
    emu.memcpy_dtod_async(b + 3, a + 100, 1000, s)
    emu.memset_d8_async(b + 2000, 0x5A, 17, s)
    out_a = download(emu, a, n, s)
    out_b = download(emu, b, n, s)
    assert not out_a[:100].any() and not out_a[1100:].any()
    assert np.array_equal(out_a[100:1100], src[:1000])
    assert np.array_equal(out_b[3:1003], src[:1000])
    assert (out_b[:3] == 0xEE).all() and (out_b[1003:2000] == 0xEE).all()
    assert (out_b[2000:2017] == 0x5A).all() and (out_b[2017:] == 0xEE).all()
    # host_view sees the same bytes, writes through, and works on interior pointers
    view = emu.host_view(b + 3, 1000)
    assert view.dtype == np.uint8 and np.array_equal(view, src[:1000])
    view[:4] = [1, 2, 3, 4]
    assert list(download(emu, b + 3, 4, s)) == [1, 2, 3, 4]
    assert emu.host_view(a, 0).size == 0


def test_memset_d32_fills_words_in_stream_order(emu):
    s = emu.stream_create(0)
    n = 4096
    p = emu.mem_alloc(0, n)
    emu.memset_d8_async(p, 0x11, n, s)
    go = gate(emu, s)
    emu.memset_d32_async(p + 64, 0xA5A5A5A5, 100, s)  # a replicated byte: as memset_d8 of 400 bytes
    emu.memset_d32_async(p + 1024, 0x04030201, 3, s)  # any word, little-endian as on a GPU
    emu.memset_d32_async(p + 2048, 0, 0, s)  # nothing to do, nothing queued
    time.sleep(0.02)
    assert (emu.host_view(p, n) == 0x11).all(), "the fill ran before the stream got there"
    go.set()
    out = download(emu, p, n, s)
    assert (out[:64] == 0x11).all() and (out[64:464] == 0xA5).all() and (out[464:1024] == 0x11).all()
    assert list(out[1024:1036]) == [1, 2, 3, 4] * 3 and (out[1036:] == 0x11).all()


def test_memset_d32_refuses_what_the_driver_refuses(emu):
    s = emu.stream_create(0)
    p = emu.mem_alloc(0, 1000)
    call = OPS["memset_d32_async"]
    with raises_driver("CUDA_ERROR_INVALID_VALUE", call) as info:
        emu.memset_d32_async(p + 2, 0, 4, s)  # not 4-byte aligned
    assert "4-byte aligned" in info.value.detail
    with raises_driver("CUDA_ERROR_INVALID_VALUE", call) as info:
        emu.memset_d32_async(p + 996, 0, 2, s)  # the second word runs past the end
    assert "past the end" in info.value.detail
    for value in (-1, 1 << 32, 1.0):
        with raises_driver("CUDA_ERROR_INVALID_VALUE", call):
            emu.memset_d32_async(p, value, 1, s)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", call):
        emu.memset_d32_async(p, 0, -1, s)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", call):
        emu.memset_d32_async(0x1234, 0, 1, s)  # not a device pointer
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", call):
        emu.memset_d32_async(p, 0, 1, 987654)
    assert emu.stream_query(s)  # the failures queued nothing


def test_copies_between_devices_and_pinned_memory(emu):
    s = emu.stream_create(1)
    pinned = emu.host_alloc(256)
    assert pinned % 4096 == 0
    arr = np.ctypeslib.as_array((ctypes.c_uint8 * 256).from_address(pinned))
    arr[:] = np.arange(256, dtype=np.uint8)
    d0, d1 = emu.mem_alloc(0, 256), emu.mem_alloc(1, 256)
    emu.memcpy_htod_async(d0, pinned, 256, s)
    emu.memcpy_peer_async(d1, 1, d0, 0, 256, s)
    assert np.array_equal(download(emu, d1, 256, s), np.arange(256, dtype=np.uint8))
    emu.host_free(pinned)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["host_free"]):
        emu.host_free(pinned)


def test_devices_reach_each_others_memory_only_with_peer_access(emu):
    s0, s1 = emu.stream_create(0), emu.stream_create(1)
    d0, d1 = emu.mem_alloc(0, 256), emu.mem_alloc(1, 256)
    upload(emu, d0, np.arange(256, dtype=np.uint8), s0)
    emu.stream_synchronize(s0)
    dtod = OPS["memcpy_dtod_async"]
    with raises_driver("CUDA_ERROR_INVALID_VALUE", dtod) as info:  # as cuMemcpyDtoDAsync on two GPUs
        emu.memcpy_dtod_async(d1, d0, 256, s1)
    assert "memcpy_peer_async" in info.value.detail and "enable_peer_access(1, 0)" in info.value.detail
    with raises_driver("CUDA_ERROR_INVALID_VALUE", dtod):
        emu.memcpy_dtod_async(d1, d0, 256, s0)  # device 0 cannot reach device 1's memory either
    assert emu.stream_query(s1) and emu.stream_query(s0)  # nothing was queued
    assert emu.device_can_access_peer(1, 0) and emu.device_can_access_peer(0, 1)
    assert not emu.device_can_access_peer(0, 0)
    emu.enable_peer_access(1, 0)
    emu.enable_peer_access(1, 0)  # enabled already: nothing to do
    emu.memcpy_dtod_async(d1, d0, 256, s1)
    assert np.array_equal(download(emu, d1, 256, s1), np.arange(256, dtype=np.uint8))
    with raises_driver("CUDA_ERROR_INVALID_VALUE", dtod):
        emu.memcpy_dtod_async(d0, d1, 256, s0)  # access is one way
    with raises_driver("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", OPS["enable_peer_access"]):
        emu.enable_peer_access(0, 0)
    with raises_driver("CUDA_ERROR_INVALID_DEVICE", OPS["enable_peer_access"]):
        emu.enable_peer_access(0, 2)
    emu.rebuild_context(0)  # a rebuilt context's memory is no longer mapped into its peers
    d0 = emu.mem_alloc(0, 256)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", dtod):
        emu.memcpy_dtod_async(d1, d0, 256, s1)


def test_peer_copies_between_devices(emu):
    s0, s1 = emu.stream_create(0), emu.stream_create(1)
    d0, d1 = emu.mem_alloc(0, 4096), emu.mem_alloc(1, 4096)
    upload(emu, d0, (np.arange(4096) % 251).astype(np.uint8), s0)
    emu.stream_synchronize(s0)
    peer = OPS["memcpy_peer_async"]
    emu.memcpy_peer_async(d1 + 100, 1, d0 + 200, 0, 1000, s1)  # on the destination's stream
    got = download(emu, d1, 4096, s1)
    assert np.array_equal(got[100:1100], (np.arange(200, 1200) % 251).astype(np.uint8))
    emu.memcpy_peer_async(d0, 0, d1 + 100, 1, 1000, s1)  # back, on the source's stream
    emu.stream_synchronize(s1)
    assert np.array_equal(download(emu, d0, 1000, s0), got[100:1100])
    with raises_driver("CUDA_ERROR_INVALID_VALUE", peer):
        emu.memcpy_peer_async(d1, 0, d0, 0, 16, s0)  # d1 is not memory of device 0
    with raises_driver("CUDA_ERROR_INVALID_VALUE", peer):
        emu.memcpy_peer_async(d1 + 4090, 1, d0, 0, 16, s1)  # past the end
    with raises_driver("CUDA_ERROR_INVALID_DEVICE", peer):
        emu.memcpy_peer_async(d1, 1, d0, 5, 16, s1)
    no_peer = EmulatedBackend(devices=3, memory="16MiB", jitter=False, peer_access=False)
    try:
        t0, t2 = no_peer.stream_create(0), no_peer.stream_create(2)
        a, c = no_peer.mem_alloc(0, 64), no_peer.mem_alloc(2, 64)
        with raises_driver("CUDA_ERROR_INVALID_VALUE", peer):
            no_peer.memcpy_peer_async(c, 2, a, 0, 64, no_peer.stream_create(1))  # a third device's stream
        upload(no_peer, a, np.full(64, 7, np.uint8), t0)
        no_peer.stream_synchronize(t0)
        assert not no_peer.device_can_access_peer(2, 0)
        with raises_driver("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", OPS["enable_peer_access"]):
            no_peer.enable_peer_access(2, 0)
        no_peer.memcpy_peer_async(c, 2, a, 0, 64, t2)  # staged by the driver: works without peer access
        assert (download(no_peer, c, 64, t2) == 7).all()
    finally:
        for ordinal in range(3):
            no_peer.rebuild_context(ordinal)


def test_bad_ranges_and_pointers_raise_at_enqueue(emu):
    s = emu.stream_create(0)
    buf = np.zeros(64, dtype=np.uint8)
    p = emu.mem_alloc(0, 1000)
    htod, dtoh = OPS["memcpy_htod_async"], OPS["memcpy_dtoh_async"]
    with raises_driver("CUDA_ERROR_INVALID_VALUE", htod) as info:
        emu.memcpy_htod_async(p + 990, host(buf), 11, s)  # one byte past the end
    assert "past the end" in info.value.detail
    with raises_driver("CUDA_ERROR_INVALID_VALUE", dtoh):
        emu.memcpy_dtoh_async(host(buf), p + 1000, 1, s)  # in the alignment padding
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["memcpy_dtod_async"]):
        emu.memcpy_dtod_async(p, 0x1234, 8, s)  # not a device pointer
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["memset_d8_async"]):
        emu.memset_d8_async(p, 256, 8, s)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", "host_view"):
        emu.host_view(p - 1, 2)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free"]):
        emu.mem_free(0, p + 8)  # interior pointer
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free"]):
        emu.mem_free(1, p)  # another device's pointer
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_alloc"]):
        emu.mem_alloc(0, 0)
    emu.mem_free(0, p)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free"]):
        emu.mem_free(0, p)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", htod):
        emu.memcpy_htod_async(p, host(buf), 8, s)  # use after free
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["host_free"]):
        emu.host_free(host(buf))
    # a zero-byte copy is a no-op, as in the driver; nothing was queued by the failures
    emu.memcpy_htod_async(0, 0, 0, s)
    assert emu.stream_query(s)


def test_out_of_memory_and_mem_get_info():
    b = EmulatedBackend(devices=1, memory="1MiB", jitter=False)
    p = b.mem_alloc(0, 1 << 19)
    assert b.mem_get_info(0) == (1 << 19, 1 << 20)
    q = b.mem_alloc(0, 1 << 19)
    assert b.mem_get_info(0) == (0, 1 << 20)
    with raises_driver("CUDA_ERROR_OUT_OF_MEMORY", OPS["mem_alloc"]):
        b.mem_alloc(0, 1)
    b.mem_free(0, p)
    b.mem_pool_trim(0)
    assert b.mem_alloc(0, 1 << 19)
    b.mem_free(0, q)
    assert b.mem_get_info(0) == (1 << 19, 1 << 20)


def test_async_free_keeps_bytes_counted_until_the_stream_reaches_it(emu):
    s = emu.stream_create(0)
    total = emu.mem_get_info(0)[1]
    p = emu.mem_alloc_async(0, 4096, s)
    assert emu.mem_get_info(0)[0] == total - 4096
    go = gate(emu, s)
    emu.mem_free_async(0, p, s)
    time.sleep(0.02)
    assert emu.mem_get_info(0)[0] == total - 4096  # not reached yet
    assert emu.mem_alloc(0, 4096) != p  # the address is not reusable yet
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["memset_d8_async"]):
        emu.memset_d8_async(p, 0, 16, s)  # no new work after the free
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free_async"]):
        emu.mem_free_async(0, p, s)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free"]):
        emu.mem_free(0, p)
    go.set()
    emu.stream_synchronize(s)
    assert emu.mem_get_info(0)[0] == total - 4096  # only the second allocation is left
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_alloc_async"]):
        emu.mem_alloc_async(1, 16, s)  # stream of another device


# -- streams and events -------------------------------------------------------

def test_streams_really_overlap(emu):
    a, b = emu.stream_create(0), emu.stream_create(0)
    assert a > 0 and b > 0 and a != b
    p = emu.mem_alloc(0, 1 << 20)
    src = np.full(1 << 20, 7, dtype=np.uint8)
    done = threading.Event()
    t0 = time.perf_counter()
    emu.launch_host_func(a, lambda: time.sleep(1.0))  # wide margins: CI machines can be slow
    upload(emu, p, src, b)
    emu.launch_host_func(b, done.set)
    assert done.wait(0.8), "stream B waited for stream A"
    assert not emu.stream_query(a), "stream A finished before B: no overlap shown"
    assert emu.stream_query(b)
    assert np.array_equal(emu.host_view(p, 1 << 20), src)
    emu.stream_synchronize(a)
    assert time.perf_counter() - t0 >= 0.99
    assert emu.stream_query(a)


def test_event_is_not_done_until_the_stream_reaches_it(emu):
    s = emu.stream_create(0)
    ev = emu.event_create(0)
    assert emu.event_query(ev)  # never recorded
    emu.event_synchronize(ev)
    emu.launch_host_func(s, lambda: time.sleep(0.15))
    emu.event_record(ev, s)
    assert not emu.event_query(ev)
    assert not emu.stream_query(s)
    t0 = time.perf_counter()
    emu.event_synchronize(ev)
    assert time.perf_counter() - t0 > 0.05
    assert emu.event_query(ev)


def test_stream_wait_event_orders_the_waiting_stream_only(emu):
    a, b, c = (emu.stream_create(0) for _ in range(3))
    p = emu.mem_alloc(0, 64)
    emu.memset_d8_async(p, 0, 64, a)
    emu.stream_synchronize(a)
    ev = emu.event_create(0)
    seen: list[int] = []

    def slow_write() -> None:
        time.sleep(0.15)
        emu.host_view(p, 64)[:] = 42

    emu.launch_host_func(a, slow_write)
    emu.event_record(ev, a)
    emu.stream_wait_event(b, ev)
    emu.launch_host_func(b, lambda: seen.append(int(emu.host_view(p, 64)[0])))
    other = threading.Event()
    emu.launch_host_func(c, other.set)  # c does not wait
    emu.event_record(ev, c)  # re-recording does not change b's captured wait
    assert other.wait(0.1)
    emu.stream_synchronize(b)
    assert seen == [42]


def test_synchronize_waits_for_everything(emu):
    streams = [emu.stream_create(d) for d in (0, 0, 0, 1)]
    hits: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> Callable[[], None]:
        def fn() -> None:
            time.sleep(0.02 * (i % 3))
            with lock:
                hits.append(i)
        return fn

    for i in range(12):
        emu.launch_host_func(streams[i % 3], work(i))
    emu.launch_host_func(streams[3], lambda: time.sleep(0.3))
    emu.device_synchronize(0)
    assert sorted(hits) == list(range(12))
    assert not emu.stream_query(streams[3])  # device 1 is not waited for
    emu.device_synchronize(1)
    assert emu.stream_query(streams[3])
    # a destroyed stream still drains, and device_synchronize waits for it
    s = emu.stream_create(0)
    flag = threading.Event()
    emu.launch_host_func(s, lambda: (time.sleep(0.1), flag.set()))
    emu.stream_destroy(s)
    emu.device_synchronize(0)
    assert flag.is_set()


def test_destroyed_and_unknown_handles(emu):
    s = emu.stream_create(0)
    ev = emu.event_create(0)
    p = emu.mem_alloc(0, 64)
    buf = np.zeros(64, dtype=np.uint8)
    emu.stream_destroy(s)
    bad = "CUDA_ERROR_INVALID_HANDLE"
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("stream_destroy", lambda: emu.stream_destroy(s)),
        ("stream_query", lambda: emu.stream_query(s)),
        ("stream_synchronize", lambda: emu.stream_synchronize(s)),
        ("stream_wait_event", lambda: emu.stream_wait_event(s, ev)),
        ("launch_host_func", lambda: emu.launch_host_func(s, lambda: None)),
        ("event_record", lambda: emu.event_record(ev, s)),
        ("memcpy_htod_async", lambda: emu.memcpy_htod_async(p, host(buf), 8, s)),
        ("memcpy_dtoh_async", lambda: emu.memcpy_dtoh_async(host(buf), p, 8, s)),
        ("memcpy_dtod_async", lambda: emu.memcpy_dtod_async(p, p + 8, 8, s)),
        ("memset_d8_async", lambda: emu.memset_d8_async(p, 0, 8, s)),
        ("memset_d32_async", lambda: emu.memset_d32_async(p, 0, 2, s)),
        ("mem_alloc_async", lambda: emu.mem_alloc_async(0, 8, s)),
        ("mem_free_async", lambda: emu.mem_free_async(0, p, s)),
        ("stream_query", lambda: emu.stream_query(0)),
        ("event_query", lambda: emu.event_query(12345)),
    ]
    for op, fn in calls:
        with raises_driver(bad, OPS[op]):
            fn()
    emu.mem_free(0, p)  # the failed mem_free_async left p live
    emu.event_destroy(ev)
    with raises_driver(bad, OPS["event_synchronize"]):
        emu.event_synchronize(ev)
    with raises_driver(bad, OPS["event_destroy"]):
        emu.event_destroy(ev)


def test_event_record_needs_a_stream_of_the_same_device(emu):
    s1 = emu.stream_create(1)
    ev0 = emu.event_create(0)
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", OPS["event_record"]):
        emu.event_record(ev0, s1)
    s0 = emu.stream_create(0)
    emu.event_record(ev0, s0)
    emu.stream_wait_event(s1, ev0)  # waits across devices are allowed
    emu.stream_synchronize(s1)


def test_elapsed_ms_rules(emu):
    s = emu.stream_create(0)
    start, end = emu.event_create(0, timing=True), emu.event_create(0, timing=True)
    plain = emu.event_create(0)
    call = OPS["event_elapsed_ms"]
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", call):
        emu.event_elapsed_ms(start, end)  # never recorded
    emu.event_record(start, s)
    emu.launch_host_func(s, lambda: time.sleep(0.1))
    emu.event_record(end, s)
    emu.event_record(plain, s)
    with raises_driver("CUDA_ERROR_NOT_READY", call):
        emu.event_elapsed_ms(start, end)
    emu.stream_synchronize(s)
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", call) as info:
        emu.event_elapsed_ms(start, plain)
    assert "timing" in info.value.detail
    ms = emu.event_elapsed_ms(start, end)
    assert 90 <= ms < 1000
    assert emu.event_elapsed_ms(end, start) == pytest.approx(-ms)


def test_sticky_error_from_a_raising_host_function(emu):
    s = emu.stream_create(0)
    healthy = emu.stream_create(1)
    ev = emu.event_create(0)

    def boom() -> None:
        raise ValueError("kernel exploded")

    emu.launch_host_func(s, boom)
    after = threading.Event()
    emu.launch_host_func(s, after.set)  # later items still run
    emu.event_record(ev, s)
    for _ in range(2):  # sticky: raised every time
        with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["stream_synchronize"]) as info:
            emu.stream_synchronize(s)
        assert "ValueError: kernel exploded" in info.value.detail
    assert after.is_set()
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["event_synchronize"]):
        emu.event_synchronize(ev)
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["device_synchronize"]):
        emu.device_synchronize(0)
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["stream_query"]):
        emu.stream_query(s)
    emu.device_synchronize(1)  # the other device is unaffected
    emu.stream_synchronize(healthy)
    emu.rebuild_context(0)
    emu.device_synchronize(0)
    emu.stream_synchronize(emu.stream_create(0))


@pytest.mark.parametrize("reached", [False, True], ids=["wait-queued-first", "failure-already-reached"])
def test_waiting_on_a_failed_stream_passes_the_failure_on(emu, reached):
    """As a GPU's sticky error: a stream that waits on an event recorded after a failure
    fails too, and so do its synchronizes, its queries and events recorded on it later."""
    bad, waiter, other = emu.stream_create(0), emu.stream_create(0), emu.stream_create(1)
    before, after_fail, on_waiter = emu.event_create(0), emu.event_create(0), emu.event_create(0)
    go = threading.Event()
    emu.launch_host_func(bad, lambda: go.wait(10))
    emu.event_record(before, bad)  # reached before the failure: waiting on it is fine

    def boom() -> None:
        raise RuntimeError("illegal address in kernel k")

    emu.launch_host_func(bad, boom)
    emu.event_record(after_fail, bad)
    if reached:
        go.set()
        with pytest.raises(DriverError):
            emu.event_synchronize(after_fail)
    emu.stream_wait_event(waiter, after_fail)
    emu.event_record(on_waiter, waiter)
    emu.stream_wait_event(other, before)  # a wait across devices, on work that succeeded
    go.set()
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["stream_synchronize"]) as info:
        emu.stream_synchronize(waiter)
    assert f"stream {bad}" in info.value.detail and "illegal address in kernel k" in info.value.detail
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["event_synchronize"]):
        emu.event_synchronize(on_waiter)
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["event_query"]):
        emu.event_query(on_waiter)
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["stream_query"]):
        emu.stream_query(waiter)
    emu.stream_synchronize(other)  # waited only on work before the failure: healthy
    emu.device_synchronize(1)


def test_a_wait_on_work_before_a_failure_does_not_fail(emu):
    bad, waiter = emu.stream_create(0), emu.stream_create(0)
    ev = emu.event_create(0)
    go = threading.Event()
    emu.launch_host_func(bad, lambda: go.wait(10))
    emu.event_record(ev, bad)
    emu.stream_wait_event(waiter, ev)

    def boom() -> None:
        raise RuntimeError("later failure")

    emu.launch_host_func(bad, boom)
    go.set()
    emu.stream_synchronize(waiter)  # its wait covers only the work that succeeded
    with raises_driver("CUDA_ERROR_LAUNCH_FAILED", OPS["stream_synchronize"]):
        emu.stream_synchronize(bad)


def test_rebuild_context_invalidates_handles_and_memory(emu):
    s, s1 = emu.stream_create(0), emu.stream_create(1)
    ev = emu.event_create(0)
    p, p1 = emu.mem_alloc(0, 1 << 20), emu.mem_alloc(1, 4096)
    pinned = emu.host_alloc(64)
    go = gate(emu, s)
    ran = threading.Event()
    emu.launch_host_func(s, ran.set)  # queued behind the gate: dropped by the rebuild
    emu.rebuild_context(0)
    go.set()
    assert emu.mem_get_info(0)[0] == emu.mem_get_info(0)[1]
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", OPS["stream_synchronize"]):
        emu.stream_synchronize(s)
    with raises_driver("CUDA_ERROR_INVALID_HANDLE", OPS["event_query"]):
        emu.event_query(ev)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["mem_free"]):
        emu.mem_free(0, p)
    with raises_driver("CUDA_ERROR_INVALID_VALUE", OPS["memset_d8_async"]):
        emu.memset_d8_async(p, 0, 8, s1)
    emu.device_synchronize(0)
    time.sleep(0.05)
    assert not ran.is_set()
    # device 1 and pinned memory survive; device 0 works again
    emu.memset_d8_async(p1, 3, 4096, s1)
    emu.memcpy_dtoh_async(pinned, p1, 64, s1)
    emu.stream_synchronize(s1)
    assert ctypes.string_at(pinned, 64) == b"\x03" * 64
    s2 = emu.stream_create(0)
    assert s2 not in (s, s1)
    q = emu.mem_alloc(0, 256)
    emu.memset_d8_async(q, 9, 256, s2)
    assert (download(emu, q, 256, s2) == 9).all()
    emu.host_free(pinned)


# -- jitter ---------------------------------------------------------------------

def _pipeline(b: EmulatedBackend, rounds: int = 6) -> None:
    """Producer -> transformer -> consumer on three streams, ordered by events
    only; checks every byte."""
    n = 1 << 14
    load, work, store = (b.stream_create(0) for _ in range(3))
    loaded, worked, stored = (b.event_create(0) for _ in range(3))
    stage, result = b.mem_alloc(0, n), b.mem_alloc(0, n)
    inputs = [np.full(n, (7 * r + 1) % 256, dtype=np.uint8) for r in range(rounds)]
    outputs = [np.zeros(n, dtype=np.uint8) for _ in range(rounds)]
    for r in range(rounds):
        if r:
            b.stream_wait_event(load, worked)  # do not overwrite stage before it was read
        b.memcpy_htod_async(stage, host(inputs[r]), n, load)
        b.event_record(loaded, load)
        b.stream_wait_event(work, loaded)
        if r:
            b.stream_wait_event(work, stored)  # do not overwrite result before it was read
        b.memcpy_dtod_async(result + n // 2, stage, n // 2, work)
        b.memcpy_dtod_async(result, stage + n // 2, n // 2, work)
        b.memset_d8_async(result + 10, r, 5, work)
        b.event_record(worked, work)
        b.stream_wait_event(store, worked)
        b.memcpy_dtoh_async(host(outputs[r]), result, n, store)
        b.event_record(stored, store)
    b.device_synchronize(0)
    for r in range(rounds):
        expect = inputs[r].copy()
        expect[10:15] = r
        assert np.array_equal(outputs[r], expect), f"round {r}"
    b.mem_free(0, stage)
    b.mem_free(0, result)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_jitter_does_not_change_synchronized_results(seed):
    b = EmulatedBackend(devices=1, memory="16MiB", jitter=(seed, 500))
    try:
        for _ in range(3):
            _pipeline(b)
        assert b.mem_get_info(0)[0] == 16 << 20
    finally:
        b.rebuild_context(0)


def test_jitter_delays_items():
    b = EmulatedBackend(devices=1, memory="1MiB", jitter=(5, 2000))
    s = b.stream_create(0)
    t0 = time.perf_counter()
    for _ in range(40):
        b.launch_host_func(s, lambda: None)
    b.stream_synchronize(s)
    assert time.perf_counter() - t0 > 0.01  # 40 items of up to 2 ms each
    b.rebuild_context(0)


# -- fault injection ------------------------------------------------------------

def _fault_calls(b: EmulatedBackend) -> dict[str, Callable[[], Any]]:
    s = b.stream_create(0)
    ev = b.event_create(0)
    t0, t1 = b.event_create(0, timing=True), b.event_create(0, timing=True)
    b.event_record(t0, s)
    b.event_record(t1, s)
    b.stream_synchronize(s)
    p = b.mem_alloc(0, 1024)
    buf = np.zeros(64, dtype=np.uint8)
    h = host(buf)
    return {
        "init_device": lambda: b.init_device(0),
        "rebuild_context": lambda: b.rebuild_context(1),
        "mem_alloc": lambda: b.mem_free(0, b.mem_alloc(0, 256)),
        "mem_free": lambda: b.mem_free(0, b.mem_alloc(0, 256)),
        "mem_alloc_async": lambda: b.mem_alloc_async(0, 256, s),
        "mem_free_async": lambda: b.mem_free_async(0, b.mem_alloc(0, 256), s),
        "mem_get_info": lambda: b.mem_get_info(0),
        "mem_pool_trim": lambda: b.mem_pool_trim(0),
        "host_alloc": lambda: b.host_free(b.host_alloc(64)),
        "host_free": lambda: b.host_free(b.host_alloc(64)),
        "memcpy_htod_async": lambda: b.memcpy_htod_async(p, h, 64, s),
        "memcpy_dtoh_async": lambda: b.memcpy_dtoh_async(h, p, 64, s),
        "memcpy_dtod_async": lambda: b.memcpy_dtod_async(p + 512, p, 64, s),
        "memcpy_peer_async": lambda: b.memcpy_peer_async(p + 512, 0, p, 0, 64, s),
        "memset_d8_async": lambda: b.memset_d8_async(p, 1, 64, s),
        "memset_d32_async": lambda: b.memset_d32_async(p, 0x01010101, 16, s),
        "stream_create": lambda: b.stream_destroy(b.stream_create(0)),
        "stream_destroy": lambda: b.stream_destroy(b.stream_create(0)),
        "stream_wait_event": lambda: b.stream_wait_event(s, ev),
        "stream_query": lambda: b.stream_query(s),
        "stream_synchronize": lambda: b.stream_synchronize(s),
        "launch_host_func": lambda: b.launch_host_func(s, lambda: None),
        "event_create": lambda: b.event_destroy(b.event_create(0)),
        "event_destroy": lambda: b.event_destroy(b.event_create(0)),
        "event_record": lambda: b.event_record(ev, s),
        "event_query": lambda: b.event_query(ev),
        "event_synchronize": lambda: b.event_synchronize(ev),
        "event_elapsed_ms": lambda: b.event_elapsed_ms(t0, t1),
        "device_synchronize": lambda: b.device_synchronize(0),
        "device_can_access_peer": lambda: b.device_can_access_peer(0, 1),
        "enable_peer_access": lambda: b.enable_peer_access(0, 1),
        "kernel_compile": lambda: _expect_unsupported(lambda: b.kernel_compile(0, "", "k")),
        "kernel_launch": lambda: b.kernel_launch(lambda: None, (1, 1, 1), (1, 1, 1), 0, s, ()),
        **_vmm_fault_calls(b),
    }


def _expect_unsupported(fn: Callable[[], Any]) -> None:
    """The emulator compiles nothing: past an injected fault, it says so."""
    from ignis.errors import UnsupportedError
    try:
        fn()
    except UnsupportedError:
        pass


def _unwind(undos: list[Callable[[], Any]]) -> None:
    """Run cleanups in reverse; one that meets the injected fault runs again (the
    fault fires once), and the fault is raised after everything was cleaned up."""
    first = None
    for undo in reversed(undos):
        try:
            undo()
        except DriverError as e:
            if e.detail != "injected fault":
                raise
            undo()
            first = first or e
    if first is not None:
        raise first


def _vmm_fault_calls(b: EmulatedBackend) -> dict[str, Callable[[], Any]]:
    """One call per vmm op, each a whole round that leaves nothing behind."""
    g = b.vmm_granularity(0)

    def mapped() -> None:  # create, reserve, map, set access, unmap, free, release: once each
        made: list[Callable[[], Any]] = []
        try:
            h = b.vmm_create(0, g)
            made.append(lambda: b.vmm_release(h))
            p = b.vmm_reserve(0, g)
            made.append(lambda: b.vmm_free_address(p, g))
            b.vmm_map(p, g, h)
            made.append(lambda: b.vmm_unmap(p, g))
            b.vmm_set_access(0, p, g)
        finally:
            _unwind(made)

    def shared() -> None:  # export, then import in the same process
        h = b.vmm_create(0, g)
        try:
            fd = b.vmm_export_fd(h)
            try:
                b.vmm_release(b.vmm_import_fd(fd))
            finally:
                os.close(fd)
        finally:
            b.vmm_release(h)

    calls: dict[str, Callable[[], Any]] = {"vmm_granularity": lambda: b.vmm_granularity(0)}
    for op in ("vmm_create", "vmm_release", "vmm_reserve", "vmm_free_address", "vmm_map", "vmm_unmap",
               "vmm_set_access"):
        calls[op] = mapped
    calls["vmm_export_fd"] = calls["vmm_import_fd"] = shared
    return calls


def test_fault_table_covers_every_op(faulty):
    assert set(_fault_calls(faulty)) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("error", ["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_ILLEGAL_ADDRESS"])
def test_every_injected_fault_surfaces_and_leaves_the_backend_usable(emu, faulty, op, error):
    calls = _fault_calls(faulty)
    free_before = emu.mem_get_info(0)[0]
    faulty.inject_fault(op, nth=2, error=error)
    calls[op]()  # the first call still works
    with raises_driver(error, OPS[op]) as info:
        calls[op]()
    assert info.value.detail == "injected fault"
    calls[op]()  # and the backend is usable afterwards
    emu.device_synchronize(0)
    if op not in ("mem_alloc_async", "mem_free_async"):  # those leak by design of the table
        assert emu.mem_get_info(0)[0] >= free_before - 512


def test_fault_times_repeats(faulty):
    faulty.inject_fault("mem_alloc", times=3)
    for _ in range(3):
        with raises_driver("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc"):
            faulty.mem_alloc(0, 16)
    assert faulty.mem_alloc(0, 16)


# -- threads --------------------------------------------------------------------

def test_many_threads_allocate_copy_and_free(emu):
    errors: list[BaseException] = []
    total = emu.mem_get_info(0)[1]

    def worker(k: int) -> None:
        try:
            rng = np.random.default_rng(k)
            s = emu.stream_create(k % 2)
            ev = emu.event_create(k % 2)
            for i in range(60):
                n = int(rng.integers(1, 20000))
                data = rng.integers(0, 256, n, dtype=np.uint8)
                out = np.zeros(n, dtype=np.uint8)
                a = emu.mem_alloc(k % 2, n)
                c = emu.mem_alloc_async(k % 2, n, s)
                emu.memcpy_htod_async(a, host(data), n, s)
                emu.memcpy_dtod_async(c, a, n, s)
                emu.event_record(ev, s)
                emu.memcpy_dtoh_async(host(out), c, n, s)
                emu.mem_free_async(k % 2, c, s)
                if i % 3 == 0:
                    emu.event_synchronize(ev)
                emu.stream_synchronize(s)
                emu.mem_free(k % 2, a)
                assert np.array_equal(out, data)
            emu.event_destroy(ev)
            emu.stream_destroy(s)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    run_threads(worker, 8, 30)
    assert not errors, errors[0]
    emu.device_synchronize(0)
    emu.device_synchronize(1)
    assert emu.mem_get_info(0) == (total, total)
    assert emu.mem_get_info(1) == (total, total)


def test_interpreter_exit_with_busy_streams_does_not_hang():
    import subprocess
    import sys

    code = (
        "import time\n"
        "from ignis.backends.emulated import EmulatedBackend\n"
        "b = EmulatedBackend(devices=1, memory='1MiB', jitter=(1, 100))\n"
        "s = b.stream_create(0)\n"
        "p = b.mem_alloc(0, 4096)\n"
        "for _ in range(200):\n"
        "    b.memset_d8_async(p, 1, 4096, s)\n"
        "b.launch_host_func(s, lambda: time.sleep(30))\n"
        "print('ok')\n"
    )
    import os
    env = {**os.environ, "PYTHONPATH": IMPORT_ROOT}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
