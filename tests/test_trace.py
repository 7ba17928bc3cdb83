"""The trace registry (ignis.backends.trace): listeners hear a backend's ordering
operations from the backend itself, and nothing of the backend is replaced.

Every test builds its own ``EmulatedBackend``, so the file runs whatever backend
the process selected.
"""

from __future__ import annotations

import threading

import pytest

from ignis.backends import trace
from ignis.backends.emulated import EmulatedBackend
from ignis.errors import DriverError

TRACED = ("event_record", "stream_wait_event", "stream_synchronize", "event_synchronize", "device_synchronize",
          "stream_query", "event_query", "stream_destroy", "event_destroy")


class Log(trace.TraceListener):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_event_record(self, event, stream):
        self.calls.append(("record", event, stream))

    def on_stream_wait_event(self, stream, event):
        self.calls.append(("wait", stream, event))

    def on_stream_synchronize(self, stream):
        self.calls.append(("stream sync", stream))

    def on_event_synchronize(self, event):
        self.calls.append(("event sync", event))

    def on_device_synchronize(self, ordinal=None):
        self.calls.append(("device sync", ordinal))

    def on_stream_destroyed(self, stream):
        self.calls.append(("stream destroyed", stream))

    def on_event_destroyed(self, event):
        self.calls.append(("event destroyed", event))


@pytest.fixture
def emu():
    b = EmulatedBackend(devices=1, memory="16MiB", jitter=False)
    yield b
    b.rebuild_context(0)  # stops the worker threads


def test_a_listener_hears_each_ordering_operation_with_its_handles(emu):
    log = Log()
    s1, s2 = emu.stream_create(0), emu.stream_create(0)
    e = emu.event_create(0)
    trace.subscribe(log, emu)
    gate = threading.Event()
    emu.launch_host_func(s1, gate.wait)       # keeps s1 busy: the queries below answer False
    emu.event_record(e, s1)
    emu.stream_wait_event(s2, e)
    assert emu.stream_query(s1) is False and emu.event_query(e) is False
    gate.set()
    emu.stream_synchronize(s1)
    assert emu.event_query(e) is True and emu.stream_query(s1) is True
    emu.event_synchronize(e)
    emu.device_synchronize(0)
    emu.event_destroy(e)
    emu.stream_destroy(s2)
    emu.stream_destroy(s1)
    assert log.calls == [("record", e, s1), ("wait", s2, e), ("stream sync", s1), ("event sync", e),
                         ("stream sync", s1), ("event sync", e), ("device sync", 0), ("event destroyed", e),
                         ("stream destroyed", s2), ("stream destroyed", s1)]


def test_a_failed_operation_is_not_reported_as_done(emu):
    log = Log()
    trace.subscribe(log, emu)
    with pytest.raises(DriverError):
        emu.stream_synchronize(12345)
    with pytest.raises(DriverError):
        emu.stream_wait_event(12345, 678)
    assert log.calls == []


def test_unsubscribe_stops_the_calls_and_subscribe_is_idempotent(emu):
    log, other = Log(), Log()
    s = emu.stream_create(0)
    trace.subscribe(log, emu)
    trace.subscribe(log, emu)
    trace.subscribe(other, emu)
    assert trace.listeners(emu) == (log, other)
    emu.stream_synchronize(s)
    assert log.calls == other.calls == [("stream sync", s)]
    assert trace.unsubscribe(log, emu) is True and trace.unsubscribe(log, emu) is False
    emu.stream_synchronize(s)
    assert log.calls == [("stream sync", s)] and len(other.calls) == 2
    trace.unsubscribe(other, emu)
    assert trace.listeners(emu) == () and not emu._trace
    emu.stream_destroy(s)


def test_listening_patches_nothing(emu):
    funcs = {name: getattr(emu, name).__func__ for name in TRACED}
    cls = type(emu)
    trace.subscribe(Log(), emu)
    assert type(emu) is cls and not any(name in vars(emu) for name in TRACED)
    assert {name: getattr(emu, name).__func__ for name in TRACED} == funcs
    assert all(funcs[name] is vars(EmulatedBackend)[name] for name in TRACED)


def test_the_list_the_direct_driver_path_holds_is_the_live_one(emu):
    """A backend's direct driver calls (which queue records without calling its methods) are
    gated by its listener list itself, so they see a subscription made after they were made
    (tests/test_memory.py runs that path)."""
    off = emu._direct_calls({}, {}, None, None, (0, 0, 0)).gates
    assert any(x is emu._trace for x in off) and not any(off)
    log = Log()
    trace.subscribe(log, emu)
    assert any(off)
    trace.unsubscribe(log, emu)
    assert not any(off)


def test_bad_listeners_and_backends_are_refused(emu):
    class Half:
        def on_event_record(self, event, stream):
            pass

    with pytest.raises(TypeError, match="lacks on_stream_wait_event"):
        trace.subscribe(Half(), emu)
    with pytest.raises(TypeError, match="expected an ignis backend"):
        trace.subscribe(Log(), object())
    assert trace.listeners(emu) == ()


def test_a_listeners_exception_reaches_the_caller(emu):
    class Boom(trace.TraceListener):
        def on_stream_synchronize(self, stream):
            raise RuntimeError("listener failed")

    s = emu.stream_create(0)
    trace.subscribe(Boom(), emu)
    with pytest.raises(RuntimeError, match="listener failed"):
        emu.stream_synchronize(s)
