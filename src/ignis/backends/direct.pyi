# Type stub of the compiled module ignis.backends.direct (its source: src/ignis/backends/direct.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
__all__ = ['DirectCalls']

class DirectCalls:

    @property
    def backend(self) -> Any:
        ...

    @property
    def streams(self) -> dict[Any, Any]:
        ...

    @property
    def events(self) -> dict[Any, Any]:
        ...

    @property
    def current(self) -> Any:
        ...

    @property
    def epoch(self) -> list[int] | None:
        ...

    @property
    def gates(self) -> tuple[Any, ...]:
        ...

    @property
    def launch_gates(self) -> tuple[Any, ...]:
        ...

    @property
    def entry_points(self) -> dict[Any, Any]:
        ...

    def __init__(self, backend: object, streams: dict, events: dict, current: object, epoch: list | None, gates: tuple, launch_gates: tuple, raw: tuple, entry_points: dict | None=...) -> None:
        ...

    @property
    def raw(self) -> tuple:
        ...

    def with_gates(self, backend: object, gates: tuple, launch_gates: tuple) -> DirectCalls:
        ...

    def is_open(self) -> bool:
        ...

    def __repr__(self) -> str:
        ...
