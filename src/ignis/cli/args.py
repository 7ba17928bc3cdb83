"""Argument types shared by the command-line modules: ``ordinal`` (a device
ordinal), ``positive_int``, and ``int_arg`` to make others."""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["int_arg", "ordinal", "positive_int"]


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
