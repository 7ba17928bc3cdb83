"""Fault injection as a wrapping backend (ignis.backends.faults).

``FaultInjectingBackend`` forwards every protocol operation to the backend it
wraps and fails the calls a test arms, before the inner backend sees them. The
backends themselves carry no fault checks. Each test builds its own backends,
so the file runs whatever backend the process selected.
"""

from __future__ import annotations

import inspect
import os

import pytest

from ignis.backends import trace
from ignis.backends.base import OPS, Backend, REFUSED_AFTER_FORK
from ignis.backends.emulated import EmulatedBackend
from ignis.backends.faults import FaultInjectingBackend
from ignis.errors import DriverError, ForkedProcessError

# What the wrapper forwards without fault checks (not driver operations of OPS).
PLAIN = ("device_count", "device_properties", "versions", "set_current", "host_view", "host_address",
         "allocation_view", "adopt_host_memory", "release_host_memory", "fork_unsafe")


class Spy(Backend):
    """A backend that records each call and answers with a token naming it."""

    name = "spy"
    host_memory = True
    gpu_timings = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []


def _spy_method(op):
    def method(self, *args, **kwargs):
        self.calls.append((op, args, kwargs))
        return f"{op} result"
    method.__name__ = op
    return method


for _name in (*OPS, *PLAIN):
    setattr(Spy, _name, _spy_method(_name))


@pytest.fixture
def emu():
    b = EmulatedBackend(devices=1, memory="64MiB", jitter=False)
    yield b
    b.rebuild_context(0)


def test_every_protocol_method_is_the_wrappers_own():
    own = vars(FaultInjectingBackend)
    protocol = [n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")
                and n not in ("forked_error",)]
    assert set(OPS) <= set(protocol)
    missing = [n for n in protocol if n not in own]
    assert not missing, f"inherited from Backend instead of forwarded: {missing}"


@pytest.mark.parametrize("op", [*OPS, *PLAIN])
def test_each_call_reaches_the_inner_backend_unchanged(op):
    spy = Spy()
    b = FaultInjectingBackend(spy)
    params = [p for p in inspect.signature(getattr(Backend, op)).parameters.values() if p.name != "self"]
    args = tuple(object() for p in params if p.default is p.empty)  # the required ones, positionally
    kwargs = {p.name: object() for p in params if p.default is not p.empty}  # the optional ones by name
    assert getattr(b, op)(*args, **kwargs) == f"{op} result"
    assert spy.calls == [(op, args, kwargs)]


def test_name_capabilities_and_trace_are_the_inner_backends(emu):
    b = FaultInjectingBackend(emu)
    assert (b.name, b.host_memory, b.host_kernels, b.cuda_driver, b.gpu_timings) == \
        (emu.name, emu.host_memory, emu.host_kernels, emu.cuda_driver, emu.gpu_timings)
    s = FaultInjectingBackend(Spy())
    assert (s.name, s.host_memory, s.host_kernels, s.gpu_timings) == ("spy", True, False, True)
    listener = trace.TraceListener()
    trace.subscribe(listener, b)
    assert trace.listeners(emu) == (listener,)  # the inner backend, which does the work, emits
    trace.unsubscribe(listener, emu)
    assert trace.listeners(b) == ()
    with pytest.raises(TypeError, match="wraps an ignis Backend"):
        FaultInjectingBackend(object())


def test_an_armed_call_fails_without_reaching_the_inner_backend():
    spy = Spy()
    b = FaultInjectingBackend(spy)
    b.inject_fault("mem_alloc", nth=2, error="CUDA_ERROR_ILLEGAL_ADDRESS", times=2)
    assert b.armed_faults() == {"mem_alloc": (2, "CUDA_ERROR_ILLEGAL_ADDRESS", 2)}
    b.mem_alloc(0, 16)
    for _ in range(2):
        with pytest.raises(DriverError) as ei:
            b.mem_alloc(0, 32)
        assert (ei.value.name, ei.value.call, ei.value.detail) == \
            ("CUDA_ERROR_ILLEGAL_ADDRESS", "cuMemAlloc", "injected fault")
    b.mem_alloc(0, 64)
    assert [c[1] for c in spy.calls] == [(0, 16), (0, 64)]  # the failed calls never got through
    assert b.armed_faults() == {}


ALLOCATING = {  # op -> a call that would make something
    "mem_alloc": lambda b, s: b.mem_alloc(0, 4096),
    "mem_alloc_async": lambda b, s: b.mem_alloc_async(0, 4096, s),
    "host_alloc": lambda b, s: b.host_alloc(4096),
    "stream_create": lambda b, s: b.stream_create(0),
    "event_create": lambda b, s: b.event_create(0),
    "vmm_create": lambda b, s: b.vmm_create(0, b.vmm_granularity(0)),
    "vmm_reserve": lambda b, s: b.vmm_reserve(0, b.vmm_granularity(0)),
    "memcpy_dtod_async": None,  # queues work: checked through the stream's count below
    "launch_host_func": lambda b, s: b.launch_host_func(s, lambda: None),
}


def _made(emu: EmulatedBackend, s: int) -> tuple:
    """Everything the emulator holds: device bytes, streams, events, pinned buffers,
    VMM handles and reservations, and the work queued on ``s``."""
    return (emu.mem_get_info(0)[0], len(emu._streams), len(emu._events), len(emu._pinned),
            len(emu._vmm_handles), len(emu._vmm_res), emu._streams[s].submitted())


@pytest.mark.parametrize("op", sorted(ALLOCATING))
def test_a_failed_call_leaves_nothing_allocated(emu, op):
    b = FaultInjectingBackend(emu)
    s = b.stream_create(0)
    p = b.mem_alloc(0, 1024)
    call = ALLOCATING[op] or (lambda b, s: b.memcpy_dtod_async(p + 512, p, 64, s))
    before = _made(emu, s)
    b.inject_fault(op, error="CUDA_ERROR_OUT_OF_MEMORY")
    with pytest.raises(DriverError, match="injected fault"):
        call(b, s)
    assert _made(emu, s) == before
    assert not b.armed_faults()
    call(b, s)  # disarmed: it works, and makes what it makes
    assert _made(emu, s) != before


def test_bad_fault_requests_are_refused():
    b = FaultInjectingBackend(Spy())
    with pytest.raises(ValueError, match="unknown backend operation 'malloc'"):
        b.inject_fault("malloc")
    with pytest.raises(ValueError, match="unknown driver status"):
        b.inject_fault("mem_alloc", error="CUDA_ERROR_BORED")
    for bad in ({"nth": 0}, {"times": 0}, {"nth": 1.5}):
        with pytest.raises(ValueError, match="nth and times"):
            b.inject_fault("mem_alloc", **bad)
    assert b.armed_faults() == {}
    b.inject_fault("mem_free", nth=3)
    b.clear_faults()
    assert b.armed_faults() == {}


def _offer_direct_calls(inner: EmulatedBackend) -> None:
    """Give the emulated backend direct calls (no entry points: only the gates matter here)."""
    inner.direct_calls = lambda: inner._direct_calls({}, {}, None, None, (0, 0, 0))


def test_the_direct_driver_path_is_handed_the_fault_table(emu):
    """The direct driver calls (the memory layer's records and waits, the launch) make no call
    of the backend's methods: through the wrapper they are the inner backend's, for the wrapper,
    gated by its fault table too, so they stay off (and the armed call fails in Python) while a
    fault is armed (tests/test_memory.py runs that path)."""
    assert FaultInjectingBackend(emu).direct_calls() is None  # the emulator offers none
    _offer_direct_calls(emu)
    b = FaultInjectingBackend(emu)
    dc = b.direct_calls()
    assert dc.backend is b and emu.direct_calls().backend is emu
    assert any(x is b._faults for x in dc.gates) and any(x is emu._trace for x in dc.gates)
    assert any(x is b._faults for x in dc.launch_gates) and not any(x is emu._trace for x in dc.launch_gates)
    assert not any(dc.gates) and not any(dc.launch_gates)
    b.inject_fault("event_record")
    assert any(dc.gates) and any(dc.launch_gates)
    b.clear_faults()
    assert not any(dc.gates)


def test_injected_faults_are_not_in_the_backends():
    """The backends have no fault table and no per-operation fault check."""
    import ignis.backends.cuda as cuda
    import ignis.backends.emulated as emulated
    import ignis.backends.vmm_cuda as vmm_cuda
    import ignis.backends.vmm_emulated as vmm_emulated
    for mod in (emulated, cuda, vmm_emulated, vmm_cuda):
        assert "_fault" not in inspect.getsource(mod), mod.__name__
    assert not hasattr(EmulatedBackend(devices=0), "inject_fault")


def test_a_marked_forked_backend_refuses_every_operation():
    inner = EmulatedBackend(devices=1, memory="1MiB", jitter=False)
    _offer_direct_calls(inner)
    b = FaultInjectingBackend(inner)
    off = b.direct_calls().gates
    inner.mark_forked(os.getpid())
    b.mark_forked(os.getpid())
    assert type(inner).__name__ == "ForkedEmulatedBackend" and isinstance(inner, EmulatedBackend)
    assert any(off)  # the direct driver path stays off
    for backend in (inner, b):
        for op in ("mem_alloc", "stream_synchronize", "vmm_create", "host_view"):
            assert op in REFUSED_AFTER_FORK
            with pytest.raises(ForkedProcessError, match="spawn"):
                getattr(backend, op)(0, 16)
    assert inner.device_count() == 1  # what needs no device state still answers


def test_direct_calls_refuse_what_they_cannot_use(emu):
    from ignis.backends.direct import DirectCalls
    with pytest.raises(TypeError, match="handle tables"):
        DirectCalls(emu, [], {}, None, None, (), (), (0, 0, 0))
    with pytest.raises(TypeError, match="epoch"):
        DirectCalls(emu, {}, {}, None, [0, 1], (), (), (0, 0, 0))
    with pytest.raises(TypeError, match="three entry point addresses"):
        DirectCalls(emu, {}, {}, None, None, (), (), (1, 2))
    dc = DirectCalls(emu, {}, {}, None, None, (), (), (1, 2, 3), {"cuX": 4})
    assert dc.raw == (1, 2, 3) and dc.entry_points == {"cuX": 4} and dc.is_open()
    gate: dict = {}
    gated = dc.with_gates("wrapper", (gate,), ())
    assert gated.backend == "wrapper" and gated.raw == dc.raw and gated.is_open()
    gate["armed"] = 1
    assert not gated.is_open() and dc.is_open()
    assert not DirectCalls(emu, {}, {}, None, None, (), (), (0, 2, 3)).is_open()  # no record entry point
