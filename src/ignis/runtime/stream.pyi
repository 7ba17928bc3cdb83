# Type stub of the compiled module ignis.runtime.stream (its source: src/ignis/runtime/stream.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Callable
from .event import Event
from .device import Device
__all__ = ['Stream']

def add_close_hook(method: Callable[['Stream'], None]) -> None:
    ...

class Stream:

    @property
    def handle(self) -> int:
        ...

    @property
    def device(self) -> Device:
        ...

    @property
    def id(self) -> int:
        ...
    ordering: str

    def __init__(self, device: Device | None=..., handle: int | None=..., *, owned: bool=..., keepalive: object=...) -> None:
        ...

    @classmethod
    def from_handle(cls, handle: int, device: Device | int=..., *, owner: object=...) -> Stream:
        ...

    def live_handle(self) -> int:
        ...

    @property
    def stale(self) -> bool:
        ...

    @property
    def is_closed(self) -> bool:
        ...

    def record(self, event: Event | None=..., *, timing: bool=...) -> Event:
        ...

    def wait(self, other: Event | Stream) -> None:
        ...

    def query(self) -> bool:
        ...

    def synchronize(self) -> None:
        ...

    def launch_host_func(self, fn: Callable[[], None]) -> None:
        ...

    def __cuda_stream__(self) -> tuple[int, int]:
        ...

    @property
    def closed(self) -> bool:
        ...

    def close(self) -> None:
        ...

    def __enter__(self) -> Stream:
        ...

    def __exit__(self, *exc: object) -> None:
        ...

    def __del__(self) -> None:
        ...

    def __repr__(self) -> str:
        ...
