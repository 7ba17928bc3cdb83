"""Shared test setup.

The suite runs on whichever backend the process selects (``IGNIS_BACKEND``,
default ``auto``: the emulated backend on a machine without a GPU). Tests
that need a real GPU are marked ``@pytest.mark.gpu`` and are skipped, with
the reason, elsewhere.

The process's backend is wrapped in a ``FaultInjectingBackend`` before any
test runs, so every test can make driver calls fail (the ``backend`` fixture's
``inject_fault``); the wrapper forwards everything else to the backend chosen.
"""

from __future__ import annotations

import pytest

import ignis as ig
from ignis.backends import get_backend, set_backend
from ignis.backends.faults import FaultInjectingBackend

set_backend(FaultInjectingBackend(get_backend()))  # before any device exists: everything uses the wrapper


def pytest_collection_modifyitems(config, items):
    if get_backend().name == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (the active backend is emulated)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _current_device_and_stream_restored():
    """Each test starts on device 0 and default streams, and leaves them so."""
    from ignis.runtime import current
    yield
    if current.overrides[0]:
        ig.Device(0).set_current()
        t = current._state()
        for stack in t.streams.values():
            while stack:
                current.pop_stream(stack[-1])


@pytest.fixture
def backend():
    """The active backend (the fault-injecting wrapper), with any injected faults cleared afterwards."""
    b = get_backend()
    yield b
    b.clear_faults()


@pytest.fixture
def on_emulated():
    """Skip unless the active backend is the emulator."""
    if get_backend().name != "emulated":
        pytest.skip("emulated-backend behaviour")
    return get_backend()


@pytest.fixture
def dev():
    """Device 0 of the active backend."""
    return ig.Device(0)


@pytest.fixture
def streams(dev):
    """Three streams on device 0, synchronized and closed afterwards."""
    ss = [dev.create_stream() for _ in range(3)]
    yield ss
    dev.synchronize()
    for s in ss:
        s.close()


@pytest.fixture
def san():
    """The sanitizer on, in ``raise`` mode, for the test; off afterwards."""
    ig.sanitizer.disable()
    s = ig.sanitizer.enable("raise")
    try:
        yield s
    finally:
        ig.sanitizer.disable()


@pytest.fixture
def manual():
    """The ``manual`` ordering policy for the test."""
    with ig.ordering("manual"):
        yield


def pytest_sessionfinish(session, exitstatus):
    """Name the threads and child processes still alive at the end (they outlive the
    tests into interpreter exit)."""
    import multiprocessing
    import threading

    alive = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if alive:
        print("\nthreads alive at the end of the session: " +
              ", ".join(f"{t.name}{' (daemon)' if t.daemon else ''}" for t in alive))
    children = multiprocessing.active_children()
    if children:
        print("child processes alive at the end of the session: " +
              ", ".join(f"{p.name} (pid {p.pid}{', daemon' if p.daemon else ''})" for p in children))
