"""The checks that ``ignis run`` and the pytest plugin put around a program: one ``Checks``.

- ``sanitize``: the sanitizer in collect mode, for Ignis's tracked uses and, once
  the program imports torch (at once if it has), for PyTorch's ops on CUDA tensors
  (``ignis.torch``).
- ``guard``: every device's current resource becomes a debug guard over a fresh
  pool (canaries, poison, quarantine), and so do PyTorch's and CuPy's allocators
  once the program imports them.
- ``leaks``: every array is tracked with its allocation site (``MemoryContract``).
- ``ordering``: the ordering policy to set (None keeps the program's).

``start()`` turns them on; ``take()`` returns the problems found since the previous
``take()`` (the guards checked first, so a damaged canary is seen now): the pytest
plugin calls it after each phase of each test, so each report goes with the test
that caused it, and ``take_final()`` at the end (the guards' quarantines flushed
first). ``settle()`` waits for the GPU work the program left queued;
``finish_guard()`` is ``ignis run``'s final check of the guard, with its section of
the report; ``stop()`` turns the sanitizer and the PyTorch front end off.

Reports from the sanitizer and the guard are grouped by kind and sites, each with a
count; ``take()`` starts the grouping afresh, so one test's reports never hide in
another's group.
"""

from __future__ import annotations

import io
import sys
from typing import Any

__all__ = ["Checks", "format_problem"]


def format_problem(i: int, err: BaseException, how: str = "") -> str:
    """One problem as a report shows it: ``--- i: Kind (seen n times): message``."""
    n = getattr(err, "count", 1)
    return f"--- {i}: {type(err).__name__}{how}{f' (seen {n} times)' if n > 1 else ''}: {err}"


class Checks:
    """The checks asked for, around one program (see the module's description)."""

    def __init__(self, *, sanitize: bool = False, guard: bool = False, leaks: bool = False,
                 ordering: str | None = None) -> None:
        self.sanitize, self.guard, self.leaks, self.ordering = sanitize, guard, leaks, ordering
        self._tguard: Any = None
        self.started = False

    def start(self) -> None:
        """Turn on the checks asked for."""
        import ignis as ig
        if self.guard:
            from ignis.torch import _guard as tguard
            for i in range(ig.device_count()):
                tguard.guard_resource(i)
            tguard.install_on_import()
            self._tguard = tguard
        if self.leaks:
            ig.contract.track_all = True
            ig.contract.capture_sites = True
        if self.sanitize:
            ig.sanitizer.enable("collect")
            from ignis.torch import _hook
            _hook.enable_on_import("collect")
        if self.ordering:
            ig.set_ordering(self.ordering)
        self.started = True

    def take(self) -> list[Any]:
        """The problems found since the previous ``take()``, grouped (each with ``count``)."""
        found: list[Any] = []
        if self._tguard is not None:
            self._tguard.check(raise_=False)  # what it finds goes to the lists below
            found += self._tguard.clear_reports()
        if self.sanitize:
            from ignis.safety.sanitizer import sanitizer
            found += sanitizer.clear()
        return found

    def take_final(self) -> tuple[list[Any], list[str]]:
        """The last ``take()``, after the guards' quarantines are flushed (each block's poison
        and canaries checked as it leaves): the problems, and a line for each step of that
        flush that failed (what it was to check is unchecked)."""
        failed: list[str] = []
        if self._tguard is not None:
            for ordinal, g in sorted(self._tguard.guards().items()):
                try:
                    g.flush(raise_=False)
                except Exception as e:
                    failed.append(f"the guard's flush of the quarantine on device {ordinal}: "
                                  f"{type(e).__name__}: {e}")
        return self.take(), failed

    def settle(self) -> None:
        """Wait for the GPU work PyTorch still has queued (the program is over: what is freed
        from now on cannot race its own work)."""
        if self.sanitize:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.synchronize()

    def finish_guard(self) -> tuple[str, int, bool]:
        """The guard's final check (quarantine flushed, everything checked): its section of
        the report, the problems it counts, and whether any of them is a report."""
        if self._tguard is None:
            return "", 0, False
        buf = io.StringIO()
        n = self._tguard.finish(buf)
        return buf.getvalue(), n, bool(self._tguard.reports())

    def stop(self, out: Any) -> None:
        """Turn the sanitizer and the PyTorch front end off (what cannot be undone, the guard as
        PyTorch's allocator, stays); a problem doing so is printed to ``out``."""
        if not self.sanitize:
            return
        import ignis.torch as igt
        from ignis.safety.sanitizer import sanitizer
        from ignis.torch import _hook
        _hook.remove()
        try:
            igt.disable()
        except RuntimeError as e:  # the program left its own dispatch mode entered above ours
            print(f"ignis: {e}", file=out)
        sanitizer.clear()
        sanitizer.disable()
