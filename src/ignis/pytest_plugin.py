"""The pytest plugin: a test suite under Ignis's checks, each problem failing the test that caused it.

    pytest --ignis-sanitize tests/      # the sanitizer (collect mode), and the PyTorch front end once torch is imported
    pytest --ignis-guard tests/         # the debug guard on every device, and as PyTorch's and CuPy's allocator
    pytest -p ignis.pytest_plugin ...   # where the plugin is not installed (installed, its entry point loads it)

Design:
- Registered through the ``pytest11`` entry point ``ignis.pytest_plugin`` (the
  module's own name, so ``-p ignis.pytest_plugin`` and ``-p no:ignis.pytest_plugin``
  name the same plugin). Without its options it does nothing and turns nothing on.
- The checks are ``ignis run``'s (``ignis.cli.checks.Checks``: ``--ignis-sanitize``
  is ``ignis run --sanitize``, ``--ignis-guard`` is ``--guard``), turned on when
  pytest is configured, before the test modules are imported.
- After each phase of each test (setup, call, teardown), the problems found since
  the previous phase are taken (the guard first checks every guarded block) and
  fail that phase: a passing call becomes a failure, a setup or teardown an
  error, whose text is the problems as ``ignis run`` prints them; a phase that
  failed on its own gets them as a section of its report. Reports are grouped per
  phase, so a test never hides in another's group.
- At the session's end (after every other ``pytest_sessionfinish``), PyTorch's
  queued work is waited for, the guard's quarantine is flushed and checked, and
  what is found then belongs to no test: the terminal summary shows it and the
  session fails (exit status 1). The summary also names the tests that failed on
  Ignis's reports.
- Stacks in reports show the tests' frames: pytest's and pluggy's are passed over
  as Ignis's own are.
"""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure"]

_NAME = "ignis-checks"


def pytest_addoption(parser: Any) -> None:
    """The plugin's options: ``--ignis-sanitize``, ``--ignis-guard``, ``--ignis-ordering``."""
    group = parser.getgroup("ignis", "Ignis's checks of GPU memory (each report fails the test that caused it)")
    group.addoption("--ignis-sanitize", action="store_true", default=False,
                    help="run the tests under Ignis's sanitizer (races between streams, uses after free, reuse "
                         "races, uninitialized reads) in Ignis's tracked uses and, once torch is imported, in "
                         "PyTorch's ops on CUDA tensors, as `ignis run --sanitize`")
    group.addoption("--ignis-guard", action="store_true", default=False,
                    help="run the tests under Ignis's debug guard (canaries, poison, quarantine) on every device "
                         "and as PyTorch's and CuPy's allocator, as `ignis run --guard`")
    group.addoption("--ignis-ordering", choices=("auto", "manual"), default=None,
                    help="the ordering policy of Ignis's tracked uses (default: the tests' own; 'manual' with "
                         "--ignis-sanitize checks the tests' synchronization instead of supplying it)")


def pytest_configure(config: Any) -> None:
    """Turn the checks on when an option asks for them."""
    sanitize, guard = config.getoption("ignis_sanitize"), config.getoption("ignis_guard")
    if (sanitize or guard) and not config.pluginmanager.has_plugin(_NAME):
        config.pluginmanager.register(IgnisChecks(sanitize=sanitize, guard=guard,
                                                  ordering=config.getoption("ignis_ordering")), _NAME)


def _pass_over_test_machinery() -> None:
    """pytest's and pluggy's frames are not the tests' own (in reports' stacks)."""
    import _pytest
    import pluggy

    from .safety.frames import add_library_dir
    for mod in (pytest, _pytest, pluggy):
        add_library_dir(os.path.dirname(os.path.abspath(mod.__file__ or "")), machinery=True)


def _text(found: list[Any], where: str) -> str:
    from .cli.checks import format_problem
    total = sum(getattr(e, "count", 1) for e in found)
    lines = [f"ignis: {len(found)} problem(s) found {where} ({total} report(s), grouped by kind and sites)"]
    lines += [format_problem(i, e) for i, e in enumerate(found, 1)]
    return "\n".join(lines)


class IgnisChecks:
    """The plugin's state while the checks are on: the checks, and what they found where."""

    def __init__(self, *, sanitize: bool, guard: bool, ordering: str | None) -> None:
        from .cli.checks import Checks
        _pass_over_test_machinery()
        self.checks = Checks(sanitize=sanitize, guard=guard, ordering=ordering)
        self.checks.start()
        self.failed_tests: dict[str, int] = {}  # test id -> problems found in it
        self.at_end: list[Any] = []
        self.end_failures: list[str] = []
        self.end_text = ""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
        """Fail the phase that just ran with the problems found during it."""
        outcome = yield
        try:
            found = self.checks.take()
        except Exception as e:  # a check that cannot run: this phase cannot be said clean
            found = [e]
        if not found:
            return
        rep = outcome.get_result()
        phase = {"setup": "during its setup", "call": "during the test", "teardown": "during its teardown"}
        text = _text(found, phase.get(call.when, f"during its {call.when}"))
        self.failed_tests[item.nodeid] = self.failed_tests.get(item.nodeid, 0) + len(found)
        if rep.failed:  # its own failure first, then Ignis's reports
            rep.sections.append((f"ignis: problems found {phase.get(call.when, call.when)}", text))
        else:
            if hasattr(rep, "wasxfail"):
                del rep.wasxfail
            rep.outcome = "failed"
            rep.longrepr = text

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        """The final checks; what they find fails the session."""
        import gc

        from .array.nvarray import drain_deferred
        checks = self.checks
        checks.settle()
        gc.collect()
        drain_deferred()
        try:
            self.at_end, self.end_failures = checks.take_final()
        except Exception as e:
            self.end_failures.append(f"{type(e).__name__}: {e}")
        buf = io.StringIO()
        try:
            checks.stop(buf)
        except Exception as e:
            buf.write(f"{type(e).__name__}: {e}\n")
        self.end_failures += [ln for ln in buf.getvalue().splitlines() if ln]
        if (self.at_end or self.end_failures) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """What the checks found, by test, and at the session's end."""
        tr = terminalreporter
        tr.write_sep("=", "ignis")
        what = " and ".join(n for n, on in (("sanitizer", self.checks.sanitize), ("guard", self.checks.guard)) if on)
        if self.failed_tests:
            tr.write_line(f"ignis {what}: {len(self.failed_tests)} test(s) failed on the problems found in them:")
            for nodeid, n in self.failed_tests.items():
                tr.write_line(f"  {nodeid}: {n} problem(s)")
        else:
            tr.write_line(f"ignis {what}: no test had a problem")
        for line in self.end_failures:
            tr.write_line(f"ignis: the final check failed (counted as a problem: what it was to check is "
                          f"unchecked): {line}", red=True)
        if self.at_end:
            tr.write_line(_text(self.at_end, "at the end of the session, after the last test (the session fails)"),
                          red=True)
