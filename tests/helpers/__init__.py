"""Helpers shared by the tests: byte-level device I/O through the backend protocol."""

from __future__ import annotations

import time

import numpy as np

import ignis as ig


def write(ptr: int, data: bytes | np.ndarray, stream: "ig.Stream") -> np.ndarray:
    """Queue a host->device copy of ``data`` to ``ptr`` on ``stream``. Returns the
    host buffer, which must stay alive until the stream has passed the copy."""
    host = np.frombuffer(bytes(data), np.uint8).copy() if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    stream.device.backend.memcpy_htod_async(ptr, host.ctypes.data, host.nbytes, stream.handle)
    return host


def read_into(out: np.ndarray, ptr: int, stream: "ig.Stream") -> None:
    """Queue a device->host copy of ``out.nbytes`` bytes from ``ptr`` into ``out``."""
    stream.device.backend.memcpy_dtoh_async(out.ctypes.data, ptr, out.nbytes, stream.handle)


def read(ptr: int, nbytes: int, stream: "ig.Stream") -> bytes:
    """Copy ``nbytes`` from ``ptr`` to the host on ``stream`` and wait for it."""
    out = np.empty(nbytes, np.uint8)
    read_into(out, ptr, stream)
    stream.synchronize()
    return out.tobytes()


def sleep_on(stream: "ig.Stream", seconds: float) -> None:
    """Hold ``stream`` for ``seconds`` (a host function that sleeps)."""
    stream.launch_host_func(lambda: time.sleep(seconds))
