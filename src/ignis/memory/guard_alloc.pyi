# Type stub of the compiled module ignis.memory.guard_alloc (its source: src/ignis/memory/guard_alloc.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
__all__ = ['State', 'state', 'setup', 'alloc', 'free', 'graph_begin', 'graph_end', 'drain_deferred']
state: State

def setup(guard_resource: object, stream: object) -> None:
    ...

def alloc(size: int, device: int, handle: int, tag: str | None=..., owner: object=...) -> int:
    ...

def free(ptr: int, size: int, device: int, handle: int, poisoned: bool=...) -> None:
    ...

def graph_begin(device: int, stream: int, pool: object) -> None:
    ...

def graph_end(device: int, stream: int) -> None:
    ...

def drain_deferred() -> None:
    ...

class State:

    @property
    def opts(self) -> dict[str, Any] | None:
        ...

    @property
    def lock(self) -> Any:
        ...

    @property
    def guards(self) -> dict[Any, Any]:
        ...

    @property
    def streams(self) -> dict[Any, Any]:
        ...

    @property
    def blocks(self) -> dict[Any, Any]:
        ...

    @property
    def torch(self) -> bool:
        ...

    @property
    def cupy(self) -> bool:
        ...

    @property
    def lib(self) -> Any:
        ...

    @property
    def problems(self) -> list[Any]:
        ...

    @property
    def groups(self) -> dict[Any, Any]:
        ...

    @property
    def tls(self) -> Any:
        ...

    @property
    def deferred(self) -> list[Any]:
        ...

    @property
    def last_live(self) -> float:
        ...

    @property
    def atexit(self) -> bool:
        ...

    @property
    def hooks(self) -> list[Any]:
        ...

    @property
    def saved(self) -> dict[str, Any]:
        ...

    @property
    def rs_ptrs(self) -> set:
        ...

    @property
    def tag(self) -> str:
        ...

    @property
    def capturing(self) -> dict[Any, Any]:
        ...

    @property
    def graph_blocks(self) -> dict[Any, Any]:
        ...

    @property
    def graph_free(self) -> dict[Any, Any]:
        ...

    @property
    def after_capture(self) -> list[Any]:
        ...

    @property
    def graph_alloc(self) -> Callable[[int, int], int] | None:
        ...

    @property
    def current_stream(self) -> Callable[[int], int] | None:
        ...

    def __init__(self) -> None:
        ...

    def reset(self) -> None:
        ...

    def configure(self, opts: dict) -> None:
        ...

    def use_framework(self, name: str) -> None:
        ...

    def bind(self, **slots: object) -> None:
        ...

    def note_live_check(self, now: float) -> None:
        ...

    def take_problems(self) -> list:
        ...

    def mark_atexit(self) -> None:
        ...
