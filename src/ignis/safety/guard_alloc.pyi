# Type stub of the compiled module ignis.safety.guard_alloc (its source: src/ignis/safety/guard_alloc.pyx).
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
    opts: dict[str, Any] | None
    lock: Any
    guards: dict[Any, Any]
    streams: dict[Any, Any]
    blocks: dict[Any, Any]
    torch: bool
    cupy: bool
    lib: Any
    problems: list[Any]
    groups: dict[Any, Any]
    tls: Any
    deferred: list[Any]
    last_live: float
    atexit: bool
    hooks: list[Any]
    saved: dict[str, Any]
    rs_ptrs: set
    tag: str
    capturing: dict[Any, Any]
    graph_blocks: dict[Any, Any]
    graph_free: dict[Any, Any]
    after_capture: list[Any]
    graph_alloc: Callable[[int, int], int] | None
    current_stream: Callable[[int], int] | None

    def __init__(self) -> None:
        ...
