"""What the command-line modules share: the parser class (``Parser``: a command's usage
errors show that command's usage), argument types (``ordinal``, a device ordinal;
``positive_int``; ``int_arg`` to make others) and ``file_problem`` (why a path given
as an input file cannot be read: the commands exit 2 with it, as Python does for a
missing script); ``os_error_text``, an ``OSError`` as a plain line)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Sequence

__all__ = ["Parser", "int_arg", "ordinal", "positive_int", "file_problem", "os_error_text", "MISSING_FILE_STATUS"]

MISSING_FILE_STATUS = 2  # an input file that is missing or not a file (Python's status for a missing script)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose sub-commands own their usage errors: an option the
    command does not know is reported with the command's usage (``usage: ignis run ...``),
    not the top-level one's. ``extras_into``: the name of a list argument (``ignis run``'s
    ``-m MODULE ARGS...``) that, once given, takes what the parser did not recognize,
    as ``python -m`` gives the module every argument after its name. ``check_args``: called
    with the parsed namespace, to refuse what the arguments cannot mean together
    (with ``self.error``: the command's usage, status 2)."""

    extras_into: str | None = None
    check_args: Callable[[argparse.Namespace], None] | None = None

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        """``ArgumentParser.parse_known_args``; a command's parser refuses what it does not know."""
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self.extras_into and getattr(ns, self.extras_into, None) is not None:
            getattr(ns, self.extras_into).extend(extras)
            extras = []
        if extras and self._is_command():
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        if self.check_args is not None:
            self.check_args(ns)
        return ns, extras

    def _is_command(self) -> bool:
        # a sub-command's parser has no sub-commands of its own (``snapshot`` has: its actions
        # report their own extras)
        return " " in self.prog and not any(isinstance(a, argparse._SubParsersAction) for a in self._actions)


def int_arg(what: str, lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[lo, hi)``, else a usage error naming ``what``."""

    def parse(text: str) -> int:
        """``text`` as an int in range, else an ``argparse.ArgumentTypeError`` naming what was expected."""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo or (hi is not None and value >= hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


ordinal = int_arg("a device ordinal (0, 1, ...)", 0)
positive_int = int_arg("a positive integer", 1)


def file_problem(path: str, what: str = "file") -> str | None:
    """Why ``path`` cannot be read as an input ``what`` ("no such file: x", "x is a directory,
    not a file"), or None when it is a file."""
    if os.path.isfile(path):
        return None
    if os.path.isdir(path):
        return f"{path} is a directory, not a {what}"
    if os.path.lexists(path):
        return f"{path} is not a regular file (a {what} was expected)"
    return f"no such {what}: {path}"


def os_error_text(e: OSError) -> str:
    """An ``OSError`` as one plain line ("cannot read x: Permission denied"), without the
    ``[Errno N]`` of its ``str()``."""
    what = e.strerror or type(e).__name__
    return f"cannot read {e.filename}: {what}" if e.filename else what
