"""VmmResource and ``ig.ipc`` (layers 2 and 5) on the active backend, across
real processes.

Peers are started with the ``spawn`` method (never fork a process whose
backend has threads) and talk to the test over a socket pair: handles with
SCM_RIGHTS, results as JSON lines. A peer's exception comes back as its
traceback and fails the test. Same-process cases (the importer is the
exporter) cover validation and error paths cheaply.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import os
import pickle
import secrets
import socket
import struct
import tempfile
import time
import traceback
from typing import Any

import numpy as np
import pytest

import ignis as ig
from helpers import sleep_on
from ignis.ipc import IpcDescriptor, IpcHandle
from ignis.ipc.transport import MAGIC
from ignis.memory import BlockState, history

WAIT_S = 60.0  # upper bound for anything a test waits on a peer for
CTX = multiprocessing.get_context("spawn")


# -- plumbing -----------------------------------------------------------------------------

def fd_count() -> int:
    """Open fds of this process, once the count has settled: connections of peers
    from earlier tests close asynchronously (their serving threads see EOF)."""
    gc.collect()
    last, same = len(os.listdir("/proc/self/fd")), 0
    for _ in range(200):  # until it holds for 20 ms (at most 1 s)
        time.sleep(0.005)
        now = len(os.listdir("/proc/self/fd"))
        same = same + 1 if now == last else 0
        if same == 4:
            break
        last = now
    return last


def say(sock: socket.socket, obj: Any) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def hear(sock: socket.socket) -> Any:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise EOFError("the peer hung up")
        buf += chunk
    msg = json.loads(buf)
    if isinstance(msg, dict) and "error" in msg:
        pytest.fail(f"the peer process failed:\n{msg['error']}")
    return msg


def _peer_main(name: str, sock: socket.socket, *args: Any) -> None:
    """Entry point of every peer: run ``name`` and report its failure, if any."""
    try:
        globals()[name](sock, *args)
    except BaseException:
        try:
            say(sock, {"error": traceback.format_exc()})
        except OSError:
            pass
    finally:
        sock.close()


class Peer:
    """A spawned peer process running ``name(sock, *args)``; ``sock`` is ours."""

    def __init__(self, name: str, *args: Any) -> None:
        self.sock, theirs = socket.socketpair()
        self.proc = CTX.Process(target=_peer_main, args=(name, theirs, *args), daemon=True)
        self.proc.start()
        theirs.close()
        self.sock.settimeout(WAIT_S)

    def join(self) -> int | None:
        self.proc.join(WAIT_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            pytest.fail("the peer process did not finish")
        self.sock.close()
        return self.proc.exitcode


@pytest.fixture
def mr(dev):
    mr = ig.VmmResource(dev)
    a = ig.empty((1,), "float32", mr=mr)
    ig.ipc.export(a).close()  # the first export starts this process's liveness service (one socket)
    a.free()
    return mr


def pattern(n: int, seed: int = 0) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) + seed).astype(np.float32)


# -- VmmResource ------------------------------------------------------------------------------

def test_vmm_resource_rounds_to_the_queried_granularity(dev, mr):
    g = dev.backend.vmm_granularity(0)
    assert mr.granularity == g and g >= 4096 and g & (g - 1) == 0
    s = dev.create_stream()
    try:
        blocks = [mr.allocate(n, s, tag="t") for n in (1, g, g + 1)]
        assert [b.bytes for b in blocks] == [g, g, 2 * g]
        assert [b.requested for b in blocks] == [1, g, g + 1]
        assert all(b.ptr % g == 0 and b.state is BlockState.LIVE for b in blocks)
        assert mr.bytes_outstanding == 4 * g
        for b in blocks:
            mr.deallocate(b)
        assert mr.bytes_outstanding == 0 and all(b.state is BlockState.FREED for b in blocks)
        with pytest.raises(ig.DoubleFreeError):
            mr.deallocate(blocks[0])
        with pytest.raises(ValueError, match="zero-byte"):
            mr.allocate(0, s)
    finally:
        s.close()


def test_vmm_arrays_track_cross_stream_uses(dev, mr):
    s1, s2, s3 = (dev.create_stream() for _ in range(3))
    try:
        a = ig.empty((1 << 18,), "float32", mr=mr, stream=s1)
        sleep_on(s2, 0.05)  # the write is late; the read on s3 must wait for it
        a.from_host(pattern(1 << 18, 3), stream=s2)
        assert np.array_equal(a.to_numpy(stream=s3), pattern(1 << 18, 3))
        sleep_on(s2, 0.1)
        a.fill_(2.0, stream=s2)
        t0 = time.perf_counter()
        a.free()  # waits for the queued write on s2 before unmapping
        assert time.perf_counter() - t0 >= 0.05
        assert mr.bytes_outstanding == 0
    finally:
        for s in (s1, s2, s3):
            s.close()


def test_vmm_history_hooks_see_rounded_sizes(dev, mr):
    events = []
    prev = history.set_recorder(lambda action, res, ptr, size, stream, block: events.append((action, size)))
    try:
        b = mr.allocate(100, dev.default_stream)
        mr.deallocate(b)
    finally:
        history.set_recorder(prev)
    g = mr.granularity
    assert events == [("alloc", g), ("free_requested", g), ("free_completed", g)]


def test_vmm_resource_needs_the_capabilities(dev, monkeypatch):
    props = dev.properties
    monkeypatch.setattr(dev, "_props", dataclasses.replace(props, posix_fd_ipc_supported=False))
    with pytest.raises(ig.UnsupportedError, match="POSIX file descriptor handles"):
        ig.VmmResource(dev)
    monkeypatch.setattr(dev, "_props", dataclasses.replace(props, vmm_supported=False))
    with pytest.raises(ig.UnsupportedError, match="virtual memory management"):
        ig.VmmResource(dev)


@pytest.mark.parametrize("op", ["vmm_create", "vmm_reserve", "vmm_map", "vmm_set_access"])
def test_vmm_allocate_failure_leaves_nothing_behind(dev, mr, backend, op):
    free_before = backend.mem_get_info(0)[0]
    backend.inject_fault(op, error="CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(ig.DriverError):
        mr.allocate(1 << 20, dev.default_stream)
    assert mr.bytes_outstanding == 0
    b = mr.allocate(1 << 20, dev.default_stream)  # and the resource still works
    mr.deallocate(b)
    if backend.name == "emulated":  # a real device's free memory moves with other processes
        assert backend.mem_get_info(0)[0] == free_before


# -- export, open, close (same process) ----------------------------------------------------------

def test_export_refuses_memory_it_cannot_share(dev, mr):
    a = ig.zeros((16,), "float32")
    with pytest.raises(ValueError, match=r"mr=ig.VmmResource"):
        ig.ipc.export(a)
    e = ig.empty((0,), "float32", mr=mr)
    with pytest.raises(ValueError, match="empty"):
        ig.ipc.export(e)
    b = ig.empty((16,), "float32", mr=mr)
    b.free()
    with pytest.raises(ig.UseAfterFreeError):
        ig.ipc.export(b)
    c = ig.empty((16,), "float32", mr=mr)
    ig.contract.acquire(c, "io")
    with pytest.raises(ig.MemoryContractViolation, match="'io'"):
        ig.ipc.export(c)
    ig.contract.release(c, "io")


def test_open_own_export_shares_bytes_and_is_tracked(dev, mr):
    s1, s2 = dev.create_stream(), dev.create_stream()
    fds = fd_count()
    try:
        a = ig.from_numpy(pattern(4096), mr=mr, stream=s1)
        view = a[1024:2048]
        with ig.ipc.export(view) as h:
            assert h.descriptor.offset == 4096 and h.descriptor.shape == (1024,)
            b = ig.ipc.open(h, stream=s2)
        assert b.owner == "compute" and ig.ipc.is_imported(b)
        assert isinstance(b.resource, ig.ipc.ImportedMemory)  # what it owns is its mapping
        assert np.array_equal(b.to_numpy(), pattern(4096)[1024:2048])
        sleep_on(s2, 0.05)
        b.fill_(5.0)                              # on s2, late
        assert np.all(b.to_numpy(stream=s1) == 5.0)  # s1 waits for s2's write (tracked)
        # Two mappings are two blocks: ordering between them is the program's, as across processes.
        ig.ipc.finish(b)
        assert np.all(view.to_numpy(stream=s1) == 5.0)
        c = b.clone()                             # from the current resource, not imported
        assert not ig.ipc.is_imported(c) and np.all(c.to_numpy() == 5.0)
        c.free()
        res = b.resource
        assert res.bytes_outstanding == mr.granularity
        v = b[:10]
        with pytest.raises(ig.MemoryContractViolation, match="view"):
            ig.ipc.close(b)
        del v
        ig.ipc.close(b)
        ig.ipc.close(b)  # idempotent
        assert res.bytes_outstanding == 0
        assert np.all(view.to_numpy() == 5.0)     # the exporter's memory is untouched
        del view
        a.free()
        assert mr.bytes_outstanding == 0
    finally:
        s1.close()
        s2.close()
    gc.collect()
    assert fd_count() == fds


def test_adaptors_and_seqpacket_sockets(dev, mr):
    stats = ig.StatisticsResource(ig.TrackingResource(mr))  # adaptors pass VmmResource blocks through
    a = ig.from_numpy(pattern(512), mr=stats)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        desc = ig.ipc.send(ours, a)
        assert desc.size == mr.granularity and desc.shape == (512,)
        b = ig.ipc.recv(theirs)
    assert np.array_equal(b.to_numpy(), pattern(512))
    ig.ipc.close(b)
    a.free()
    assert stats.bytes_outstanding == 0 and mr.bytes_outstanding == 0


def test_garbage_collection_unmaps(dev, mr):
    a = ig.from_numpy(pattern(256), mr=mr)
    with ig.ipc.export(a) as h:
        b = ig.ipc.open(h)
    res = b.resource
    assert res.bytes_outstanding == mr.granularity
    del b
    gc.collect()
    assert res.bytes_outstanding == 0
    a.free()


def test_imported_array_cannot_be_reexported(dev, mr):
    a = ig.from_numpy(pattern(16), mr=mr)
    with ig.ipc.export(a) as h:
        b = ig.ipc.open(h)
    with pytest.raises(ValueError, match="imported from another process"):
        ig.ipc.export(b)
    ig.ipc.close(b)
    a.free()


def test_open_after_the_exporter_freed_is_use_after_free(dev, mr):
    a = ig.from_numpy(pattern(16), mr=mr)
    h = ig.ipc.export(a)
    a.free()
    with h:
        with pytest.raises(ig.UseAfterFreeError, match="freed this memory"):
            ig.ipc.open(h)
        b = ig.ipc.open(h, check_live=False)  # the memory itself is still valid (the fd holds it)
        assert np.array_equal(b.to_numpy(), pattern(16))
        ig.ipc.close(b)


def test_handle_lifecycle_and_plain_pickle_refused(dev, mr):
    a = ig.from_numpy(pattern(16), mr=mr)
    h = ig.ipc.export(a)
    with pytest.raises(TypeError, match="multiprocessing"):
        pickle.dumps(h)
    fd = h.fd
    h.close()
    h.close()
    assert h.closed
    with pytest.raises(ig.ClosedError):
        ig.ipc.open(h)
    with pytest.raises(OSError):
        os.fstat(fd)  # really closed
    a.free()


# -- untrusted descriptors ---------------------------------------------------------------

def _desc(**change: Any) -> dict:
    d = {"version": 1, "size": 2 << 20, "offset": 0, "shape": [16], "dtype": "float32", "generation": 7,
         "device_uuid": "GPU-12345678-1234-1234-1234-123456789abc", "pid": 1234, "uid": os.geteuid(),
         "service": ""}
    d.update(change)
    return d


@pytest.mark.parametrize("change,match", [
    ({"size": 0}, "size"), ({"size": -1}, "size"), ({"size": "2097152"}, "size"), ({"size": True}, "size"),
    ({"offset": 2 << 20}, "offset"), ({"offset": 2}, "offset .* multiple"),
    ({"shape": [1 << 20]}, "runs past the end"), ({"shape": [1 << 19], "offset": 8}, "runs past the end"),
    ({"shape": [-1]}, "shape"), ({"shape": [0]}, "no elements"), ({"shape": "16"}, "shape"),
    ({"shape": [1] * 33}, "shape"), ({"dtype": "float128"}, "dtype"), ({"dtype": 3}, "dtype"),
    ({"device_uuid": "GPU-0"}, "device_uuid"), ({"generation": 0}, "generation"), ({"pid": 0}, "pid"),
    ({"service": "ignis-ipc/999/0123456789abcdef"}, "service"), ({"service": "/tmp/x"}, "service"),
    ({"version": 2}, "incompatible"), ({"extra": 1}, "unknown field"),
])
def test_forged_descriptors_are_rejected(change, match):
    with pytest.raises(ValueError, match=match):
        IpcDescriptor.parse(json.dumps(_desc(**change)).encode())


def test_truncated_and_garbage_descriptors_are_rejected():
    good = json.dumps(_desc()).encode()
    assert IpcDescriptor.parse(good).nbytes == 64
    for bad in (good[:-1], good[: len(good) // 2], b"", b"\xff\xfe", b"[1, 2]", b"null", b"{" * 100_000):
        with pytest.raises(ValueError, match="invalid IPC descriptor"):
            IpcDescriptor.parse(bad)
    missing = _desc()
    del missing["shape"]
    with pytest.raises(ValueError, match="lacks field"):
        IpcDescriptor.parse(missing)


def _forge(h: IpcHandle, **change: Any) -> IpcHandle:
    return IpcHandle(os.dup(h.fd), dataclasses.replace(h.descriptor, **change))


def test_open_refuses_forged_handles_and_leaks_nothing(dev, mr, backend):
    a = ig.from_numpy(pattern(1024), mr=mr)
    g = mr.granularity
    with ig.ipc.export(a) as h:
        b = ig.ipc.open(h)  # warm up anything made once per process
        ig.ipc.close(b)
        fds, free = fd_count(), backend.mem_get_info(0)[0]
        cases = [
            (dict(size=4 * g, shape=(4 * g // 4,)), ValueError, "smaller than"),
            (dict(size=g + 4096), ValueError, "granularity"),
            (dict(device_uuid="GPU-00000000-0000-0000-0000-000000000000"), ValueError, "no local device"),
            (dict(uid=os.geteuid() + 1), PermissionError, "allow_other_users"),
        ]
        for change, exc, match in cases:
            with _forge(h, **change) as forged, pytest.raises(exc, match=match):
                ig.ipc.open(forged)
        with tempfile.TemporaryFile() as f:  # an fd that is not exported device memory
            f.truncate(g)
            with IpcHandle(os.dup(f.fileno()), h.descriptor) as forged, \
                    pytest.raises(ValueError, match="not device memory"):
                ig.ipc.open(forged)
        r, w = os.pipe()
        with IpcHandle(r, h.descriptor) as forged, pytest.raises(ValueError, match="not device memory"):
            ig.ipc.open(forged)
        os.close(w)
        with _forge(h, uid=os.geteuid() + 1) as other:  # another user's handle, explicitly allowed
            b = ig.ipc.open(other, allow_other_users=True)
            ig.ipc.close(b)
        assert fd_count() == fds
        if backend.name == "emulated":
            assert backend.mem_get_info(0)[0] == free
    a.free()


def test_open_checks_the_descriptor_before_any_driver_call(dev, mr, backend, monkeypatch):
    """A size no device has (2**40), fields forged after parsing and an fd closed behind the
    handle's back are ValueError, found before the driver is asked anything."""
    a = ig.from_numpy(pattern(16), mr=mr)
    g = mr.granularity
    calls: list[str] = []
    for name in ("vmm_import_fd", "vmm_reserve", "vmm_map", "vmm_set_access", "vmm_release", "vmm_unmap"):
        orig = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *args, _n=name, _o=orig: (calls.append(_n), _o(*args))[1])
    with ig.ipc.export(a) as h:
        fds, free = fd_count(), backend.mem_get_info(0)[0]
        too_big = (dev.total_memory // g + 1) * g
        cases = [
            (dict(size=2 ** 40), "more than the"),
            (dict(size=too_big), "more than the"),
            (dict(size=2 ** 51), "size must be an int"),
            (dict(size=-g), "size must be an int"),
            (dict(size=float(g)), "size must be an int"),
            (dict(shape=(-1,)), "shape"),
            (dict(shape=(g,)), "runs past the end"),
            (dict(dtype="complex256"), "dtype"),
            (dict(offset=-4), "offset"),
            (dict(device_uuid=None), "device_uuid"),
            (dict(version=0), "incompatible"),
        ]
        for change, match in cases:
            with _forge(h, **change) as forged, pytest.raises(ValueError, match=match):
                ig.ipc.open(forged)
        closed = IpcHandle(os.dup(h.fd), h.descriptor)
        os.close(closed.fd)  # closed behind the handle's back
        with pytest.raises(ValueError, match="not open"):
            ig.ipc.open(closed)
        closed.detach()
        assert calls == [], f"the driver was asked first: {calls}"
        assert fd_count() == fds
        if backend.name == "emulated":
            assert backend.mem_get_info(0)[0] == free
    a.free()


@pytest.mark.parametrize("op", ["vmm_import_fd", "vmm_reserve", "vmm_map", "vmm_set_access"])
def test_open_failure_leaves_nothing_behind(dev, mr, backend, op):
    a = ig.from_numpy(pattern(16), mr=mr)
    with ig.ipc.export(a) as h:
        ig.ipc.close(ig.ipc.open(h))
        fds = fd_count()
        backend.inject_fault(op, error="CUDA_ERROR_OUT_OF_MEMORY")
        with pytest.raises(ig.DriverError, match="injected fault"):
            ig.ipc.open(h)
        assert fd_count() == fds
        b = ig.ipc.open(h)
        assert b.resource.bytes_outstanding == mr.granularity
        ig.ipc.close(b)
    a.free()


@pytest.mark.parametrize("op", ["stream_synchronize", "vmm_unmap", "vmm_free_address"])
def test_a_refused_unmap_of_an_import_can_be_finished(dev, mr, backend, op):
    a = ig.from_numpy(pattern(1024), mr=mr)
    with ig.ipc.export(a) as h:
        b = ig.ipc.open(h)
        res = b.resource
        free = backend.mem_get_info(0)[0]
        backend.inject_fault(op, error="CUDA_ERROR_INVALID_VALUE")
        with pytest.raises(ig.DriverError, match="injected fault"):
            ig.ipc.close(b)
        backend.clear_faults()
        assert res.bytes_outstanding == mr.granularity, "a refused unmap changed the count"
        if op == "vmm_free_address":  # unmapped already: unusable, but still to be finished
            with pytest.raises(ig.UseAfterFreeError):
                b.to_numpy()
        else:  # still mapped: the bytes are there
            assert np.array_equal(b.to_numpy(), pattern(1024))
        ig.ipc.close(b)  # the retry finishes it
        assert res.bytes_outstanding == 0
        if backend.name == "emulated":
            assert backend.mem_get_info(0)[0] == free
    a.free()


# -- the wire: bad messages over a socket -------------------------------------------------------

def test_bad_messages_are_refused_and_their_fds_closed(dev, mr):
    a = ig.from_numpy(pattern(16), mr=mr)
    body = ig.ipc.export(a)
    desc = body.descriptor.to_bytes()
    body.close()
    head = struct.pack("<4sI", MAGIC, len(desc))
    fds = fd_count()
    cases = [
        (b"XXXX" + head[4:] + desc, 1, ValueError, "not an Ignis IPC message"),
        (struct.pack("<4sI", MAGIC, 1 << 30), 1, ValueError, "limit"),
        (head + desc, 0, ValueError, "exactly one file descriptor"),
        (head + desc, 2, ValueError, "exactly one file descriptor"),
        (head + desc[:-3] + b"}}}", 1, ValueError, "invalid IPC descriptor"),
        (head + desc[:10], 1, EOFError, "in the middle"),
        (head[:5], 1, EOFError, "in the middle"),
        (b"", 0, EOFError, "no IPC message"),
    ]
    for msg, nfds, exc, match in cases:
        ours, theirs = socket.socketpair()
        extra = [os.open("/dev/null", os.O_RDONLY) for _ in range(nfds)]
        if msg or extra:
            socket.send_fds(theirs, [msg or b"\0"], extra)
        for fd in extra:
            os.close(fd)
        theirs.close()
        with pytest.raises(exc, match=match):
            ig.ipc.recv(ours)
        ours.close()
        assert fd_count() == fds, (msg, nfds)
    with pytest.raises(ValueError, match="AF_UNIX"):
        ig.ipc.recv(socket.socket(socket.AF_INET))
    a.free()


# -- across processes -----------------------------------------------------------------------------

def _peer_read_write(sock: socket.socket, n: int, order: str) -> None:
    b = ig.ipc.recv(sock)
    say(sock, {"ok": bool(np.array_equal(b.to_numpy(), pattern(n)))})
    b[: n // 2].fill_(-1.0)
    ig.ipc.finish(b)
    say(sock, {"wrote": True})
    hear(sock)  # the exporter wrote its second half
    got = b.to_numpy()
    say(sock, {"ok": bool(np.all(got[: n // 2] == -1.0) and np.all(got[n // 2:] == 9.0))})
    if order == "importer_first":
        ig.ipc.close(b)
        say(sock, {"closed": True})
    else:
        hear(sock)  # the exporter freed its array; our mapping must still be good
        ok = bool(np.all(b.to_numpy()[n // 2:] == 9.0))
        b.fill_(3.0)
        ok = ok and bool(np.all(b.to_numpy() == 3.0))
        ig.ipc.close(b)
        say(sock, {"ok": ok, "mapped": b.resource.bytes_outstanding})


@pytest.mark.parametrize("order", ["importer_first", "exporter_first"])
def test_two_processes_read_and_write_and_close_in_either_order(dev, mr, order):
    n = 1 << 20
    a = ig.from_numpy(pattern(n), mr=mr)
    peer = Peer("_peer_read_write", n, order)
    try:
        ig.ipc.send(peer.sock, a)
        assert hear(peer.sock)["ok"], "the importer did not read the exporter's bytes"
        hear(peer.sock)
        assert np.all(a[: n // 2].to_numpy() == -1.0), "the exporter does not see the importer's write"
        a[n // 2:].fill_(9.0)
        ig.ipc.finish(a)
        say(peer.sock, {"go": True})
        assert hear(peer.sock)["ok"], "the importer does not see the exporter's second write"
        if order == "importer_first":
            hear(peer.sock)
            a.free()
        else:
            a.free()
            say(peer.sock, {"freed": True})
            reply = hear(peer.sock)
            assert reply["ok"] and reply["mapped"] == 0
        assert mr.bytes_outstanding == 0
    finally:
        assert peer.join() == 0


def _peer_export_and_exit(sock: socket.socket, n: int) -> None:
    mr = ig.VmmResource(0)
    keep = [ig.from_numpy(pattern(n, seed), mr=mr) for seed in (1, 2)]
    for a in keep:
        ig.ipc.send(sock, a)
    hear(sock)  # the importer has both handles; exit without freeing anything
    os._exit(0)  # no cleanup at all, as if it crashed


def test_exporter_exit_while_the_importer_holds_the_mapping(dev):
    n = 1 << 18
    peer = Peer("_peer_export_and_exit", n)
    first = ig.ipc.recv(peer.sock)                  # mapped while the exporter lives
    second = ig.ipc.recv_handle(peer.sock)          # mapped after it is gone
    say(peer.sock, {"bye": True})
    assert peer.join() == 0
    assert np.array_equal(first.to_numpy(), pattern(n, 1))
    first.fill_(4.0)
    assert np.all(first.to_numpy() == 4.0)
    with second:
        late = ig.ipc.open(second)  # no exporter to ask: opened as it was left
    assert np.array_equal(late.to_numpy(), pattern(n, 2))
    ig.ipc.close(first)
    ig.ipc.close(late)


def _peer_round_trips(sock: socket.socket, rounds: int) -> None:
    counts = []
    for i in range(rounds + 1):
        if i == 1 or i == rounds:
            counts.append(fd_count())
        b = ig.ipc.recv(sock)
        v = float(b[:1].to_numpy()[0])
        ig.ipc.close(b)
        sock.sendall(struct.pack("<f", v))
    mapped = ig.ipc.ImportedMemory.of(ig.Device(0)).bytes_outstanding
    say(sock, {"fds": counts + [fd_count()], "mapped": mapped})


def test_a_thousand_round_trips_leak_no_fd(dev, mr):
    rounds = 1000
    a = ig.from_numpy(pattern(1024), mr=mr)
    peer = Peer("_peer_round_trips", rounds)
    try:
        fds = None
        for i in range(rounds + 1):
            if i == 1:
                fds = fd_count()
            a[:1].fill_(float(i))
            ig.ipc.send(peer.sock, a)
            got = struct.unpack("<f", peer.sock.recv(4, socket.MSG_WAITALL))[0]
            assert got == float(i), f"round {i}: the importer read {got}"
        report = hear(peer.sock)
        # Garbage of earlier tests may close an fd meanwhile, never open one: a leak would add ~1000.
        assert fd_count() <= fds, "the exporter leaked file descriptors"
        first, *later = report["fds"]
        assert max(later) <= first, f"the importer leaked file descriptors: counts {report['fds']}"
        assert report["mapped"] == 0
    finally:
        assert peer.join() == 0
        a.free()


def _peer_multiprocessing(sock: socket.socket, freed: IpcHandle, live: IpcHandle, q: Any, n: int) -> None:
    out: dict[str, Any] = {}
    with freed:
        try:
            ig.ipc.open(freed)
            out["freed"] = "opened"
        except ig.UseAfterFreeError as e:
            out["freed"] = str(e)
    with live:
        b = ig.ipc.open(live)
        out["live"] = bool(np.array_equal(b.to_numpy(), pattern(n, 5)))
        ig.ipc.close(b)
    with q.get(timeout=WAIT_S) as h:
        b = ig.ipc.open(h)
        out["queued"] = bool(np.array_equal(b.to_numpy(), pattern(n, 6)))
        ig.ipc.close(b)
    say(sock, out)


def test_handles_travel_as_process_arguments_and_through_queues(dev, mr):
    n = 4096
    gone = ig.from_numpy(pattern(n, 4), mr=mr)
    freed = ig.ipc.export(gone)
    gone.free()
    a = ig.from_numpy(pattern(n, 5), mr=mr)
    c = ig.from_numpy(pattern(n, 6), mr=mr)
    q = CTX.Queue()
    with freed, ig.ipc.export(a) as live:
        peer = Peer("_peer_multiprocessing", freed, live, q, n)
    q.put(ig.ipc.export(c))  # not closed: the queue pickles it later; garbage collection closes it
    try:
        out = hear(peer.sock)
        assert "freed this memory" in out["freed"]
        assert out["live"] and out["queued"]
    finally:
        assert peer.join() == 0
        a.free()
        c.free()
        q.close()


def _peer_other_user(sock: socket.socket, address: str, n: int) -> None:
    # Everything that reads files (imports, the device) happens first: the
    # Python installation may not be readable by the other user.
    a = ig.from_numpy(pattern(n, 8), mr=ig.VmmResource(0))
    ig.ipc.export(a).close()
    os.setgid(65534)
    os.setuid(65534)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)  # the credentials the test sees are the ones of this moment: uid 65534
    try:
        ig.ipc.send(conn, a)
    except Exception as e:  # e.g. no access to the GPU as that user
        say(sock, {"skip": f"{type(e).__name__}: {e}"})
        return
    say(sock, {"sent": True})
    hear(sock)
    conn.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a peer as another user")
def test_a_peer_of_another_uid_is_refused(dev):
    n = 4096
    address = f"\0ignis-test-{os.getpid()}-{secrets.token_hex(4)}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)
    server.settimeout(WAIT_S)
    peer = Peer("_peer_other_user", address, n)
    try:
        conn, _ = server.accept()
        conn.settimeout(WAIT_S)
        reply = hear(peer.sock)
        if "skip" in reply:
            pytest.skip(f"the peer could not export as uid 65534: {reply['skip']}")
        assert ig.ipc.peer_credentials(conn)[1] == 65534
        fds = fd_count()
        with pytest.raises(PermissionError, match="uid 65534"):
            ig.ipc.recv(conn)
        assert fd_count() == fds  # nothing was even read
        b = ig.ipc.recv(conn, allow_other_users=True)  # the same message, accepted on purpose
        assert np.array_equal(b.to_numpy(), pattern(n, 8))
        ig.ipc.close(b)
        conn.close()
        say(peer.sock, {"done": True})
    finally:
        server.close()
        assert peer.join() == 0


# -- the demo and the GPU ----------------------------------------------------------------------

def test_demo_runs():
    import io as _io

    out = _io.StringIO()
    assert ig.ipc.demo(out, nbytes=4 << 20) == 0, out.getvalue()
    assert "passed" in out.getvalue()


@pytest.mark.gpu
def test_cuda_granularity_and_mapping_are_real(dev, mr):
    assert dev.backend.name == "cuda"
    assert mr.granularity == dev.backend.vmm_granularity(0) >= 2 << 20
    a = ig.from_numpy(pattern(1 << 20), mr=mr)
    with ig.ipc.export(a) as h:
        b = ig.ipc.open(h)
    assert b.device_ptr != a.device_ptr  # a second mapping of the same memory
    b.fill_(1.5)
    assert np.all(a.to_numpy() == 1.5)
    ig.ipc.close(b)
    a.free()
