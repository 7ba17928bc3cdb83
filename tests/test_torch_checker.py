"""The op observer's checker thread: the ops and frees that PyTorch's autograd engine runs on
its own threads inside ``backward()`` (threads with no Python frame) are held as C values,
without the GIL, with the stack of the ``backward()`` call, and made into the sanitizer in
batches: by the thread that holds a batch's last call, or (IGNIS_OBSERVER_CHECKER=1) by a thread
of the observer's own while the backward pass goes on. Made late, they must still be made
exactly as the ops' own calls would have been: in order against every other call, with their
stream, their stack and their thread.

CPU tensors stand for a device's (the front end's test mode). A C++ thread of the observer's
test entry point (``ignis_obs_frameless_ops``) runs real PyTorch ops with no Python frame on it,
as the autograd engine's device threads do. Real PyTorch, the real observer library, no GPU.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")

import ignis as ig  # noqa: E402
from ignis.safety.frames import capture_frames, last_from_library  # noqa: E402
from ignis.safety.sanitizer import Sanitizer  # noqa: E402
from ignis.torch._frontend import TorchFrontEnd  # noqa: E402
from helpers.observer_front import A, B, frees_held  # noqa: E402
from helpers.observer_front import Front as BaseFront  # noqa: E402

@pytest.fixture(autouse=True, params=["default", "checker thread"])
def _defaults(monkeypatch, request):
    """Every test both ways: the held calls made by the thread that holds a batch's last call
    (the default), and by the checker thread (IGNIS_OBSERVER_CHECKER=1)."""
    monkeypatch.delenv("IGNIS_OBSERVER_BATCH", raising=False)
    if request.param == "default":
        monkeypatch.delenv("IGNIS_OBSERVER_CHECKER", raising=False)
    else:
        monkeypatch.setenv("IGNIS_OBSERVER_CHECKER", "1")


class Front(BaseFront):
    """The shared front end, with the autograd engine's kind of thread."""

    def c_held(self) -> int:
        return self.lib.ignis_obs_c_held()

    def backward_thread(self, x, y, reps: int = 1, free: int = 0) -> None:
        """``x.add_(y)`` ``reps`` times on a thread with no Python frame (then a free of
        ``free``), as the autograd engine's device thread runs a backward pass's ops."""
        assert self.lib.ignis_obs_frameless_ops((x, y), reps, free, 0) == 0


@contextmanager
def _window(f: Front):
    """A ``backward()`` call's window, opened here (this function's caller is its stack)."""
    frames = capture_frames(1)
    assert f.lib.ignis_obs_window_open(frames, 1 if last_from_library() else 0, f.stream) == 1
    try:
        yield
    finally:
        f.lib.ignis_obs_window_close()


def _write_on_a(f: Front):
    f.stream = A
    return torch.ones(256)  # the write's site


def _backward_on_b(f: Front, x, reps: int = 1, free: int = 0) -> None:
    f.stream = B
    with _window(f):  # the backward() call's site
        f.backward_thread(x, torch.ones(256), reps, free)


def test_a_backward_threads_op_is_held_without_the_gil_and_reported_with_the_backward_call():
    with Front() as f:
        x = _write_on_a(f)
        before = f.c_held()
        _backward_on_b(f, x)  # x.add_ on B, no wait for A's write: a race
        assert f.c_held() == before + 1
        [e] = f.san.reports
    assert isinstance(e, ig.RaceError) and e.kind == "write-after-write race", str(e)
    # The first side's stack is its op's; the second's is the backward() call's, its thread the
    # autograd engine's (not the one that made the call).
    assert "_write_on_a" in e.first["stack"] and "_backward_on_b" in e.second["stack"]
    assert float(x[0]) == 2.0


def test_the_same_program_ordered_is_silent():
    with Front() as f:
        x = _write_on_a(f)
        f.san.on_stream_synchronize(A)  # the host waits for A first
        before = f.c_held()
        _backward_on_b(f, x, reps=3)
        assert f.san.reports == []
        assert f.c_held() == before + 3


def test_held_calls_of_both_forms_are_made_in_the_order_they_happened():
    # A write on A (held with the GIL), then the backward thread's on B, then a read on A: the
    # read races B's write, not A's (which it follows in stream order).
    with Front() as f:
        x = _write_on_a(f)
        f.san.on_stream_synchronize(A)
        before = f.c_held()
        _backward_on_b(f, x)
        assert f.c_held() == before + 1  # (the C form)
        f.stream = A
        x.sum()  # the read's site
        [e] = f.san.reports
    assert e.kind == "read-after-write race", str(e)
    assert "_backward_on_b" in e.first["stack"] and "test_held_calls_of_both_forms" in e.second["stack"]


def test_the_checker_thread_makes_a_backward_passs_calls_while_it_goes_on(monkeypatch):
    monkeypatch.setenv("IGNIS_OBSERVER_CHECKER", "1")
    with Front() as f:
        assert f.lib.ignis_obs_checker() == 1
        x = torch.zeros(256)
        f.san.on_stream_synchronize(A)
        before = f.san.checked_foreign
        _backward_on_b(f, x, reps=300)  # (an output made here, then 300 ops of two accesses)
        # The checker thread makes them (it wakes every 64): nothing on this thread asks.
        deadline = time.monotonic() + 10
        # (x's output was made by the synchronization; the ones made here is held before the 300)
        while f.san.checked_foreign - before < 1 + 2 * 256 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert f.san.checked_foreign - before >= 1 + 2 * 256
        assert float(x[0]) == 300.0
    assert f.san.checked_foreign - before == 2 + 2 * 300  # stop made the rest, each once
    assert f.lib.ignis_obs_checker() == 0  # stopped with the front end


@pytest.mark.parametrize("setting", [None, "0"])
def test_without_the_checker_thread_the_backward_thread_makes_its_batch(monkeypatch, setting):
    if setting is None:  # the default
        monkeypatch.delenv("IGNIS_OBSERVER_CHECKER", raising=False)
    else:
        monkeypatch.setenv("IGNIS_OBSERVER_CHECKER", setting)
    with Front() as f:
        assert f.lib.ignis_obs_checker() == 0
        x = torch.zeros(256)
        before = f.san.checked_foreign
        _backward_on_b(f, x, reps=300)
        made = f.san.checked_foreign - before
        assert made >= 2 * 255 and made % 2 == 0  # a full batch, made on the way
        assert f.lib.ignis_obs_held() == 2 + 300 - made // 2 - 1 < 256
    assert f.san.checked_foreign - before == 2 + 2 * 300


def test_stop_makes_the_calls_still_held():
    with Front() as f:
        x = torch.zeros(256)
        before = f.san.checked_foreign
        _backward_on_b(f, x, reps=5)  # under the checker's wake: held
        assert f.lib.ignis_obs_held() == 2 + 5  # (x and the ones made here, then the five ops)
    assert f.san.checked_foreign - before == 2 + 2 * 5 and f.lib.ignis_obs_held() == 0


def test_a_backward_threads_free_is_held_with_the_backward_calls_stack(monkeypatch):
    with frees_held(monkeypatch, Front) as f:
        x = _write_on_a(f)
        base = x.untyped_storage().data_ptr()
        f.stream = B
        x.sum()  # a read on B
        before = f.c_held()
        f.stream = A
        with _window(f):  # freed on A by the backward thread, while B's read may run
            f.backward_thread(torch.zeros(4), torch.zeros(4), 0, base)
        assert f.c_held() == before + 1
        found = f.san.reports
    frees = [e for e in found if e.second.get("op") == "free"]
    assert len(frees) == 1, [str(e) for e in found]
    assert "test_a_backward_threads_free" in frees[0].second["stack"]


def test_nested_windows_make_every_call_the_python_form():
    # Whose stack a thread with no frame has is not known inside two backward() calls at once.
    with Front() as f:
        x = torch.zeros(256)
        before = f.c_held()
        with _window(f), _window(f):
            f.backward_thread(x, torch.ones(256), 2)
        assert f.c_held() == before  # both made the GIL's way
        f.backward_thread(x, torch.ones(256), 1)  # no window open
        assert f.c_held() == before
        with _window(f):
            f.backward_thread(x, torch.ones(256), 1)
        assert f.c_held() == before + 1
        assert f.san.reports == []


def test_backward_is_wrapped_while_checking_and_put_back_after():
    import torch.autograd as autograd
    import torch.autograd.graph as graph
    orig = graph._engine_run_backward
    assert autograd._engine_run_backward is orig
    w = torch.ones(8, requires_grad=True)
    with Front() as f:
        assert graph._engine_run_backward is not orig and autograd._engine_run_backward is graph._engine_run_backward
        assert graph._engine_run_backward.__wrapped__ is orig
        (w * 3).sum().backward()
        assert torch.equal(w.grad, torch.full((8,), 3.0))
        # A backward() that fails closes its window: a backward thread's op after it is the
        # Python form.
        with pytest.raises(RuntimeError):
            torch.ones(2).sum().backward()
        before = f.c_held()
        f.backward_thread(torch.zeros(4), torch.ones(4), 1)
        assert f.c_held() == before
        assert f.san.reports == []
    assert graph._engine_run_backward is orig and autograd._engine_run_backward is orig


def test_a_backward_from_another_thread_while_one_runs_makes_the_python_form():
    # Two backward() calls at once (two Python threads): neither window's stack is the frameless
    # thread's for sure.
    with Front() as f:
        x = torch.zeros(256)
        before = f.c_held()
        entered, release = threading.Event(), threading.Event()

        def other():
            with _window(f):
                entered.set()
                release.wait(10)

        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
        with _window(f):
            f.backward_thread(x, torch.ones(256), 1)
        release.set()
        t.join()
        assert f.c_held() == before


@pytest.mark.parametrize("value", ["2", "yes", "", " 1"])
def test_a_checker_setting_other_than_0_or_1_is_refused_with_what_to_set(monkeypatch, value):
    monkeypatch.setenv("IGNIS_OBSERVER_CHECKER", value)
    with pytest.raises(ValueError, match="IGNIS_OBSERVER_CHECKER must be 0"):
        TorchFrontEnd(Sanitizer(), device_type="cpu", stream_of=lambda t: A, engine="observer")


def test_backward_calls_from_one_site_share_one_window():
    # The windows' table is small: the same call site (the same stack, the same stream named by
    # equal objects) must not take a new entry per backward() call, or a long run falls back to
    # the Python form once it is full.
    with Front() as f:
        f.stream = B
        x = torch.zeros(256)  # made on B, where the backward thread's ops run
        before = f.c_held()
        for _ in range(100):
            f.stream = int(str(B))  # an equal handle, another object
            with _window(f):  # one site
                f.backward_thread(x, torch.ones(256), 1)
        assert f.c_held() == before + 100
        assert f.san.reports == []


def _op_on_b_here(f: Front, x) -> None:
    f.stream = B
    x.add_(1)  # the op's own site


def test_an_op_of_a_thread_with_python_frames_inside_a_window_keeps_its_own_stack():
    with Front() as f:
        x = _write_on_a(f)
        before = f.c_held()
        with _window(f):
            _op_on_b_here(f, x)  # this thread runs Python: the Python form, its own stack
        assert f.c_held() == before
        [e] = f.san.reports
    assert "_op_on_b_here" in e.second["stack"]


def test_a_nested_window_closing_gives_the_outer_one_back():
    # Reentrant checkpointing calls backward() inside a backward pass: the inner window's ops are
    # the Python form; after it the outer pass's are the C form again.
    with Front() as f:
        f.stream = B
        x = torch.zeros(256)
        before = f.c_held()
        with _window(f):
            with _window(f):
                f.backward_thread(x, torch.ones(256), 1)
            assert f.c_held() == before
            f.backward_thread(x, torch.ones(256), 1)
            assert f.c_held() == before + 1
        assert f.san.reports == []


def test_past_the_table_of_windows_the_calls_are_the_python_form_and_still_checked():
    with Front() as f:
        f.stream = B
        x = torch.zeros(256)
        y = torch.ones(256)
        frames = capture_frames(1)
        before, items = f.c_held(), f.san.checked_foreign
        for i in range(70):  # seventy sites (the same frames at other lines)
            site = tuple((code, line + i) for code, line in frames)
            assert f.lib.ignis_obs_window_open(site, 0, f.stream) == 1
            try:
                f.backward_thread(x, y, 1)
            finally:
                f.lib.ignis_obs_window_close()
        assert f.c_held() == before + 64  # the table's 64, then the Python form
        assert f.san.reports == []
    assert f.san.checked_foreign - items == 2 + 2 * 70
    assert float(x[0]) == 70.0


class _SlowSanitizer(Sanitizer):
    """A sanitizer whose checks of an op let the GIL go for a while (as any Python code a held
    call runs may), once ``slow`` is set; ``inside`` is set in the first such check."""

    slow = False

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()

    def foreign_access(self, *args, **kwargs):
        if self.slow:
            self.inside.set()
            time.sleep(0.1)
        return super().foreign_access(*args, **kwargs)


def test_stop_waits_for_a_batch_another_thread_is_making():
    san = _SlowSanitizer()
    san.mode = "collect"
    f = Front(san=san)
    with f:
        x = _write_on_a(f)
        _backward_on_b(f, x, reps=3)  # three races with A's write, held
        before = f.san.checked_foreign
        san.slow = True
        t = threading.Thread(target=san.drain)  # another thread's entry point makes the batch...
        t.start()
        assert san.inside.wait(10)  # ...and is inside its first call when checking stops
    t.join()
    assert f.san.checked_foreign - before == 1 + 1 + 2 * 3  # every held call made, once
    assert len(f.san.reports) == 1 and f.san.reports[0].kind == "write-after-write race"


def _free_on_a_here(f: Front, base: int) -> None:
    f.stream = A
    f.lib.ignis_obs_trace_fire(5, 0, base, 0, 0)  # the caching allocator's free, the free's site


def _backward_thread_on_b(f: Front, x, y) -> None:
    with _window(f):  # the backward() call's site
        f.backward_thread(x, y, 1)


def test_a_free_after_the_backward_threads_ops_on_another_stream_takes_its_stack(monkeypatch):
    # The backward pass's ops on B are held as C values; the program then frees their memory
    # on A. The free races them and must be reported with its own stack, though the free is
    # held before the ops' calls are made.
    with frees_held(monkeypatch, Front) as f:
        x = _write_on_a(f)
        y = torch.ones(256)  # (on A too: B is seen only through the held C values)
        f.san.on_stream_synchronize(A)
        f.stream = B
        _backward_thread_on_b(f, x, y)
        _free_on_a_here(f, x.untyped_storage().data_ptr())
        found = f.san.reports
    frees = [e for e in found if e.second.get("op") == "free"]
    assert len(frees) == 1, [str(e) for e in found]
    assert "_free_on_a_here" in frees[0].second["stack"] and "_backward_thread_on_b" in frees[0].first["stack"]


class _Spawn(torch.autograd.Function):
    """An op whose backward runs ops on a thread with no Python frame (as a device's backward
    ops run on the autograd engine's thread)."""

    front: Front | None = None
    tensors: tuple = ()

    @staticmethod
    def forward(ctx, w):
        return w * 1

    @staticmethod
    def backward(ctx, g):
        _Spawn.front.backward_thread(*_Spawn.tensors, 3)
        return g


def _run_backward_here(w) -> None:
    _Spawn.apply(w).sum().backward()  # the backward() call's site


def test_a_real_backward_opens_its_window_with_its_call_site():
    with Front() as f:
        x = _write_on_a(f)
        f.stream = B
        w = torch.ones(4, requires_grad=True)
        _Spawn.front, _Spawn.tensors = f, (x, torch.ones(256))
        before = f.c_held()
        try:
            _run_backward_here(w)
        finally:
            _Spawn.front, _Spawn.tensors = None, ()
        assert f.c_held() == before + 3
        found = f.san.reports
    [e] = [e for e in found if "_write_on_a" in e.first["stack"]]
    assert "_run_backward_here" in e.second["stack"]


def test_a_wrapper_left_installed_by_another_patcher_makes_plain_calls():
    import torch.autograd as autograd
    import torch.autograd.graph as graph
    orig = graph._engine_run_backward
    try:
        with Front():
            ours = graph._engine_run_backward

            def other(*args, **kwargs):  # another tool's wrapper, put on after ours...
                return ours(*args, **kwargs)

            graph._engine_run_backward = autograd._engine_run_backward = other
        assert graph._engine_run_backward is other  # (ours could not be taken off)
        graph._engine_run_backward = autograd._engine_run_backward = ours  # ...and taken off after
        with Front() as f:
            assert graph._engine_run_backward.__wrapped__ is orig  # (the stale one passed over)
            f.stream = B
            x = torch.zeros(256)
            _Spawn.front, _Spawn.tensors = f, (x, torch.ones(256))
            before = f.c_held()
            try:
                _run_backward_here(torch.ones(4, requires_grad=True))
                assert f.c_held() == before + 3  # one window
                # The stale wrapper, called itself, opens none (its session is over).
                loss = _Spawn.apply(torch.ones(4, requires_grad=True)).sum()
                ours((loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True,
                     accumulate_grad=True)
                assert f.c_held() == before + 3  # the Python form
            finally:
                _Spawn.front, _Spawn.tensors = None, ()
            assert f.san.reports == []
    finally:
        graph._engine_run_backward = autograd._engine_run_backward = orig


def test_another_tools_wrapper_made_with_functools_wraps_stays_in_the_chain():
    import functools
    import torch.autograd as autograd
    import torch.autograd.graph as graph
    orig = graph._engine_run_backward
    calls = []
    try:
        with Front():
            ours = graph._engine_run_backward

            @functools.wraps(ours)  # (copies our wrapper's attributes onto it)
            def tool(*args, **kwargs):
                calls.append(1)
                return ours(*args, **kwargs)

            graph._engine_run_backward = autograd._engine_run_backward = tool  # left installed
        with Front() as f:
            assert graph._engine_run_backward.__wrapped__ is tool
            f.stream = B
            _Spawn.front, _Spawn.tensors = f, (torch.zeros(256), torch.ones(256))
            before = f.c_held()
            try:
                _run_backward_here(torch.ones(4, requires_grad=True))
            finally:
                _Spawn.front, _Spawn.tensors = None, ()
            assert calls == [1]  # the tool still runs
            assert f.c_held() == before + 3  # one window
        assert graph._engine_run_backward is tool  # put back as found
    finally:
        graph._engine_run_backward = autograd._engine_run_backward = orig


_EXIT_PROGRAM = """
import torch
from ignis.safety.frames import capture_frames
from ignis.safety.sanitizer import Sanitizer
from ignis.torch._frontend import TorchFrontEnd
san = Sanitizer()
san.mode = 'collect'
fe = TorchFrontEnd(san, device_type='cpu', stream_of=lambda t: 0x5A00, engine='observer')
fe.enable()
lib = fe._obs
assert lib.ignis_obs_checker() == 1
w = torch.ones(4, requires_grad=True)
(w * 2).sum().backward()
if BUSY:  # the checker thread woken, calls still held at exit
    x, y = torch.zeros(256), torch.ones(256)
    assert lib.ignis_obs_window_open(capture_frames(1), 0, 0x5A00) == 1
    assert lib.ignis_obs_frameless_ops((x, y), 1000, 0, 0) == 0
print('exiting without stopping the checks', flush=True)
"""


@pytest.mark.parametrize("busy", [False, True])
def test_a_program_that_exits_without_stopping_the_checker_thread_ends(tmp_path, busy):
    import os
    import subprocess
    import sys
    script = tmp_path / "exits.py"
    script.write_text(f"BUSY = {busy}\n" + _EXIT_PROGRAM)
    env = dict(os.environ, IGNIS_OBSERVER_CHECKER="1")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exiting without stopping the checks" in r.stdout


def test_stacks_of_equal_code_in_two_files_are_two_windows():
    # Code objects compare equal across files (the file is not part of it): a window must be
    # told by the code objects themselves, or the second file's backward() shows the first's.
    c1 = compile("pass\n", "first_file.py", "exec")
    c2 = compile("pass\n", "second_file.py", "exec")
    assert c1 == c2 and c1 is not c2
    with Front() as f:
        stacks = []
        for code in (c1, c2):
            x = _write_on_a(f)
            f.stream = B
            assert f.lib.ignis_obs_window_open(((code, 1),), 0, f.stream) == 1
            try:
                f.backward_thread(x, torch.ones(256), 1)  # races A's write
            finally:
                f.lib.ignis_obs_window_close()
            stacks.append(x)
        found = f.san.reports
    seconds = sorted(e.second["stack"] for e in found if "_write_on_a" in e.first["stack"])
    assert len(seconds) == 2
    assert "first_file.py" in seconds[0] and "second_file.py" in seconds[1]
