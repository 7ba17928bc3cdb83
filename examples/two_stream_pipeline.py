#!/usr/bin/env python3
"""A two-stream pipeline with no hand-written events: uploads on one stream,
compute on the other, double-buffered.

Stream ``copy`` uploads batch ``i`` into buffer ``i % 2`` while stream
``compute`` runs a kernel of our own (``scale_add``: ``acc += a * x``) over
the other buffer. Two hazards need ordering, and Ignis's cross-stream
tracking queues the event waits for both (the default ``auto`` ordering):

- read after write: ``compute`` must not read a buffer before ``copy`` has
  finished uploading it;
- write after read: ``copy`` must not overwrite a buffer that ``compute`` is
  still reading from the batch before last.

The host never waits until the end. The sanitizer runs over the whole
pipeline and finds nothing, and the result is checked against NumPy.
Run from the repository root, on either backend::

    .venv/bin/python examples/two_stream_pipeline.py

It prints the number of cross-stream waits tracking queued and ``pipeline
OK`` (exit status 0), or what went wrong (exit status 1).
"""

from __future__ import annotations

import sys

import numpy as np

import ignis as ig

N = 1 << 18          # float32 elements per batch (1 MiB)
BATCHES = 8
A = 0.5



def _scale_add_host(acc: ig.RawPtr, x: ig.RawPtr, a: float, n: int) -> None:
    """What the emulated backend runs for ``scale_add`` (arrays arrive as typed pointers)."""
    n = int(n)
    acc[0:n] = acc[0:n] + a * x[0:n]


# A kernel of our own: CUDA C for a GPU, a NumPy host_impl for the emulated backend. Each
# argument declares its access, so launch() knows what to order and what the sanitizer checks.
SCALE_ADD = ig.Kernel(
    source=r'''
extern "C" __global__ void scale_add(float* acc, const float* x, float a, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        acc[i] += a * x[i];
}''',
    name="scale_add",
    access=(ig.Access.READ_WRITE, ig.Access.READ, "float32", "int64"),
    host_impl=_scale_add_host,
)


def main() -> int:
    dev = ig.Device(0)
    print(f"device 0: {dev.name} ({ig.backend_name()} backend)")
    copy, compute = dev.create_stream(), dev.create_stream()
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal(N).astype(np.float32) for _ in range(BATCHES)]

    acc = ig.zeros(N, "float32", stream=compute, tag="pipeline.acc")
    bufs = [ig.empty(N, "float32", stream=copy, tag=f"pipeline.buf{k}") for k in range(2)]
    waits0 = ig.memory_stats(dev)["num_cross_stream_waits"]
    try:
        with ig.sanitizer.enabled("raise"):        # verify the ordering that tracking supplies
            for i, batch in enumerate(batches):
                buf = bufs[i % 2]
                buf.from_host(batch, stream=copy)  # waits (on the device) for compute's read of i - 2
                ig.launch(SCALE_ADD, 256, 256, acc, buf, A, N, stream=compute)  # waits for the upload
            got = acc.to_numpy(stream=compute)     # the host waits here, once
        waits = ig.memory_stats(dev)["num_cross_stream_waits"] - waits0
        want = A * np.asarray(np.sum(batches, axis=0, dtype=np.float32))
        ok = bool(np.allclose(got, want, rtol=1e-5, atol=1e-5))
        print(f"{BATCHES} batches of {N * 4 >> 20} MiB: uploads on stream #{copy.id}, scale_add on stream "
              f"#{compute.id}, two buffers in turn")
        print(f"cross-stream tracking queued {waits} event waits; the sanitizer found no race")
        print(f"acc[:4] = {got[:4]}  (NumPy: {want[:4]})")
        print("pipeline OK" if ok else "pipeline FAILED: the result differs from NumPy's")
        return 0 if ok else 1
    finally:
        dev.synchronize()
        for a in (acc, *bufs):
            a.free()
        copy.close()
        compute.close()


if __name__ == "__main__":
    sys.exit(main())
