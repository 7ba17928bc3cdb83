"""The op observer's backlog: the calls its direct path makes into the sanitizer (an op's
accesses, the caching allocator's frees) are held and handed over in batches. A held call
must be made exactly as it would have been made at once: in the same order against every
other call, with the stack of the moment it happened, and before anything reads what the
sanitizer found.

CPU tensors stand for a device's (the front end's test mode); each test names the stream
its ops are queued on. Real PyTorch, the real observer library, no GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import ignis as ig  # noqa: E402
from ignis.safety.sanitizer import Sanitizer  # noqa: E402
from ignis.torch._frontend import TorchFrontEnd  # noqa: E402
from helpers.observer_front import A, B, Front, frees_held  # noqa: E402

@pytest.fixture(autouse=True)
def _default_batch(monkeypatch):
    monkeypatch.delenv("IGNIS_OBSERVER_BATCH", raising=False)  # (the diagnostic's: see the last test)


def _write_on_a(f: Front):
    f.stream = A
    return torch.ones(256)  # the write's site


def _read_on_b(f: Front, x):
    f.stream = B
    return x.sum()  # the read's site


def test_an_ops_accesses_are_held_then_reported_with_the_stacks_of_their_ops():
    with Front() as f:
        x = _write_on_a(f)
        _read_on_b(f, x)  # no wait: a read-after-write race
        assert f.held() >= 2 and f.san.checked_foreign == 0  # held, not made yet
        [e] = f.san.reports  # reading the reports makes them first
        assert f.held() == 0 and f.san.checked_foreign >= 2
    assert isinstance(e, ig.RaceError) and e.kind == "read-after-write race"
    # Each side's stack is its op's, taken when the op ran, not where the calls were made.
    assert "_write_on_a" in e.first["stack"] and "_read_on_b" in e.second["stack"]
    assert "test_an_ops_accesses_are_held" not in e.first["stack"].splitlines()[0]


def test_a_synchronization_is_ordered_after_the_held_ops_before_it():
    # The host's wait for stream A reaches the sanitizer directly (a trace event, here a call):
    # it must find the write on A already made, or the read on B would race it.
    with Front() as f:
        x = _write_on_a(f)
        assert f.held() >= 1
        f.san.on_stream_synchronize(A)  # any entry point makes the held calls first
        assert f.held() == 0
        _read_on_b(f, x)
        assert f.san.reports == []
    # Without the synchronization the same program races: the check above could fail.
    with Front() as f:
        x = _write_on_a(f)
        _read_on_b(f, x)
        assert len(f.san.reports) == 1


def test_a_full_backlog_is_handed_over_and_stop_hands_over_the_rest():
    with Front() as f:
        x = torch.zeros(64)
        most = 0
        for _ in range(700):
            x.add_(1)
            most = max(most, f.held())
        assert 0 < most <= 256  # at most a batch is held at a time
        assert f.san.checked_foreign >= 512  # the full batches were made on the way
        assert float(x[0]) == 700.0
    assert f.held() == 0 and f.san.checked_foreign >= 701  # stop made the rest
    assert f.fe.ops >= 701


def test_raise_mode_raises_a_problem_found_in_a_held_call_when_checking_stops():
    f = Front(mode="raise")
    f.__enter__()
    try:
        x = _write_on_a(f)
        _read_on_b(f, x)
    except BaseException:
        f.__exit__()
        raise
    with pytest.raises(ig.RaceError) as info:
        f.__exit__()
    assert "_read_on_b" in info.value.second["stack"]
    assert f.held() == 0


def _free_here(lib, base: int) -> None:
    lib.ignis_obs_trace_fire(5, 0, base, 0, 0)  # the caching allocator's free (device type 0: this test's)


def test_a_held_free_keeps_the_stack_of_the_moment_it_happened(monkeypatch):
    # Frees reach the sanitizer's own handler through the observer's trace interpreter, and are
    # held like ops. A free that races a use on another stream is reported with its own stack.
    with frees_held(monkeypatch) as f:
        x = _write_on_a(f)
        base = x.untyped_storage().data_ptr()
        _read_on_b(f, x)
        f.stream = A
        _free_here(f.lib, base)  # freed on A while B's read may still run
        assert f.held() >= 3
        found = f.san.reports
    kinds_found = sorted(e.kind for e in found)
    assert "free-after-read race" in kinds_found or any("free" in k for k in kinds_found), kinds_found
    [free] = [e for e in found if e.second.get("op") == "free"]
    assert "_read_on_b" in free.first["stack"] and "_free_here" in free.second["stack"]


def test_the_sanitizer_runs_a_drainer_once_per_entry_and_not_inside_itself():
    # The sanitizer's side of the contract, without PyTorch's observer: every entry point runs
    # the drainer first, under the lock; the calls the drainer makes find it draining.
    san = Sanitizer()
    san.mode = "collect"
    made: list = []

    def drainer():
        made.append(len(made))
        san.on_stream_synchronize(A)  # an entry point, from inside the drain: no second drain

    san.set_drainer(drainer)
    try:
        san.on_event_record(0xE1, A)
        assert made == [0]
        san.reports
        san.summary()
        assert made == [0, 1, 2]
        assert san.syncs == 3
    finally:
        san.set_drainer(None)
    san.on_event_record(0xE2, A)
    assert len(made) == 3


def test_a_batch_of_one_makes_each_call_at_once(monkeypatch):
    # IGNIS_OBSERVER_BATCH=1 (a diagnostic: the calls made as before the backlog, for comparisons
    # in one run) holds nothing, and finds the same race.
    monkeypatch.setenv("IGNIS_OBSERVER_BATCH", "1")
    with Front() as f:
        x = _write_on_a(f)
        assert f.held() == 0 and f.san.checked_foreign >= 1
        _read_on_b(f, x)
        [e] = f.san.reports
    assert e.kind == "read-after-write race" and "_read_on_b" in e.second["stack"]



# Every entry point of the sanitizer makes a front end's held calls first (sanitizer-level).
BLK = 0x7F00_0000_0000
ENTRY_POINTS = [
    ("set_stream_label", (A, "a stream")), ("on_event_record", (0xE1, A)), ("on_event_wait", (0xE1, A)),
    ("on_stream_wait_event", (A, 0xE1)), ("on_stream_synchronize", (A,)), ("on_event_synchronize", (0xE1,)),
    ("on_device_synchronize", ()), ("on_stream_destroyed", (A,)), ("on_event_destroyed", (0xE1,)),
    ("extent_allocated", (BLK, A)), ("extent_freed", (BLK,)), ("begin_lifetimes", (A, "op", None, [])),
    ("extent_record_stream", (BLK, A)), ("extent_release", (BLK,)), ("extent_dropped", (BLK,)), ("knows", (BLK,)),
    ("foreign_access", (A, "op", None, [])), ("pool_begin", ()), ("clear", ()), ("summary", ()),
    ("drain", ()), ("capture_end", (A,)),
]


@pytest.mark.parametrize("name,args", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_each_entry_point_makes_the_held_calls_first(name, args):
    san = Sanitizer()
    san.mode = "collect"
    made: list = []
    san.set_drainer(lambda: made.append(name))
    try:
        getattr(san, name)(*args)
    finally:
        san.set_drainer(None)
    assert made == [name]


def test_reading_reports_or_setting_the_mode_makes_the_held_calls_first():
    san = Sanitizer()
    made: list = []
    san.set_drainer(lambda: made.append(san.mode))
    try:
        san.reports
        san.mode = "collect"  # the held calls are made in the mode they were made in
        assert made == ["raise", "raise"] and san.mode == "collect"
    finally:
        san.set_drainer(None)


def test_a_held_call_keeps_the_thread_that_made_it():
    # A CUDA graph tree's warm-up allocates into the graph's pool on one thread (pool_begin and
    # pool_end on it): memory an op makes there is the pool's. Held, that op's call may be made by
    # another thread's entry point: it must still count as the warm-up thread's.
    import threading
    with Front() as f:
        f.san.pool_begin()
        x = _write_on_a(f)  # a fresh output, held
        base = x.untyped_storage().data_ptr()
        assert f.held() >= 1
        t = threading.Thread(target=f.san.on_stream_synchronize, args=(B,))  # another thread drains
        t.start()
        t.join()
        assert f.held() == 0
        f.san.pool_end()
        assert base in f.san._graph_mem


def test_a_held_free_takes_its_stack_when_the_sanitizer_knows_another_stream(monkeypatch):
    # Every held call is on stream A here; stream B's use reaches the sanitizer directly (as a
    # Triton kernel's does). The free on A races it, and must carry the stack of its moment.
    from ignis.safety.frames import capture_frames
    from ignis.safety.sanitizer import READ
    with frees_held(monkeypatch) as f:
        x = _write_on_a(f)
        base, n = x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()
        f.san.foreign_access(B, "a kernel on B", capture_frames(1), [(base, n, base, base + n, 0, 0, READ)])
        _free_here(f.lib, base)  # on A, while B's read may still run
        assert f.held() >= 1
        found = f.san.reports
    frees = [e for e in found if e.second.get("op") == "free"]
    assert len(frees) == 1 and "_free_here" in frees[0].second["stack"], [str(e) for e in found]


@pytest.mark.parametrize("value", ["0", "4097", "-3", "many", ""])
def test_a_batch_outside_1_to_4096_is_refused_with_what_to_set(monkeypatch, value):
    monkeypatch.setenv("IGNIS_OBSERVER_BATCH", value)
    with pytest.raises(ValueError, match="IGNIS_OBSERVER_BATCH must be a whole number from 1 to 4096"):
        TorchFrontEnd(Sanitizer(), device_type="cpu", stream_of=lambda t: A, engine="observer")
