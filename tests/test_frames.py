"""Cheap Python stacks (ignis.safety.frames, compiled): what a capture keeps and where it starts."""

from __future__ import annotations

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
