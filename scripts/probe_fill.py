"""Which queues a large poison cheaper for the CPU: the driver's memset, a launch of a
fill kernel or a device-to-device copy from a poisoned buffer? CPU µs per call (2000 back to back, through ctypes straight into libcuda) and
the device's µs per call (events around 1000), for sizes from 4 KiB to 4 MiB.

    PYTHONPATH=src IGNIS_BACKEND=cuda python3 scripts/probe_fill.py
"""

from __future__ import annotations

import ctypes
import time

import ignis as ig
from ignis.backends import get_backend

SRC = r"""
extern "C" __global__ void fill32(unsigned int* p, unsigned long long words, unsigned int w) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = w;
}
"""


def main() -> None:
    dev = ig.Device(0)
    b = get_backend()
    fn = b.kernel_compile(0, SRC, "fill32")
    cu = ctypes.CDLL("libcuda.so.1")
    stream = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(stream), 1) == 0
    nmax = 4 << 20
    buf = dev.backend.mem_alloc(0, nmax)
    src = dev.backend.mem_alloc(0, nmax)  # a poison source for device-to-device copies
    cu.cuMemsetD32_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
    assert cu.cuMemsetD32_v2(src, 0xA5A5A5A5, nmax // 4) == 0
    copy = cu.cuMemcpyDtoDAsync_v2
    copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    memset = cu.cuMemsetD32Async
    memset.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    launch = cu.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f = ctypes.c_void_p(int(fn))
    ev0, ev1 = ctypes.c_void_p(), ctypes.c_void_p()
    cu.cuEventCreate(ctypes.byref(ev0), 0)
    cu.cuEventCreate(ctypes.byref(ev1), 0)

    def sync():
        assert cu.cuStreamSynchronize(stream) == 0

    for n in (4096, 65536, 262144, 1 << 20, 4 << 20):
        words = n // 4
        a_ptr, a_words, a_w = ctypes.c_uint64(buf), ctypes.c_uint64(words), ctypes.c_uint32(0xA5A5A5A5)
        params = (ctypes.c_void_p * 3)(ctypes.addressof(a_ptr), ctypes.addressof(a_words), ctypes.addressof(a_w))
        grid = max(1, min((words + 255) // 256, 264))
        calls = {
            "memsetD32": lambda: memset(buf, 0xA5A5A5A5, words, stream),
            "fill kernel": lambda: launch(f, grid, 1, 1, 256, 1, 1, 0, stream, params, None),
            "copy DtoD": lambda: copy(buf, src, n, stream),
        }
        row = []
        for name, call in calls.items():
            for _ in range(200):
                call()
            sync()
            t0 = time.perf_counter()
            for _ in range(2000):
                call()
            cpu = (time.perf_counter() - t0) / 2000 * 1e6
            sync()
            cu.cuEventRecord(ev0, stream)
            for _ in range(1000):
                call()
            cu.cuEventRecord(ev1, stream)
            cu.cuEventSynchronize(ev1)
            ms = ctypes.c_float()
            cu.cuEventElapsedTime(ctypes.byref(ms), ev0, ev1)
            row.append(f"{name}: CPU {cpu:.2f} µs, device {ms.value:.3f} µs")
        print(f"{n:>8} B: " + "; ".join(row), flush=True)
    # The CPU's cost of one call with the device idle (the stream drained before each call;
    # the back-to-back figures above are the device's pace once its queue is full).
    for n in (4096, 32768, 65536, 1 << 20):
        words = n // 4
        a_ptr, a_words, a_w = ctypes.c_uint64(buf), ctypes.c_uint64(words), ctypes.c_uint32(0xA5A5A5A5)
        params = (ctypes.c_void_p * 3)(ctypes.addressof(a_ptr), ctypes.addressof(a_words), ctypes.addressof(a_w))
        grid = max(1, min((words + 255) // 256, 264))
        row = []
        for name, call in (("memsetD32", lambda: memset(buf, 0xA5A5A5A5, words, stream)),
                           ("fill kernel", lambda: launch(f, grid, 1, 1, 256, 1, 1, 0, stream, params, None)),
                           ("copy DtoD", lambda: copy(buf, src, n, stream))):
            ts = []
            for _ in range(500):
                sync()
                t0 = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t0)
            ts.sort()
            row.append(f"{name}: CPU {ts[len(ts) // 2] * 1e6:.2f} µs (median; p10 {ts[len(ts) // 10] * 1e6:.2f})")
        print(f"{n:>8} B, one call on an idle device: " + "; ".join(row), flush=True)
    t0 = time.perf_counter()
    for _ in range(2000):
        memset(buf, 0, 0, stream)
    print(f"empty call overhead through ctypes (memset of 0 words): {(time.perf_counter() - t0) / 2000 * 1e6:.2f} µs")
    sync()
    dev.backend.mem_free(0, buf)
    dev.backend.mem_free(0, src)


if __name__ == "__main__":
    main()
