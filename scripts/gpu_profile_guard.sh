#!/usr/bin/env bash
# Is the guard's torch.empty + free pair bound by the CPU or by the device work it queues?
#   bash scripts/gpu_profile_guard.sh
# For 4 KiB and 1 MiB: µs per pair in a long run, then with a fixed CPU spin added to each
# pair (a CPU-bound pair grows by the spin; a device-bound one hides it), and the device's
# own time per pair (events around the run, the CPU kept ahead of it by queuing all first).
set -uo pipefail
export PYTHONPATH=src IGNIS_BACKEND=cuda PYTHONUNBUFFERED=1
bash scripts/gpu_build.sh > /dev/null 2>&1 || { echo "build failed"; exit 1; }
python3 - <<'PY'
import time, torch
from ignis.torch import _guard
_guard.use_guard()

def spin(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass

def run(n, pairs, extra):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(pairs):
        t = torch.empty(n, device="cuda"); del t
        if extra:
            spin(extra)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / pairs * 1e6, (time.perf_counter() - t0) / pairs * 1e6

for n in (1024, 1 << 18):
    run(n, 3000, 0)
    for extra in (0, 4, 8):
        loop, total = run(n, 20000, extra)
        print(f"{n * 4:>8} B  spin {extra} us: {loop:.2f} us per pair (loop), {total:.2f} with the final synchronize")
    s = torch.cuda.Stream()
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
print(_guard.guard_stats(0))
PY

# The device's time per operation kind for the 1 MiB pair (nsys, where the machine has it).
nsys_bin="$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null || true)"
if [ -n "$nsys_bin" ]; then
    cat > /tmp/guard_1m.py <<'PY'
import torch
from ignis.torch import _guard
_guard.use_guard()
for _ in range(3000):
    t = torch.empty(1 << 18, device="cuda"); del t
torch.cuda.synchronize()
for _ in range(5000):
    t = torch.empty(1 << 18, device="cuda"); del t
torch.cuda.synchronize()
PY
    "$nsys_bin" profile -q -t cuda -o /tmp/guard1m --force-overwrite true python3 /tmp/guard_1m.py > /dev/null 2>&1
    "$nsys_bin" stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum /tmp/guard1m.nsys-rep 2>&1 | cut -c1-180 | head -60
else
    echo "no nsys on this machine"
fi

# The poison's two ways, at 4 KiB and 1 MiB: the driver's memset (what the guard queues) and a
# fill kernel (ig.kernels.fill, uint32 words): the CPU's µs per call and the device's µs per fill.
python3 - <<'PY'
import time, torch, ignis as ig
dev = ig.Device(0)
be, s = dev.backend, dev.default_stream
for nbytes in (4096, 1 << 20):
    x = ig.empty(nbytes // 4, "uint32")
    ptr = x.device_ptr
    ev0, ev1 = be.event_create(0, True), be.event_create(0, True)
    for name, op in (("memset_d8", lambda: be.memset_d8_async(ptr, 0xA5, nbytes, s.handle)),
                     ("memset_d32", lambda: be.memset_d32_async(ptr, 0xA5A5A5A5, nbytes // 4, s.handle)),
                     ("fill_kernel", lambda: ig.kernels.fill(x, 0xA5A5A5A5))):
        for _ in range(200):
            op()
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            op()
        cpu = (time.perf_counter() - t0) / 500 * 1e6
        dev.synchronize()
        be.event_record(ev0, s.handle)
        for _ in range(500):
            op()
        be.event_record(ev1, s.handle)
        dev.synchronize()
        gpu = be.event_elapsed_ms(ev0, ev1) / 500 * 1e3
        print(f"{nbytes:>8} B  {name:11s}: CPU {cpu:6.2f} us per call, device {gpu:6.2f} us per fill")
    x.free()
PY

# The 1 MiB poison as one 2D memset (cuMemsetD2D32Async: rows of words) against the 1D one,
# both called through ctypes (the same call cost): does the driver's CPU cost follow the
# bytes or the number of operations it splits a large 1D memset into?
python3 - <<'PY'
import ctypes, time, ignis as ig
dev = ig.Device(0)
s = dev.default_stream
lib = ctypes.CDLL("libcuda.so.1")
d32 = lib.cuMemsetD32Async
d32.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
d2d32 = lib.cuMemsetD2D32Async
d2d32.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
for nbytes in (4096, 1 << 18, 1 << 20, 4 << 20):
    x = ig.empty(nbytes // 4, "uint32")
    p, h = x.device_ptr, s.handle
    shapes = [("1d", lambda: d32(p, 0xA5A5A5A5, nbytes // 4, h))]
    for pitch in (4096, 65536):
        if nbytes >= pitch:
            shapes.append((f"2d pitch {pitch}", lambda pitch=pitch: d2d32(p, pitch, 0xA5A5A5A5, pitch // 4, nbytes // pitch, h)))
    for name, op in shapes:
        for _ in range(200):
            assert op() == 0
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            op()
        cpu = (time.perf_counter() - t0) / 1000 * 1e6
        dev.synchronize()
        print(f"{nbytes:>8} B  {name:14s}: CPU {cpu:6.2f} us per call")
    x.free()
PY
