"""Cheap Python stacks (ignis.safety.frames, compiled): what a capture keeps and where it starts."""

from __future__ import annotations

import os
import sys
import threading

from ignis.safety import frames
from ignis.safety.frames import capture_frames, format_frames, resolve, sites


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return i
    raise AssertionError(marker)


def _helper(skip: int) -> tuple:
    return capture_frames(skip)  # HELPER-CALL


def test_a_capture_starts_at_the_frame_skip_names():
    here = sys._getframe().f_code
    got = capture_frames(1)  # CAPTURE-HERE
    assert got[0] == (here, _line_of("# CAPTURE-HERE"))
    inner = _helper(1)  # frame 1: the helper itself
    assert inner[0] == (_helper.__code__, _line_of("# HELPER-CALL"))
    outer = _helper(2)  # frame 2: the helper's caller  # OUTER-CALL
    assert outer[0] == (here, _line_of("# OUTER-CALL"))
    assert outer[1:len(inner) - 1] == inner[2:]  # the same frames further out


def test_a_capture_keeps_only_user_frames_and_at_most_limit():
    got = capture_frames(1, 2)
    assert len(got) == 2
    assert all(frames.is_user_file(co.co_filename) for co, _ in capture_frames(1, 64))


def test_each_capture_has_the_line_of_its_own_call():
    got = [capture_frames(1, 1)[0][1] for _ in range(2)]  # LOOP-A
    other = capture_frames(1, 1)[0][1]  # LOOP-B
    assert got == [_line_of("# LOOP-A")] * 2 and other == _line_of("# LOOP-B")


def test_a_thread_without_user_frames_takes_the_main_threads():
    res = []

    def library_only() -> None:
        res.append(capture_frames(99))  # skips every frame of its own thread, as if none were the user's

    t = threading.Thread(target=library_only)
    t.start()  # MAIN-STARTS
    t.join()  # MAIN-WAITS
    assert res[0] and res[0][0][0] is sys._getframe().f_code  # where the main thread was meanwhile
    assert res[0][0][1] in (_line_of("# MAIN-STARTS"), _line_of("# MAIN-WAITS"))


def test_a_capture_formats_and_keys_as_file_line_pairs():
    got = capture_frames(1, 1)  # FORMAT-HERE
    assert resolve(got)[0] == (__file__, _line_of("# FORMAT-HERE"), "test_a_capture_formats_and_keys_as_file_line_pairs")
    assert sites(got) == ((__file__, _line_of("# FORMAT-HERE")),)
    assert "FORMAT-HERE" in format_frames(got)


_MOVER = '''
import _thread, gc, sys, threading
from ignis.safety.frames import capture_frames

go, at_first, at_second = (_thread.allocate_lock() for _ in range(3))
for lock in (go, at_first, at_second):
    lock.acquire()
armed, result, moved = [False], [], []


def _materialize():  # the caller's frame objects made now, not by the other thread's walk
    f = sys._getframe(1)
    while f is not None:
        f = f.f_back


def first(block):  # called at the main thread's first line: parks there when asked
    _materialize()
    if block:
        at_first.release()
        go.acquire(timeout=10)
        return None
    return capture_frames(1)


def second():  # called at the main thread's next line: parks there
    _materialize()
    at_second.release()
    go.acquire(timeout=10)


def _collecting(phase, info):  # in the other thread's capture: the main thread moves on meanwhile
    if phase == "start" and armed[0] and threading.current_thread().name == "capturer":
        armed[0] = False
        go.release()
        moved.append(at_second.acquire(timeout=10))


def capturer():
    capture_frames(1)  # this thread's own codes decided first
    at_first.acquire()
    gc.callbacks.append(_collecting)
    keep = [[] for _ in range(500)]  # garbage enough for a collection at every allocation
    gc.set_threshold(1)
    armed[0] = True
    try:
        result.append(capture_frames(1))  # no user frame on this thread: the main thread's are taken
    finally:
        gc.set_threshold(700)
        gc.callbacks.remove(_collecting)
        armed[0] = False
        go.release()
    del keep
'''


def _mover_user(mover, block):
    r = mover.first(block)  # MOVER-FIRST
    if block:
        mover.second()  # MOVER-SECOND
    return r


def test_a_stack_taken_while_its_thread_moves_on_is_not_kept_for_the_old_place(tmp_path):
    # Another thread takes the main thread's frames; the main thread moves on while the capture
    # runs (a collection in it lets it): what was captured must not be interned under the
    # instruction the walk saw, or every later capture there would report the newer line.
    import importlib.util
    (tmp_path / "ignis_test_mover.py").write_text(_MOVER)
    frames.add_library_dir(str(tmp_path))
    spec = importlib.util.spec_from_file_location("ignis_test_mover", tmp_path / "ignis_test_mover.py")
    mover = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mover)
    _mover_user(mover, False)  # this code decided as the user's
    t = threading.Thread(target=mover.capturer, name="capturer")
    t.start()
    got = [_mover_user(mover, block) for block in (True, False)]  # both from one place: one stack
    t.join(timeout=30)
    assert mover.moved == [True] and mover.result
    assert got[1][0] == (_mover_user.__code__, _line_of("# MOVER-FIRST"))


def _by_frame_objects(f, limit: int = frames.MAX_FRAMES) -> tuple:
    """What a capture from frame ``f`` outward must hold, read from Python's frame objects."""
    out = []
    while f is not None and len(out) < limit:
        if frames.is_user_file(f.f_code.co_filename):
            out.append((f.f_code, f.f_lineno))
        f = f.f_back
    return tuple(out)


def test_a_walk_over_the_interpreters_frame_records_gives_what_the_frame_objects_say(tmp_path):
    # A library's frames (passed over) between the user's, a generator, a comprehension, a
    # method, a lambda, an exception handler, deep recursion, and code captured the first time
    # (decided through the frame objects) then again (the interpreter's records, where the
    # interpreter has them): every capture equals the frame objects' reading, and a capture
    # from the same place is the same object.
    lib = tmp_path / "walklib"
    lib.mkdir()
    (lib / "walklib_mod.py").write_text(
        "def through(n, fn):\n"
        "    return through(n - 1, fn) if n else fn()\n")
    sys.path.insert(0, str(lib))
    frames.add_library_dir(str(lib))
    try:
        import walklib_mod

        def here(skip: int = 1) -> tuple:
            got = capture_frames(skip + 1)
            want = _by_frame_objects(sys._getframe(skip))
            assert got == want
            return got

        def gen():
            yield here()
            yield here()

        class K:
            def m(self):
                return [here() for _ in range(2)]

        def handler():
            try:
                raise KeyError
            except KeyError:
                return here()

        def deep(n):
            return deep(n - 1) if n else here()

        for _ in range(2):
            walklib_mod.through(12, here)
            list(gen())
            K().m()
            (lambda: here())()
            handler()
            deep(30)
        fresh = compile("def f(h):\n    return h()\n", str(tmp_path / "fresh_user.py"), "exec")
        ns: dict = {}
        exec(fresh, ns)
        first, second = [ns["f"](here) for _ in range(2)]
        assert first is second  # interned: one tuple for one place
    finally:
        sys.path.remove(str(lib))
        frames._library.remove(str(lib) + os.sep)
        frames._machinery[:] = [p for p in frames._machinery if p != str(lib) + os.sep]


def test_a_main_thread_without_python_frames_leaves_a_threads_capture_its_own(tmp_path):
    # The main thread runs C code only (an embedding host that went back to C++): a thread whose
    # own frames are all a library's gets an empty capture (never None) and still reads
    # last_from_library() as its own walk found it, for every limit.
    import _thread
    import itertools
    import operator
    import time

    lib = tmp_path / "cmainlib"
    lib.mkdir()
    (lib / "cmainlib_mod.py").write_text(
        "from ignis.safety.frames import capture_frames, last_from_library\n"
        "def capture(limit, out):\n"
        "    out.append((capture_frames(1, limit), last_from_library()))\n")
    sys.path.insert(0, str(lib))
    frames.add_library_dir(str(lib))
    ready = threading.Event()
    try:
        import cmainlib_mod
        # A thread with no Python frame of its own becomes "the main thread" for the module,
        # then sleeps in C.
        _thread.start_new_thread(any, (itertools.starmap(operator.call, [
            (frames._after_fork_in_child,), (ready.set,), (time.sleep, 1.0)]),))
        assert ready.wait(5)
        got: list = []
        for limit in (6, 9):
            t = threading.Thread(target=cmainlib_mod.capture, args=(limit, got))
            t.start()
            t.join()
        assert got == [((), True), ((), True)]
    finally:
        frames._after_fork_in_child()  # this (the real main) thread is the main thread again
        sys.path.remove(str(lib))
        frames._library.remove(str(lib) + os.sep)
        frames._machinery[:] = [p for p in frames._machinery if p != str(lib) + os.sep]
