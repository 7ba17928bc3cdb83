"""NvArray's C fast path (``ig.empty``, ``free`` and ``__del__`` in ignis/_speedups.c)
against the Python implementation: same arrays, same errors, no leaked references,
and the Python path whenever a keyword, a hook, a busy lock, a ref count, a view, a
pinned buffer or the garbage collector needs it."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import threading
from contextlib import contextmanager

import numpy as np
import pytest

import ignis as ig
from helpers import current_resource, python_calls
from ignis import dtypes as D
from ignis.array import nvarray as _nv
from ignis.memory import DeviceMemoryResource
from ignis._native import speedups as _sp

fast_only = pytest.mark.skipif(not _nv.FAST, reason="ignis._speedups is not built (or IGNIS_PURE_PYTHON=1)")


@contextmanager
def array_path(fast: bool):
    """Run the block with NvArray's C fast path on or off (a no-op where it is not built)."""
    if not _nv.FAST:
        yield
        return
    was = _sp.array_enable(fast)
    try:
        yield
    finally:
        _sp.array_enable(was)


def test_the_fast_path_is_bound_where_built():
    if os.environ.get("IGNIS_REQUIRE_SPEEDUPS") == "1" and os.environ.get("IGNIS_PURE_PYTHON", "") in ("", "0"):
        assert _nv.FAST, "ignis._speedups is built but NvArray does not use it"
    if _nv.FAST:
        assert ig.empty is _sp.array_empty
        assert type(ig.NvArray.__dict__["free"]).__name__ == "method_descriptor"
        assert "by='compute'" in ig.NvArray.free.__text_signature__
    else:
        assert ig.empty is ig.NvArray


def _observe(a: ig.NvArray) -> tuple:
    return (type(a).__name__, a.shape, a.dtype, a.numel, a.nbytes, a.owner, a.ref_count, a.freed, a.is_view,
            a.device_id, a.stream is ig.Device(0).default_stream, a.device_ptr != 0 or a.nbytes == 0,
            a.resource is ig.get_current_resource(ig.Device(0)))


def _error(fn) -> tuple:
    """The error ``fn`` raises, with array ids, generations and addresses masked."""
    with pytest.raises(Exception) as ei:
        fn()
    return type(ei.value).__name__, re.sub(r"(#|generation[ =]|0x)[0-9a-f]+", r"\1N", str(ei.value))


def _script(dev) -> list:
    """A fixed sequence of constructions, frees and misuse; returns what a caller can observe."""
    seen: list = []
    mr = ig.get_current_resource(dev)
    start = mr.bytes_outstanding
    for shape, dt in [(64, "float32"), ((2, 3), D.bfloat16), ((), "int8"), (0, "float64"), ((4, 0, 2), "uint8"),
                      (1 << 20, D.float16), (np.int64(5), "float32"), ([2, 2], "int32"), (3, np.float32),
                      ((True, 2), "uint8")]:
        a = ig.empty(shape, dt)
        seen.append(_observe(a))
        a.free()
        seen.append(a.freed)
    for shape, dt in [(-1, "float32"), ((2, -3), "float32"), ("x", "float32"), ((1.5,), "float32"),
                      (4, "float128"), (4, 7)]:
        seen.append(_error(lambda: ig.empty(shape, dt)))
    seen.append(_observe(ig.empty(8, "float32", stream=dev.default_stream, tag="kw")))  # keywords: the constructor
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


def test_fast_and_python_paths_agree(dev):
    with array_path(True):
        fast = _script(dev)
    with array_path(False):
        slow = _script(dev)
    assert fast == slow
    assert fast[-1] == 0


def test_fast_path_agrees_across_resources(dev):
    # A resource other than a pool: its own allocate / deallocate run, from C.
    mr = ig.DirectResource(dev)
    with current_resource(mr, dev):
        with array_path(True):
            a = ig.empty(1000, "float32")
            assert a.resource is mr and mr.bytes_outstanding >= 4000
            a.free()
            b = ig.empty(1000)
            del b
            gc.collect()
        assert mr.bytes_outstanding == 0


@fast_only
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

    pairs()  # the pool's cache: a miss runs the pool's Python path
    assert python_calls(pairs) == 0
    with array_path(False):
        assert python_calls(lambda: e(64).free()) > 0


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


@pytest.mark.parametrize("fast", [True, False])
def test_a_failed_allocation_leaves_no_array_behind(dev, fast):
    mr = _Failing(dev)
    with current_resource(mr, dev):
        with array_path(fast):
            gc.collect()
            before = sum(1 for o in gc.get_objects() if type(o) is ig.NvArray)
            with pytest.raises(ig.OutOfMemoryError, match=r"\(400 bytes\).*the test's resource is full"):
                ig.empty(100)
            gc.collect()
            assert sum(1 for o in gc.get_objects() if type(o) is ig.NvArray) == before
            assert mr.calls == 1


@fast_only
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


def test_dropped_arrays_return_memory_on_both_paths(dev):
    mr = ig.get_current_resource(dev)
    for fast in (True, False):
        with array_path(fast):
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
    with array_path(True):
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

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors and all(x.freed and x.ref_count == 0 for x in shared)
    dev.synchronize()
    assert mr.bytes_outstanding == start


@fast_only
def test_unbound_paths_raise_instead_of_crashing():
    sp = _sp
    with pytest.raises(TypeError):
        sp.array_setup(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)
    with pytest.raises(TypeError):
        ig.NvArray.free(object())  # the method descriptor checks its receiver


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


@pytest.mark.parametrize("fast", [True, False])
def test_a_resource_gets_the_constructors_arguments(dev, fast):
    mr = _Strict(dev)
    with current_resource(mr, dev), array_path(fast):
        for _ in range(3):
            a = ig.empty(64)
            assert a.free() is None
        x = ig.empty(8)
        del x
    assert mr.tags == ["untagged"] * 4 and mr.inner.bytes_outstanding == 0


def test_a_replaced_constructor_takes_the_python_path():
    # In a child process: a class's __new__ cannot be fully restored once replaced.
    code = """
import ignis as ig
ig.empty(16).free()  # the defaults cache: from here on the C path would run
made = []
def new(cls, *args, **kw):
    made.append(args)
    return object.__new__(cls)
ig.NvArray.__new__ = new
a = ig.empty(16)
assert made == [(16,)] and isinstance(a, ig.NvArray) and a.nbytes == 64, made
a.free()
print("ok")
"""
    env = dict(os.environ, IGNIS_BACKEND=ig.get_backend().name)
    # the ignis this process imported (a source tree built in place, or the installed package)
    here = os.path.dirname(os.path.dirname(os.path.abspath(ig.__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]
