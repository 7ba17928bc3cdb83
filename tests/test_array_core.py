"""The compiled array type (``NvArray`` in ignis/array/nvarray.pyx): ``ig.empty``, the
constructor, ``free`` and collection are one compiled implementation; they make the same
arrays and errors through every entry, leak no references, run no Python code in the
common case, honour a resource's own (or replaced) allocate / deallocate, and wait for a
busy stripe lock."""

from __future__ import annotations

import gc
import inspect
import re
import sys
import threading

import numpy as np
import pytest

import ignis as ig
from helpers import current_resource, python_calls, run_threads
from ignis import dtypes as D
from ignis.array import nvarray as _nv
from ignis.memory import DeviceMemoryResource


def test_the_array_type_is_compiled():
    assert _nv.__file__.endswith((".so", ".pyd")), _nv.__file__
    assert ig.empty is _nv.empty and ig.NvArray is _nv.NvArray
    assert not hasattr(_nv.NvArray, "__slots__")  # an extension type: its fields are declared in nvarray.pxd
    assert list(inspect.signature(ig.NvArray.free).parameters) == ["self", "by"]


def _observe(a: ig.NvArray) -> tuple:
    return (type(a).__name__, a.shape, a.dtype, a.numel, a.nbytes, a.owner, a.ref_count, a.freed, a.is_view,
            a.device_id, a.stream is ig.Device(0).default_stream, a.device_ptr != 0 or a.nbytes == 0,
            a.resource is ig.get_current_resource(ig.Device(0)))


def _error(fn) -> tuple:
    """The error ``fn`` raises, with array ids, generations and addresses masked."""
    with pytest.raises(Exception) as ei:
        fn()
    return type(ei.value).__name__, re.sub(r"(#|generation[ =]|0x)[0-9a-f]+", r"\1N", str(ei.value))


def _script(dev, make) -> list:
    """A fixed sequence of constructions, frees and misuse; returns what a caller can observe."""
    seen: list = []
    mr = ig.get_current_resource(dev)
    start = mr.bytes_outstanding
    for shape, dt in [(64, "float32"), ((2, 3), D.bfloat16), ((), "int8"), (0, "float64"), ((4, 0, 2), "uint8"),
                      (1 << 20, D.float16), (np.int64(5), "float32"), ([2, 2], "int32"), (3, np.float32),
                      ((True, 2), "uint8")]:
        a = make(shape, dt)
        seen.append(_observe(a))
        a.free()
        seen.append(a.freed)
    for shape, dt in [(-1, "float32"), ((2, -3), "float32"), ("x", "float32"), ((1.5,), "float32"),
                      (4, "float128"), (4, 7)]:
        seen.append(_error(lambda: make(shape, dt)))
    seen.append(_observe(make(8, "float32", stream=dev.default_stream, tag="kw")))
    a = ig.empty(100)
    a.free()
    seen.append(_error(a.free))  # DoubleFreeError
    seen.append(_error(lambda: a.to_numpy()))  # UseAfterFreeError
    b = ig.empty(100)
    b.incref()
    seen.append(_error(b.free))
    b.decref()
    b.transfer_ownership("io")
    seen.append(_error(b.free))  # owned by io
    seen.append(_error(lambda: b.free(by="compute")))
    b.free(by="io")
    seen.append((b.freed, b.owner))
    c = ig.empty((4, 8))
    v = c[1:3]
    seen.append(_error(c.free))  # a live view
    v.free()
    seen.append((v.freed, c.freed))
    c.free()
    d = ig.empty(16, "uint8")
    d.pin()
    d.free()
    seen.append((d.freed, d.pinned_host is None))
    e = ig.empty(16, "uint8")
    seen.append(_error(lambda: e.free("nobody")))
    seen.append(_error(lambda: e.free("compute", 1)))
    e.free(by="compute")
    dev.synchronize()
    seen.append(mr.bytes_outstanding - start)
    return seen


def test_empty_and_the_constructor_agree(dev):
    a = _script(dev, ig.empty)
    b = _script(dev, ig.NvArray)
    assert a == b
    assert a[-1] == 0  # nothing left allocated
    assert a[0] == ("NvArray", (64,), D.float32, 64, 256, "compute", 0, False, False, 0, True, True, True)
    assert ("ValueError", "shape must be a sequence of non-negative ints, got 'x'") in a
    assert sum(1 for x in a if isinstance(x, tuple) and x and x[0] == "DoubleFreeError") == 1


def test_a_resource_other_than_a_pool_runs_its_own_methods(dev):
    mr = ig.DirectResource(dev)
    with current_resource(mr, dev):
        a = ig.empty(1000, "float32")
        assert a.resource is mr and mr.bytes_outstanding >= 4000
        a.free()
        b = ig.empty(1000)
        del b
        gc.collect()
    assert mr.bytes_outstanding == 0


def test_a_pools_methods_replaced_on_the_instance_or_a_subclass_are_called(dev, monkeypatch):
    # The compiled path calls a PoolResource's compiled allocate / deallocate directly only
    # where they are its own: an instance attribute or a subclass's override is honoured.
    calls: list = []
    pool = ig.PoolResource(ig.AsyncResource(dev))
    alloc, dealloc = pool.allocate, pool.deallocate
    monkeypatch.setattr(pool, "allocate", lambda n, s, t: calls.append("a") or alloc(n, s, t), raising=False)
    monkeypatch.setattr(pool, "deallocate", lambda b: calls.append("d") or dealloc(b), raising=False)
    with current_resource(pool, dev):
        ig.empty(64).free()
        x = ig.empty(64)
        del x
    assert calls == ["a", "d", "a", "d"]

    class Counting(ig.PoolResource):
        def allocate(self, nbytes, stream=None, tag="untagged"):
            calls.append("A")
            return super().allocate(nbytes, stream, tag)

        def deallocate(self, block):
            calls.append("D")
            return super().deallocate(block)

    sub = Counting(ig.AsyncResource(dev))
    with current_resource(sub, dev):
        ig.empty(64).free()
    assert calls[-2:] == ["A", "D"] and sub.bytes_outstanding == 0
    sub.close()
    pool.close()


def test_empty_and_free_run_no_python(dev):
    ig.empty(64).free()  # the defaults cache
    e = ig.empty

    def pairs():
        for _ in range(50):
            e(64, "float32").free()
            e((8, 8), D.float16).free(by="compute")
            e(0)
            x = e(256)
            del x
            with x2.use():
                pass

    x2 = e(16)
    pairs()  # the pool's cache: a miss runs the pool's Python path
    assert python_calls(pairs) == 0


class _Failing(DeviceMemoryResource):
    """A resource whose allocate fails the way an exhausted device does."""

    def __init__(self, dev):
        super().__init__(dev)
        self.calls = 0

    def allocate(self, nbytes, stream=None, tag=None):
        self.calls += 1
        raise ig.OutOfMemoryError(nbytes, detail="the test's resource is full")

    def deallocate(self, block):  # pragma: no cover - nothing is ever allocated
        raise AssertionError("nothing to give back")


def test_a_failed_allocation_leaves_no_array_behind(dev):
    mr = _Failing(dev)
    with current_resource(mr, dev):
        gc.collect()
        before = sum(1 for o in gc.get_objects() if type(o) is ig.NvArray)
        for make in (ig.empty, ig.NvArray):
            with pytest.raises(ig.OutOfMemoryError, match=r"\(400 bytes\).*the test's resource is full"):
                make(100)
        gc.collect()
        assert sum(1 for o in gc.get_objects() if type(o) is ig.NvArray) == before
        assert mr.calls == 2


def test_no_references_leak(dev):
    mr = ig.get_current_resource(dev)
    s = dev.default_stream
    shape = (16, 16)
    for _ in range(100):
        ig.empty(shape, "float32").free()
    gc.collect()

    def counts():
        return (sys.getrefcount(s), sys.getrefcount(shape), sys.getrefcount(D.float32), sys.getrefcount(dev),
                sys.getrefcount(mr), mr.bytes_outstanding, sum(1 for o in gc.get_objects() if type(o) is ig.NvArray))

    before = counts()
    for _ in range(5000):
        ig.empty(shape, "float32").free()
        x = ig.empty(shape, D.float32)
        del x
        ig.empty(0)
    gc.collect()
    assert counts() == before


def test_dropped_arrays_return_their_memory(dev):
    mr = ig.get_current_resource(dev)
    dev.synchronize()
    start = mr.bytes_outstanding
    xs = [ig.empty(1000) for _ in range(10)]
    assert mr.bytes_outstanding > start
    views = [x[1:3] for x in xs]
    del xs
    assert mr.bytes_outstanding > start  # the views keep their parents alive
    del views
    assert mr.bytes_outstanding == start


def test_arrays_in_reference_cycles_are_returned_later(dev):
    mr = ig.get_current_resource(dev)
    start = mr.bytes_outstanding
    a = ig.empty(1000)
    a.cycle = [a]  # only the cyclic collector can find it
    del a
    gc.collect()
    ig.empty(4).free()  # the next array operation returns what the collector found
    assert mr.bytes_outstanding == start and not _nv._deferred


def test_track_all_takes_the_python_path(dev):
    ig.contract.track_all = True
    try:
        a = ig.empty(32)
        assert ig.contract.tracked_count >= 1 and any(r["id"] == a.id for r in ig.contract.audit(older_than=0))
        a.free()
    finally:
        ig.contract.track_all = False
        ig.contract.reset()


def test_a_busy_stripe_lock_makes_free_wait(dev):
    a = ig.empty(64)
    lock = _nv._LOCKS[a.id & 63]
    done = []
    lock.acquire()
    t = threading.Thread(target=lambda: (a.free(), done.append(a.freed)))
    t.start()
    t.join(0.2)
    assert t.is_alive() and not done and not a.freed  # waiting for the lock, not racing past it
    lock.release()
    t.join(5)
    assert done == [True]


def test_many_threads_free_and_count_references(dev):
    mr = ig.get_current_resource(dev)
    dev.synchronize()
    start = mr.bytes_outstanding
    errors: list = []
    shared = [ig.empty(32) for _ in range(64)]
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for k in range(300):
                ig.empty(16 + i).free()
                x = shared[(i * 7 + k) % 64]
                try:
                    x.incref()
                except ig.UseAfterFreeError:
                    continue
                x.decref()
            for x in shared[i::8]:
                x.free()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    run_threads(work, 8, 60)
    assert not errors and all(x.freed and x.ref_count == 0 for x in shared)
    dev.synchronize()
    assert mr.bytes_outstanding == start


class _Strict(DeviceMemoryResource):
    """A resource that needs every argument the constructor passes, and returns
    something from deallocate (free() still returns None)."""

    def __init__(self, dev):
        super().__init__(dev)
        self.inner = ig.DirectResource(dev)
        self.tags: list = []

    def allocate(self, nbytes, stream, tag):
        self.tags.append(tag)
        return self.inner.allocate(nbytes, stream, tag)

    def deallocate(self, block):
        self.inner.deallocate(block)
        return "given back"


def test_a_resource_gets_the_constructors_arguments(dev):
    mr = _Strict(dev)
    with current_resource(mr, dev):
        for _ in range(3):
            a = ig.empty(64)
            assert a.free() is None
        x = ig.empty(8)
        del x
    assert mr.tags == ["untagged"] * 4 and mr.inner.bytes_outstanding == 0


def test_a_subclass_is_made_by_its_constructor(dev):
    class Tagged(ig.NvArray):
        def label(self):
            return f"tagged #{self.id}"

    a = Tagged(16, "int32")
    assert type(a) is Tagged and a.nbytes == 64 and a.label().startswith("tagged #")
    a.extra = 1  # arrays keep an instance dict
    a.free()
    assert a.freed and type(ig.empty(4)) is ig.NvArray


def test_an_arrays_private_state_is_read_only_from_python(dev):
    # NvArray's own compiled code is the one writer of its pointer, block, resource, lifecycle,
    # views, gate and exports; Python code (a subsystem, a user) reads them at most.
    a = ig.empty(16, dtype="float32")
    for name in ("_ptr", "_block", "_mr", "_tracks", "_freed", "_base", "_views", "_pinned", "_keepalive",
                 "_gate", "_exports"):
        getattr(a, name)
        with pytest.raises(AttributeError):
            setattr(a, name, None)
    a.mark_read_only("a test says so")  # the array's own code still sets its gate
    with pytest.raises(ig.ReadOnlyError, match="a test says so"):
        a.fill_(1.0)
    a.free()
    assert a._freed
