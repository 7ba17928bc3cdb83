#!/usr/bin/env python3
"""A KV cache: rows appended in place with ``NvArray.write_rows``, read through
zero-copy views, with the mistakes a cache invites refused.

A decoder keeps the keys of every token it has seen in one preallocated
device buffer of shape ``(MAX_TOKENS, HEADS, HEAD_DIM)``. The prompt's keys
are written in one call, then each decoding step appends one row: the cost of
an append is the row it writes, never the cache so far. The keys are computed
on a ``compute`` stream and appended on a ``cache`` stream; tracking orders
each append after the computation it copies.

``write_rows`` checks what it is given: a row of the wrong shape and an
append past the end are errors, not silent corruption. The valid prefix
``cache[:length]`` is a view: it shares the cache's memory and owner, and
the cache refuses ``free()`` while a view of it is alive.
Run from the repository root, on either backend::

    .venv/bin/python examples/kv_cache_append.py

It prints each step and ``kv cache OK`` (exit status 0).
"""

from __future__ import annotations

import sys

import numpy as np

import ignis as ig

MAX_TOKENS, HEADS, HEAD_DIM = 64, 4, 32
PROMPT, STEPS = 12, 20


def keys_for(tokens: range) -> np.ndarray:
    """What the model would compute for these token positions (something checkable)."""
    pos = np.array(tokens, dtype=np.float32)[:, None, None]
    return pos + np.arange(HEADS * HEAD_DIM, dtype=np.float32).reshape(1, HEADS, HEAD_DIM) / 1000


def main() -> int:
    dev = ig.Device(0)
    compute, cache_stream = dev.create_stream(), dev.create_stream()
    cache = ig.zeros((MAX_TOKENS, HEADS, HEAD_DIM), "float16", stream=cache_stream, tag="kv_cache")
    print(f"cache: {cache.shape} float16, {cache.nbytes >> 10} KiB on {dev.name}")
    try:
        prompt = ig.from_numpy(keys_for(range(PROMPT)), dtype="float16", stream=compute, tag="keys")
        cache.write_rows(prompt, 0, stream=cache_stream)          # several rows at once
        prompt.free()                                             # reuse waits for the append's read
        length = PROMPT
        print(f"prompt: wrote rows [0, {PROMPT})")
        for _ in range(STEPS):
            k = ig.from_numpy(keys_for(range(length, length + 1))[0], dtype="float16", stream=compute, tag="keys")
            cache.write_rows(k, length, stream=cache_stream)      # one row of shape (HEADS, HEAD_DIM)
            k.free()
            length += 1
        print(f"decode: appended {STEPS} rows one at a time; length is now {length}")

        valid = cache[:length]                                    # a view: no copy, same owner
        got = valid.to_numpy(stream=cache_stream)
        want = keys_for(range(length)).astype(np.float16)
        ok = bool(np.array_equal(got, want))
        print(f"view cache[:{length}]: shape {valid.shape}, owner {valid.owner!r}, is_view={valid.is_view}; "
              f"rows {'match' if ok else 'DO NOT match'} what was appended")

        bad = ig.zeros((HEADS, HEAD_DIM + 1), "float16", stream=cache_stream)
        try:
            cache.write_rows(bad, length, stream=cache_stream)
            ok = False
            print("a row of the wrong shape was accepted")
        except ValueError as e:
            print(f"refused, wrong row shape: {e}")
        bad.free()
        one = ig.zeros((HEADS, HEAD_DIM), "float16", stream=cache_stream)
        try:
            cache.write_rows(one, MAX_TOKENS, stream=cache_stream)
            ok = False
            print("an append past the end was accepted")
        except ValueError as e:
            print(f"refused, past the end: {e}")
        one.free()
        try:
            cache.free()
            ok = False
            print("the cache was freed while a view of it was alive")
        except ig.MemoryContractViolation as e:
            print(f"refused, free while a view is alive: {e}")
        del valid                                                 # the view is gone: now free works
    finally:
        dev.synchronize()
        if not cache.freed:
            cache.free()
        compute.close()
        cache_stream.close()
    print("kv cache OK" if ok else "kv cache FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
