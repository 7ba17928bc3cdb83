"""A standing fuzz of IPC descriptors and handles (issue #14's "done when").

Every input is a forged or mutated version of a real export: descriptor
fields changed (sizes including 2**40, negative, zero, wrong types, shapes,
dtypes, offsets, GPU UUIDs, pids, uids, services, versions, unknown or
missing fields), the descriptor's JSON bytes mutated or truncated, garbage
or closed file descriptors (a pipe, /dev/null, a socket, a regular file, an
unsealed memfd, another export of another size), wrong handle, stream and
device arguments, bad wire messages and truncated reduction data. Each one
must either be refused with a documented error (``ValueError``,
``TypeError``, ``PermissionError``, ``EOFError`` on the wire, or Ignis's own
``UseAfterFreeError`` / ``ClosedError`` / ``UnsupportedError``) or, where the
input is still a valid handle of the real memory, open an array whose bytes
are the exporter's. Never a crash (any other exception), a hang (an input
that takes more than ``HANG_S``) or a leak (file descriptors, mappings and
device bytes are back where they started).

The fast fuzz runs in the normal suite; ``test_fuzz_long`` (``slow``) runs
several thousand inputs, part of them against a real exporter process. Both
print their figures (inputs tried, refused, opened, crashes, hangs, wrong
results, leaks).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import os
import random
import socket
import struct
import tempfile
import time
import traceback
from typing import Any, Callable

import numpy as np
import pytest

import ignis as ig
from ignis.ipc import IpcDescriptor, IpcHandle
from ignis.ipc.handle import _rebuild_handle
from ignis.ipc.share import ImportedMemory
from ignis.ipc.transport import MAGIC

HANG_S = 5.0  # an input that takes longer than this counts as a hang
DOCUMENTED = (ValueError, TypeError, PermissionError, EOFError, ig.UseAfterFreeError, ig.ClosedError,
              ig.UnsupportedError)
CTX = multiprocessing.get_context("spawn")
N = 4096  # float32 elements of the exported array (16 KiB in one 2 MiB granule)
OFFSET_ELEMS = 8  # the exported view starts 32 bytes into its allocation


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) * 3 + seed).astype(np.float32)


def fd_count() -> int:
    gc.collect()
    last, same = len(os.listdir("/proc/self/fd")), 0
    for _ in range(200):
        time.sleep(0.005)
        now = len(os.listdir("/proc/self/fd"))
        same = same + 1 if now == last else 0
        if same == 4:
            break
        last = now
    return last


class Figures:
    """What the fuzz saw."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tried = self.refused = self.opened = 0
        self.crashes: list[str] = []
        self.hangs: list[str] = []
        self.wrong: list[str] = []
        self.leaks: list[str] = []
        self.errors: dict[str, int] = {}
        self.slowest = 0.0

    def line(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items()))
        return (f"{self.name}: {self.tried} inputs tried, {self.refused} refused ({kinds}), {self.opened} opened; "
                f"crashes {len(self.crashes)}, hangs {len(self.hangs)}, wrong results {len(self.wrong)}, "
                f"leaks {len(self.leaks)}; slowest input {self.slowest * 1e3:.1f} ms")

    def check(self) -> None:
        print("\n" + self.line())
        problems = self.crashes + self.hangs + self.wrong + self.leaks
        assert not problems, f"{self.line()}\nfirst problems:\n" + "\n---\n".join(problems[:5])


class Target:
    """A real export (here or in a peer process) and what a correct open must show."""

    def __init__(self, handle: IpcHandle, expect: np.ndarray, local: bool) -> None:
        self.handle = handle
        self.desc = handle.descriptor
        self.base = dataclasses.asdict(self.desc)
        self.base["shape"] = list(self.desc.shape)
        self.expect = expect  # the float32 contents of the whole mapped allocation prefix we wrote
        self.local = local


def _expected_view(t: Target, desc: IpcDescriptor) -> np.ndarray | None:
    """The bytes an array opened with ``desc`` over the real fd must hold (None: unknown)."""
    raw = t.expect.view(np.uint8)
    n = desc.nbytes
    if desc.offset + n > raw.nbytes:
        return None  # past what the exporter wrote: the contents are not known
    return raw[desc.offset:desc.offset + n]


# -- input generators ------------------------------------------------------------------------------

def _field_values(t: Target, g: int, total: int) -> dict[str, list]:
    d = t.base
    junk = [None, True, False, 1.5, float("nan"), float("inf"), "", "x", "2097152", [], {}, [1], -1, 0,
            2 ** 31, 2 ** 63, 2 ** 64, -2 ** 63, 10 ** 30, "\udcff", "é" * 40]
    return {
        "size": [0, -1, -g, 1, g - 1, g + 1, 2 * g, 4 * g, d["size"] + g, total, total + g, 2 ** 40,
                 2 ** 40 + g, 2 ** 50, 2 ** 50 + 1, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 40,
                 float(d["size"]), str(d["size"]), True] + junk,
        "offset": [-4, -1, 1, 2, 3, 4, d["offset"] + 4, d["offset"] - 4, d["size"], d["size"] - 4, g,
                   2 ** 40, 2 ** 63, -2 ** 63] + junk,
        "shape": [[-1], [0], [N, 0], [N * 2], [N + 1], [N - 1], [1], [g], [g // 4], [2 ** 40], [2 ** 62, 2 ** 62],
                  [1] * 32, [1] * 33, [[N]], [N, -1], [N // 2, 2], [2, N // 2], [True] * 2, ["16"], "16", 16,
                  None, {"0": N}, [float(N)]] + junk,
        "dtype": ["float64", "float16", "int8", "uint8", "int64", "bool", "bfloat16", "float128", "complex256",
                  "Float32", "float32 ", "f4", "<f4", "object", "void"] + junk,
        "generation": [0, -1, d["generation"] + 1, d["generation"] - 1, 2 ** 63 - 1, 2 ** 63] + junk,
        "device_uuid": ["GPU-00000000-0000-0000-0000-000000000000", d["device_uuid"].lower(),
                        d["device_uuid"].upper().replace("GPU", "gpu"), d["device_uuid"][:-1],
                        d["device_uuid"] + "0", "MIG-" + d["device_uuid"][4:], "GPU-0", " " + d["device_uuid"]]
        + junk,
        "pid": [os.getpid(), 1, 0, -1, 2 ** 31 - 1, 2 ** 31, d["pid"] + 1] + junk,
        "uid": [os.geteuid() + 1, 0, -1, 2 ** 32 - 1, 2 ** 32] + junk,
        "service": ["", f"ignis-ipc/{d['pid']}/0123456789abcdef", f"ignis-ipc/{d['pid'] + 1}/0123456789abcdef",
                    f"ignis-ipc/{d['pid']}/XYZ", "/tmp/x", "ignis-ipc//", d["service"] + "x"] + junk,
        "version": [0, 2, -1, 1.0, "1", True, None, 2 ** 64],
    }


def _dict_inputs(t: Target, rng: random.Random, count: int, g: int, total: int) -> list[tuple[str, Any]]:
    values = _field_values(t, g, total)
    fields = list(values)
    out: list[tuple[str, Any]] = []
    # every single-field change once, then random combinations
    for f in fields:
        for v in values[f]:
            out.append((f"{f}={v!r}"[:120], {**t.base, f: v}))
    while len(out) < count:
        d = dict(t.base)
        k = rng.choice((1, 1, 2, 2, 3))
        for f in rng.sample(fields, k):
            d[f] = rng.choice(values[f])
        r = rng.random()
        if r < 0.05:
            d.pop(rng.choice(fields + ["version"]), None)
            what = "missing field"
        elif r < 0.1:
            d[rng.choice(["extra", "Size", "", "fd", "shape "])] = rng.choice([1, "x", None])
            what = "unknown field"
        else:
            what = "fields"
        out.append((f"{what}: " + json.dumps(d, default=str)[:160], d))
    return out


def _byte_inputs(t: Target, rng: random.Random, count: int) -> list[tuple[str, bytes]]:
    good = t.desc.to_bytes()
    out: list[tuple[str, bytes]] = [("empty", b""), ("truncated-1", good[:-1]), ("half", good[: len(good) // 2]),
                                    ("deep-nesting", b"[" * 30000 + b"]" * 30000),
                                    ("huge-int", good.replace(b'"size":', b'"size":' + b"9" * 5000 + b",\"_\":")),
                                    ("float-inf", good.replace(b'"size":', b'"size":1e999,"_":')),
                                    ("not-utf8", b"\xff\xfe" + good), ("nul", good + b"\0"),
                                    ("oversized", b" " * (64 << 10) + good), ("array", b"[" + good + b"]"),
                                    ("duplicate-key", good[:-1] + b',"size":1}')]
    while len(out) < count:
        b = bytearray(good)
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            op = rng.random()
            i = rng.randrange(len(b) + 1)
            if op < 0.35 and b:
                b[min(i, len(b) - 1)] = rng.randrange(256)
            elif op < 0.55:
                b[i:i] = bytes([rng.choice(b'0123456789-{}[]",:.eE ')])
            elif op < 0.75 and b:
                del b[min(i, len(b) - 1)]
            elif op < 0.9:
                b = b[:i]
            else:
                j = rng.randrange(len(good))
                b[i:i] = good[j:j + rng.randrange(1, 16)]
        out.append((f"bytes {bytes(b[:80])!r}", bytes(b)))
    return out


# -- running one input -------------------------------------------------------------------------------

def _open_and_check(fig: Figures, what: str, t: Target, handle: IpcHandle, real_fd: bool, **kw: Any) -> None:
    """Open ``handle``; a success over the real fd must show the exporter's bytes."""
    arr = ig.ipc.open(handle, timeout=0.2, **kw)
    fig.opened += 1
    try:
        if real_fd:
            want = _expected_view(t, handle.descriptor)
            if want is not None:
                got = arr.to_numpy().view(np.uint8).reshape(-1)
                if got.nbytes != want.nbytes or not np.array_equal(got, want):
                    fig.wrong.append(f"{what}: opened, but its bytes are not the exporter's")
    finally:
        ig.ipc.close(arr)


def _run(fig: Figures, what: str, fn: Callable[[], None]) -> None:
    fig.tried += 1
    t0 = time.perf_counter()
    try:
        fn()
    except DOCUMENTED as exc:
        fig.refused += 1
        name = type(exc).__name__
        fig.errors[name] = fig.errors.get(name, 0) + 1
        if not str(exc):
            fig.crashes.append(f"{what}: {name} without a message")
    except BaseException as exc:  # noqa: BLE001 - an undocumented error is a crash
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        fig.crashes.append(f"{what}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
    dt = time.perf_counter() - t0
    fig.slowest = max(fig.slowest, dt)
    if dt > HANG_S:
        fig.hangs.append(f"{what}: took {dt:.1f} s")


def _descriptor_case(fig: Figures, what: str, t: Target, data: Any, as_json: bool = False) -> None:
    """Parse ``data`` (a dict, or with ``as_json`` its JSON bytes; or bytes), then open
    the real fd with it; also try it as an unparsed descriptor (``validated()`` in open)."""
    def go() -> None:
        raw = json.dumps(data, default=str).encode() if as_json else data
        desc = IpcDescriptor.parse(raw)
        with IpcHandle(os.dup(t.handle.fd), desc) as h:
            _open_and_check(fig, what, t, h, real_fd=True)
    _run(fig, what, go)
    if isinstance(data, dict) and set(data) == set(t.base):
        def forged() -> None:  # the same fields, never parsed: open must check them itself
            desc = dataclasses.replace(t.desc, **{k: v for k, v in data.items()})
            with IpcHandle(os.dup(t.handle.fd), desc) as h:
                _open_and_check(fig, what, t, h, real_fd=True)
        _run(fig, "unparsed " + what, forged)


def _forged_fds(t: Target, g: int) -> list[tuple[str, Callable[[], int]]]:
    """Ways to get an fd that is not (this) exported allocation; each returns a new fd."""

    def closed() -> int:
        fd = os.dup(t.handle.fd)
        os.close(fd)
        return fd

    def regular() -> int:
        with tempfile.TemporaryFile() as f:
            f.truncate(t.desc.size)
            return os.dup(f.fileno())

    def memfd(name: str, seal: bool) -> Callable[[], int]:
        def make() -> int:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, t.desc.size)
            if seal:
                import fcntl
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            return fd
        return make

    def pipe() -> int:
        r, w = os.pipe()
        os.close(w)
        return r

    def sock() -> int:
        a, b = socket.socketpair()
        b.close()
        return a.detach()

    return [("closed fd", closed), ("/dev/null", lambda: os.open("/dev/null", os.O_RDONLY)),
            ("a pipe", pipe), ("a socket", sock), ("a regular file", regular),
            ("an unsealed memfd", memfd("ignis-vmm-0", False)), ("a memfd of another name", memfd("other", True)),
            ("a directory", lambda: os.open("/", os.O_RDONLY)),
            ("a bogus fd number", lambda: 1 << 20)]


def _fd_cases(fig: Figures, t: Target, g: int) -> None:
    for name, make in _forged_fds(t, g):
        def go(make: Callable[[], int] = make) -> None:
            fd = make()
            h = IpcHandle(fd, t.desc)
            try:
                _open_and_check(fig, name, t, h, real_fd=False)
            finally:
                try:
                    h.close()
                except OSError:  # closed or bogus: nothing to close (the handle is closed now)
                    pass
        _run(fig, f"fd: {name}", go)


def _argument_cases(fig: Figures, t: Target) -> None:
    bad_fds = ["3", -1, 3.0, None, True, 2 ** 64]
    for fd in bad_fds:
        _run(fig, f"IpcHandle(fd={fd!r})", lambda fd=fd: IpcHandle(fd, t.desc))
    for desc in (None, {}, t.desc.to_bytes(), "x", 5):
        def go(desc: Any = desc) -> None:
            fd = os.dup(t.handle.fd)
            try:
                IpcHandle(fd, desc).close()
            except BaseException:
                os.close(fd)  # a refused constructor leaves the fd the caller's
                raise
        _run(fig, f"IpcHandle(descriptor={desc!r:.40})", go)
    for handle in (None, "handle", 5, t.desc, t.desc.to_bytes(), object()):
        _run(fig, f"open({handle!r:.40})", lambda handle=handle: ig.ipc.open(handle))
    for data in (None, 5, 10 ** 12, [1, 2], object(), 1.5):
        _run(fig, f"parse({data!r:.40})", lambda data=data: IpcDescriptor.parse(data))
    for device in (-1, 99, "0", 1.5, True, None, 2 ** 64, [0]):
        def go(device: Any = device) -> None:
            with IpcHandle(os.dup(t.handle.fd), t.desc) as h:
                _open_and_check(fig, f"device={device!r}", t, h, real_fd=True, device=device)
        _run(fig, f"open(device={device!r})", go)
    for stream in ("s", 5, object(), ig.Device(0)):
        def go(stream: Any = stream) -> None:
            with IpcHandle(os.dup(t.handle.fd), t.desc) as h:
                _open_and_check(fig, f"stream={stream!r}", t, h, real_fd=True, stream=stream)
        _run(fig, f"open(stream={stream!r})", go)


def _wire_cases(fig: Figures, t: Target, rng: random.Random, count: int) -> None:
    desc = t.desc.to_bytes()
    head = struct.pack("<4sI", MAGIC, len(desc))
    good = head + desc
    msgs: list[tuple[bytes, int]] = [(good, 0), (good, 2), (good, 4), (good, 6), (head, 1), (b"", 1),
                                     (b"IGX2" + good[4:], 1), (struct.pack("<4sI", MAGIC, 2 ** 32 - 1), 1)]
    while len(msgs) < count:
        b = bytearray(good)
        for _ in range(rng.choice((1, 2, 4))):
            if not b:
                break
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.7 else b[i]
            if rng.random() < 0.2:
                b = b[:i]
        msgs.append((bytes(b), rng.choice((0, 1, 1, 1, 2))))
    for msg, nfds in msgs:
        def go(msg: bytes = msg, nfds: int = nfds) -> None:
            ours, theirs = socket.socketpair()
            try:
                extra = [os.dup(t.handle.fd) if i == 0 else os.open("/dev/null", os.O_RDONLY) for i in range(nfds)]
                try:
                    if msg or extra:
                        socket.send_fds(theirs, [msg or b"\0"], extra)
                finally:
                    for fd in extra:
                        os.close(fd)
                theirs.close()
                ours.settimeout(1.0)
                arr = ig.ipc.recv(ours, timeout=0.2)
                fig.opened += 1
                ig.ipc.close(arr)
            finally:
                ours.close()
                theirs.close()
        _run(fig, f"wire {msg[:40]!r} with {nfds} fd(s)", go)


def _reduction_cases(fig: Figures, t: Target, rng: random.Random, count: int) -> None:
    """The multiprocessing reduction's rebuild with mutated descriptor bytes: the fd it
    received must be closed when the descriptor is refused."""

    class Dup:
        def __init__(self) -> None:
            self.fd = os.dup(t.handle.fd)

        def detach(self) -> int:
            return self.fd

    good = t.desc.to_bytes()
    for i in range(count):
        data = good[: rng.randrange(len(good))] if i % 2 else bytes(
            c if rng.random() > 0.05 else rng.randrange(256) for c in good)

        def go(data: bytes = data) -> None:
            h = _rebuild_handle(Dup(), data)
            h.close()
        _run(fig, f"rebuild {data[:40]!r}", go)


# -- the state that must come back -------------------------------------------------------------------

def _state(backend: Any) -> dict[str, int]:
    out = {"fds": fd_count(), "imported": ImportedMemory.of(ig.Device(0)).bytes_outstanding}
    if backend.name == "emulated":
        out["device_free"] = backend.mem_get_info(0)[0]
        raw = getattr(backend, "inner", backend)  # under the fault-injecting wrapper
        out["vmm_handles"] = len(raw._vmm_handles)
        out["reservations"] = len(raw._vmm_res)
    return out


def _check_leaks(fig: Figures, before: dict, backend: Any) -> None:
    after = _state(backend)
    for k, v in before.items():
        if after[k] != v:
            fig.leaks.append(f"{k}: {v} before, {after[k]} after")


def fuzz(fig: Figures, t: Target, seed: int, scale: int, backend: Any) -> None:
    rng = random.Random(seed)
    dev = ig.Device(0)
    g = ImportedMemory.of(dev).granularity
    total = dev.total_memory
    ig.ipc.close(ig.ipc.open(t.handle, timeout=0.2))  # warm up anything made once per process
    before = _state(backend)
    for i, (what, d) in enumerate(_dict_inputs(t, rng, 3 * scale, g, total)):
        _descriptor_case(fig, what, t, d, as_json=bool(i % 2))
    for what, b in _byte_inputs(t, rng, scale):
        _descriptor_case(fig, what, t, b)
    _fd_cases(fig, t, g)
    _argument_cases(fig, t)
    _wire_cases(fig, t, rng, max(8, scale // 4))
    _reduction_cases(fig, t, rng, max(4, scale // 8))
    _check_leaks(fig, before, backend)


@pytest.fixture
def local_target(dev):
    mr = ig.VmmResource(dev)
    whole = ig.from_numpy(pattern(N + OFFSET_ELEMS), mr=mr)
    view = whole[OFFSET_ELEMS:]  # the export starts inside its allocation
    handle = ig.ipc.export(view)
    expect = pattern(N + OFFSET_ELEMS)
    yield Target(handle, expect, local=True)
    handle.close()
    del view
    whole.free()


@pytest.mark.timeout(300)
def test_fuzz_fast(local_target, backend):
    fig = Figures("fast fuzz")
    fuzz(fig, local_target, seed=14, scale=120, backend=backend)
    fig.check()
    assert fig.tried > 500 and fig.opened > 0


# -- the long fuzz, also against a real exporter process -----------------------------------------------

def _exporter(sock: socket.socket) -> None:
    try:
        mr = ig.VmmResource(0)
        whole = ig.from_numpy(pattern(N + OFFSET_ELEMS, seed=1), mr=mr)
        view = whole[OFFSET_ELEMS:]
        ig.ipc.send(sock, view)
        sock.recv(1)  # hold the memory until the fuzzer is done
        del view
        whole.free()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        sock.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fuzz_long(local_target, backend):
    fig = Figures("long fuzz (this process's export)")
    for seed in range(4):
        fuzz(fig, local_target, seed=100 + seed, scale=400, backend=backend)
    fig.check()
    ours, theirs = socket.socketpair()
    proc = CTX.Process(target=_exporter, args=(theirs,), daemon=True)
    proc.start()
    theirs.close()
    try:
        ours.settimeout(60)
        handle = ig.ipc.recv_handle(ours)
        peer = Target(handle, pattern(N + OFFSET_ELEMS, seed=1), local=False)
        fig2 = Figures("long fuzz (another process's export)")
        for seed in range(2):
            fuzz(fig2, peer, seed=200 + seed, scale=400, backend=backend)
        handle.close()
        fig2.check()
        assert fig.tried + fig2.tried > 5000
    finally:
        ours.sendall(b"x")
        ours.close()
        proc.join(60)
        if proc.is_alive():
            proc.kill()
            proc.join()
