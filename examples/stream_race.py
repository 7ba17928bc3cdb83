#!/usr/bin/env python3
"""Why Ignis exists: a race between two streams, caught with both stacks.

One stream writes ``x``, another reads it, and nothing orders the two. With
raw CUDA the copy may run before the fill, and ``y`` silently holds whatever
was in memory before. Run plainly, Ignis orders the read after the write
itself (its default ``auto`` ordering queues the event wait), so the program
is correct and prints ``[1. 1. 1. 1.]``::

    .venv/bin/python examples/stream_race.py

To check the program's own synchronization, as it would run on raw CUDA, run
it under the sanitizer with ``manual`` ordering (Ignis then queues no waits
of its own): it reports the race, with the stack of each access, and exits
with status 1::

    .venv/bin/ignis run --sanitize --ordering manual examples/stream_race.py

The fix is what the report says: ``consumer.wait(producer.record())`` between
the two lines.
"""

import ignis as ig

dev = ig.Device(0)
producer, consumer = dev.create_stream(), dev.create_stream()
x = ig.empty(1 << 20, "float32", stream=producer)
y = ig.empty(1 << 20, "float32", stream=consumer)

ig.kernels.fill(x, 1.0, stream=producer)   # write x on one stream...
ig.kernels.copy(y, x, stream=consumer)     # ...read it on another: nothing orders the two
print(y.to_numpy(stream=consumer)[:4])
