"""Where memory leaves Ignis's hands: DLPack exports, implicit conversions, interrupted
host copies, read-only producers, ownership through views, refused frees, pickling
(issue 14, part A and C). Each test runs on the active backend: on the emulator the
DLPack consumer is NumPy, on a GPU it is PyTorch or CuPy (tests/test_interop_gpu.py)."""

from __future__ import annotations

import copy
import gc
import mmap
import pickle
import tempfile

import numpy as np
import pytest

import ignis as ig
from ignis.array import hostcopy
from ignis.backends import get_backend
from helpers import sleep_on

EMULATED = get_backend().name == "emulated"


def _consume(a):
    """What a consumer library makes of ``a`` through DLPack (zero-copy)."""
    if EMULATED:
        return np.from_dlpack(a)
    torch = pytest.importorskip("torch", reason="the DLPack consumer on a GPU is PyTorch")
    return torch.from_dlpack(a)


def _write_through(t, value) -> None:
    if EMULATED:
        t[...] = value
    else:
        t.fill_(value)
        import torch
        torch.cuda.synchronize()


# -- A1: DLPack exports are counted ---------------------------------------------------------

def test_free_refused_while_a_dlpack_export_is_alive_and_names_it():
    a = ig.full(256, 1.0)
    n = _consume(a)
    with pytest.raises(ig.MemoryContractViolation, match=rf"NvArray#{a.id}: 1 DLPack export.*exported from "
                       rf"NvArray#{a.id}.*Drop what the consumer imported"):
        a.free()
    assert not a.freed
    # The block was not handed out again: a new array of the same size is elsewhere.
    b = ig.full(256, 2.0)
    assert b.device_ptr != a.device_ptr
    _write_through(n, 5.0)
    assert (b.to_numpy() == 2.0).all() and (a.to_numpy() == 5.0).all()
    del n
    gc.collect()
    a.free()  # the consumer let go: free works
    b.free()


def test_dropped_array_keeps_its_memory_until_the_consumer_lets_go():
    mr = ig.get_current_resource(ig.Device(0))
    start = mr.bytes_outstanding
    a = ig.full(1024, 3.0)
    ptr = a.device_ptr
    n = _consume(a)
    del a
    gc.collect()
    others = [ig.full(1024, 9.0) for _ in range(8)]  # same size class: the pool would reuse the block
    assert all(o.device_ptr != ptr for o in others)
    _write_through(n, 4.0)
    assert all((o.to_numpy() == 9.0).all() for o in others)
    for x in others:
        x.free()
    del n
    gc.collect()
    assert mr.bytes_outstanding == start  # the block went back


def test_export_of_a_view_holds_the_root():
    a = ig.full((4, 64), 1.0)
    v = a[1]
    n = _consume(v)
    del v
    gc.collect()
    with pytest.raises(ig.MemoryContractViolation, match="DLPack export"):
        a.free()
    del n
    gc.collect()
    a.free()


def test_unconsumed_capsule_does_not_hold_the_array():
    a = ig.full(64, 1.0)
    cap = a.__dlpack__(**({} if EMULATED else {"stream": None}))
    with pytest.raises(ig.MemoryContractViolation, match="DLPack export"):
        a.free()
    del cap
    gc.collect()
    a.free()


def test_many_exports_are_counted_and_forgotten():
    a = ig.full(64, 1.0)
    held = [_consume(a) for _ in range(100)]
    del held[:99]
    gc.collect()
    with pytest.raises(ig.MemoryContractViolation, match="1 DLPack export"):
        a.free()
    del held
    gc.collect()
    a.free()


# -- A2: implicit host conversion is refused -----------------------------------------------

def test_numpy_asarray_is_refused_and_names_to_numpy():
    a = ig.full((3, 2), 1.0)
    with pytest.raises(TypeError, match=r"to_numpy\(\)"):
        np.asarray(a)
    with pytest.raises(TypeError, match=r"to_numpy\(\)"):
        np.array(a)
    a.free()  # nothing was left holding views of it


# -- A3: an interrupted device-to-host copy never frees the buffer the copy writes ---------

@pytest.mark.parametrize("nbytes", [64 << 10, 4 << 20], ids=["pageable", "pinned"])
def test_failed_wait_in_to_numpy_keeps_the_destination_until_the_copy_is_done(backend, nbytes):
    a = ig.full(nbytes // 4, 7.0)
    s = a.stream
    sleep_on(s, 0.3)  # the copy is queued behind this
    backend.inject_fault("stream_synchronize", 1)
    with pytest.raises(ig.DriverError):
        a.to_numpy()
    backend.clear_faults()
    # Fresh host memory of that size, where the destination would have been handed out again.
    fresh = [np.zeros(nbytes // 4, np.float32) for _ in range(6)]
    bufs = [hostcopy.pinned_pool().allocate(nbytes) for _ in range(3)]
    for b in bufs:
        b.array[:] = 0
    s.synchronize()
    assert all(not f.any() for f in fresh), "a queued copy wrote into memory handed out again"
    assert all(not b.array.any() for b in bufs), "a queued copy wrote into a reused pinned buffer"
    for b in bufs:
        b.release()
    assert (a.to_numpy() == 7.0).all()
    a.free()


def test_keep_until_done_releases_after_the_stream_gets_there():
    s = ig.Device(0).default_stream
    released = []
    sleep_on(s, 0.2)
    hostcopy.keep_until_done(s, object(), lambda: released.append(1))
    assert released == []
    s.synchronize()
    assert released == [1]


# -- A4: read-only producers stay read-only --------------------------------------------------

def _readonly_sources():
    data = np.arange(16, dtype=np.float32)
    ro = data.copy()
    ro.flags.writeable = False
    yield "non-writeable array", ro
    yield "bytes", np.frombuffer(data.tobytes(), np.float32)
    f = tempfile.TemporaryFile()
    f.write(data.tobytes())
    f.flush()
    m = mmap.mmap(f.fileno(), data.nbytes, prot=mmap.PROT_READ)
    yield "PROT_READ mapping", np.frombuffer(m, np.float32)


@pytest.mark.skipif(not EMULATED, reason="the emulator adopts host memory; on a GPU see test_interop_gpu")
@pytest.mark.parametrize("name", ["non-writeable array", "bytes", "PROT_READ mapping"])
def test_read_only_import_refuses_every_write(name):
    src = dict(_readonly_sources())[name]
    a = ig.from_dlpack(src)
    assert a.readonly and a[2:4].readonly
    assert (a.to_numpy() == np.arange(16)).all()  # reads work
    with a.use(access="read") as ptr:
        assert ptr == a.device_ptr
    writes = [lambda: a.fill_(1.0), lambda: a.zero_(), lambda: a.from_host(np.zeros(16, np.float32)),
              lambda: a.copy_(ig.zeros(16)), lambda: a[2:4].fill_(0.0), lambda: a.use().__enter__(),
              lambda: ig.kernels.fill(a, 1.0)]
    for w in writes:
        with pytest.raises(ig.ReadOnlyError, match="read-only"):
            w()
    assert (src == np.arange(16)).all()
    c = a.clone()  # a writable copy
    assert not c.readonly and c.fill_(2.0).to_numpy()[0] == 2.0
    back = np.from_dlpack(a)  # re-exported with DLPack's read-only flag
    assert not back.flags.writeable and (back == np.arange(16)).all()
    with pytest.raises(BufferError, match="read-only"):
        a.__dlpack__()  # a legacy capsule cannot say read-only
    c.free()


# -- A6: a view's ownership is its root's --------------------------------------------------

def test_view_cannot_be_acquired_while_its_root_is_held():
    a = ig.zeros((4, 8))
    v = a[1]
    ig.contract.acquire(a, "io")
    assert v.owner == "io"
    with pytest.raises(ig.MemoryContractViolation, match="held by 'io'"):
        ig.contract.acquire(v, "collective")
    with pytest.raises(ig.MemoryContractViolation, match="owned by 'io'"):
        ig.contract.release(v, "collective")
    ig.contract.release(v, "io")  # the holder may release through a view
    assert a.owner == v.owner == "compute"
    ig.contract.acquire(v, "collective")  # acquiring a view acquires its root
    assert a.owner == "collective" and a[2].owner == "collective"
    with pytest.raises(ig.MemoryContractViolation, match="held by 'collective'"):
        ig.contract.acquire(a, "io")
    ig.contract.release(a, "collective")
    del v
    a.free()


# -- B9, B10: partial writes --------------------------------------------------------------------

@pytest.mark.parametrize("value", [[1, 2], [1, 2, 3, 4, 5], np.ones(3), (1.0,)])
def test_fill_with_a_sequence_is_refused_and_writes_nothing(value):
    a = ig.full(3, 7.0)
    with pytest.raises(TypeError, match="one scalar value"):
        a.fill_(value)
    assert a.to_numpy().tolist() == [7.0, 7.0, 7.0]
    a.fill_(np.float32(2.5))
    assert a.to_numpy().tolist() == [2.5] * 3
    a.free()


def test_write_rows_checks_the_row_shape():
    cache = ig.zeros((6, 8))
    with pytest.raises(ValueError, match=r"source of shape \(2, 4\) is not rows of shape \(8,\)"):
        cache.write_rows(ig.full((2, 4), 1.0), 0)
    with pytest.raises(ValueError, match="dtype"):
        cache.write_rows(ig.full((1, 8), 1, "int32"), 0)
    assert not cache.to_numpy().any()
    cache.write_rows(ig.full((2, 8), 1.0), 1)
    assert cache.to_numpy()[1:3].all() and not cache.to_numpy()[3:].any()
    cache.free()


# -- C13: a refused free leaves the array live ------------------------------------------------

def test_refused_free_can_be_retried(backend):
    mr = ig.DirectResource(ig.Device(0))
    a = ig.full(1024, 1.0, mr=mr)
    backend.inject_fault("mem_free", 1)
    with pytest.raises(ig.DriverError):
        a.free()
    assert not a.freed and (a.to_numpy() == 1.0).all()
    assert mr.bytes_outstanding >= a.nbytes
    a.free()
    assert a.freed and mr.bytes_outstanding == 0


# -- C15: pickling and copying say how to share or copy ----------------------------------------

@pytest.mark.parametrize("how", [pickle.dumps, copy.deepcopy, copy.copy])
def test_pickle_and_copy_say_what_to_do(how):
    a = ig.zeros(4)
    with pytest.raises(TypeError, match=r"ignis\.ipc.*clone\(\).*to_numpy\(\)"):
        how(a)
    a.free()
