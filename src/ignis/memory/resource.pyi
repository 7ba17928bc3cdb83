# Type stub of the compiled module ignis.memory.resource (its source: src/ignis/memory/resource.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from ..runtime.device import DeviceState
from typing import NoReturn
from ..runtime import Device
from ..runtime.stream import Stream
from .._types import Access
from .types import BlockId
from .block import DeviceBlock
__all__ = ['DeviceMemoryResource', 'TrackedResource', 'EventPool', 'check_request']

def check_request(nbytes: Any, stream: Any) -> None:
    ...

def driver_calls() -> dict[str, int]:
    ...

def event_pool(device: Device) -> EventPool:
    ...

class ResourceLock:

    def __init__(self) -> None:
        ...

    def acquire(self, blocking: bool=..., timeout: float=...) -> bool:
        ...

    def release(self) -> None:
        ...

    def locked(self) -> bool:
        ...

    def __enter__(self) -> bool:
        ...

    def __exit__(self, *exc: object) -> None:
        ...

    def __reduce__(self) -> NoReturn:
        ...

    def __repr__(self) -> str:
        ...

class ReentrantLock:

    def __init__(self) -> None:
        ...

    def take(self) -> int:
        ...

    def give(self) -> int:
        ...

    def held(self) -> bool:
        ...

    def __enter__(self) -> None:
        ...

    def __exit__(self, *exc: object) -> None:
        ...

    def __reduce__(self) -> NoReturn:
        ...

class EventPool:

    @property
    def generation(self) -> int:
        ...

    @property
    def state(self) -> DeviceState:
        ...

    def __init__(self, device: Device) -> None:
        ...

    @property
    def stale(self) -> bool:
        ...

    def get(self) -> int:
        ...

    def put(self, event: int) -> None:
        ...

    def close(self) -> None:
        ...

class DeviceMemoryResource:

    @property
    def device(self) -> Device:
        ...

    def __init__(self, device: Device | int | None=...) -> None:
        ...

    def allocate(self, nbytes: int, stream: Stream | None=..., tag: str=...) -> DeviceBlock:
        ...

    def deallocate(self, block: DeviceBlock) -> None:
        ...

    @property
    def device_ordinal(self) -> int:
        ...

    @property
    def bytes_outstanding(self) -> int:
        ...

    def reap_pending(self) -> None:
        ...

    @property
    def supports_block_use_tracking(self) -> bool:
        ...

    def live_blocks(self) -> list[DeviceBlock]:
        ...

    def holds(self, block: DeviceBlock) -> bool:
        ...

    def record_block_use(self, block: DeviceBlock | BlockId, stream: Stream) -> None:
        ...

    def note_use(self, block: DeviceBlock, stream: Stream, access: Access, span: tuple | None=...) -> None:
        ...

    def prepare_block_use(self, block: DeviceBlock | BlockId, stream: Stream, access: Access, span: tuple | None=...) -> None:
        ...

    def finish_block_use(self, block: DeviceBlock | BlockId, stream: Stream, access: Access) -> None:
        ...

    def memory_numbers(self) -> dict[str, int]:
        ...

    def close(self) -> None:
        ...

    def __repr__(self) -> str:
        ...

class TrackedResource(DeviceMemoryResource):

    @property
    def cross_stream_waits(self) -> int:
        ...

    def __init__(self, device: Device | int | None=...) -> None:
        ...

    @property
    def supports_block_use_tracking(self) -> bool:
        ...

    def live_blocks(self) -> list[DeviceBlock]:
        ...

    def holds(self, block: DeviceBlock) -> bool:
        ...

    def prepare_block_use(self, block: DeviceBlock | BlockId, stream: Stream, access: Access, span: tuple | None=...) -> None:
        ...

    def finish_block_use(self, block: DeviceBlock | BlockId, stream: Stream, access: Access) -> None:
        ...

    def record_block_use(self, block: DeviceBlock | BlockId, stream: Stream) -> None:
        ...
