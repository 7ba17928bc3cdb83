# Type stub of the compiled module ignis.memory.pool (its source: src/ignis/memory/pool.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from ..runtime import Device
from ..runtime.stream import Stream
from .resource import DeviceMemoryResource
from .resource import TrackedResource
from .block import DeviceBlock
__all__ = ['PoolResource']

class PoolResource(TrackedResource):

    @property
    def upstream(self) -> DeviceMemoryResource:
        ...

    def __init__(self, upstream: DeviceMemoryResource | None=..., *, device: Device | int | None=...) -> None:
        ...

    def allocate(self, nbytes: int, stream_: Stream | None=..., tag: str=...) -> DeviceBlock:
        ...

    def deallocate(self, block_: DeviceBlock) -> None:
        ...

    def trim(self) -> int:
        ...

    @property
    def bytes_outstanding(self) -> int:
        ...

    @property
    def bytes_reserved(self) -> int:
        ...

    @property
    def bytes_cached(self) -> int:
        ...

    def memory_numbers(self) -> dict[str, int]:
        ...

    def reap_pending(self) -> None:
        ...

    def segments(self) -> list[dict[str, Any]]:
        ...

    def small_block(self, block: DeviceBlock) -> bool:
        ...

    def close(self) -> None:
        ...

    def __repr__(self) -> str:
        ...
