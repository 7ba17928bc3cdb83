#!/usr/bin/env python3
"""Save device arrays to a safetensors file and load them back, straight to and
from device memory; open a file lazily; and refuse a hostile header.

1. A few "weights" (float32, bfloat16, int64) are made on the device and
   saved with ``ig.io.save_safetensors``: the bytes go device -> pinned ring
   -> file, never through a whole-model host copy.
2. ``ig.io.load_safetensors`` loads them back into one device allocation
   (each tensor a view of it); every byte is compared with the original.
3. Where the reference ``safetensors`` package is installed, it reads the
   same file (the format is written byte for byte as it writes it).
4. ``ig.io.safe_open`` reads the header only, then one tensor on demand.
5. A file whose header claims more data than the file holds is refused with
   ``SafetensorsError`` before anything is allocated.

Run from the repository root, on either backend::

    .venv/bin/python examples/safetensors_roundtrip.py

It prints each step and ``safetensors round trip OK`` (exit status 0).
``ignis load FILE`` loads a file from the command line and prints its
tensors and the time taken.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile

import numpy as np

import ignis as ig


def main() -> int:
    rng = np.random.default_rng(1)
    host = {
        "embed.weight": rng.standard_normal((512, 64)).astype(np.float32),
        "mlp.up.weight": rng.standard_normal((256, 64)).astype(ig.dtype("bfloat16").numpy),
        "position_ids": np.arange(512, dtype=np.int64),
    }
    ok = True
    with tempfile.TemporaryDirectory(prefix="ignis-example-") as tmp:
        path = os.path.join(tmp, "model.safetensors")

        weights = {name: ig.from_numpy(a) for name, a in host.items()}
        ig.io.save_safetensors(weights, path, metadata={"format": "pt", "made_by": "ignis example"})
        for a in weights.values():
            a.free()
        print(f"saved {len(host)} tensors ({os.path.getsize(path)} bytes) from the device to {os.path.basename(path)}")

        loaded = ig.io.load_safetensors(path)
        for name, a in loaded.items():
            same = bool(np.array_equal(a.to_numpy().view(np.uint8), host[name].view(np.uint8)))
            ok &= same
            print(f"  {name:<14} {a.dtype.name:<8} {str(a.shape):<10} view={a.is_view}  "
                  f"bytes {'match' if same else 'DIFFER'}")
        print(f"loaded back into device memory: {'every byte matches' if ok else 'MISMATCH'}")
        loaded.clear()   # views of one allocation: it goes back when the last one is gone

        try:
            from safetensors.numpy import load_file
        except ImportError:
            print("reference library: skipped (pip install safetensors to compare with it)")
        else:
            ref = load_file(path)
            same = bool(np.array_equal(ref["embed.weight"], host["embed.weight"]))
            ok &= same
            print(f"reference library: safetensors reads the file Ignis wrote: "
                  f"{sorted(ref)}, embed.weight {'matches' if same else 'DIFFERS'}")

        with ig.io.safe_open(path) as f:
            info = f.info("mlp.up.weight")
            print(f"safe_open: {len(f)} tensors, metadata {f.metadata()}; "
                  f"mlp.up.weight is {info.dtype.name} {info.shape}")
            one = f.get("position_ids")
            same = bool(np.array_equal(one.to_numpy(), host["position_ids"]))
            ok &= same
            print(f"  get('position_ids') loaded just that tensor: {one.to_numpy()[:5]}... "
                  f"{'ok' if same else 'WRONG'}")
            one.free()

        bad = os.path.join(tmp, "hostile.safetensors")
        header = json.dumps({"x": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}).encode()
        with open(bad, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)
        try:
            ig.io.load_safetensors(bad)
            ok = False
            print("a hostile header was NOT refused")
        except ig.SafetensorsError as e:
            print(f"hostile header refused, nothing allocated: {e}")

    print("safetensors round trip OK" if ok else "safetensors round trip FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
