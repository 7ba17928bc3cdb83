# Type stub of the compiled module ignis.memory.guard_base (its source: src/ignis/memory/guard_base.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from .block import DeviceBlock
from .resource import DeviceMemoryResource
from ..runtime.stream import Stream
__all__ = ['GuardBase', 'fill_bytes', 'MAX_BATCH', 'guard_timing', 'check_batches_direct']

def guard_timing(on: bool) -> dict:
    ...

def check_batches_direct(on: bool) -> bool:
    ...

def fill_bytes(backend: object, ptr: int, value: int, nbytes: int, handle: int) -> None:
    ...
MAX_BATCH: int

class GuardBase(DeviceMemoryResource):

    @property
    def upstream(self) -> DeviceMemoryResource:
        ...

    @property
    def canary_bytes(self) -> int:
        ...

    @property
    def poison(self) -> int:
        ...

    @property
    def canary(self) -> int:
        ...

    @property
    def quarantine_count(self) -> int | None:
        ...

    @property
    def quarantine_bytes(self) -> int | None:
        ...
    capture_stacks: bool

    @property
    def stack_depth(self) -> int:
        ...

    @property
    def reused(self) -> int:
        ...

    @property
    def formatted_fresh(self) -> int:
        ...

    @property
    def resized(self) -> int:
        ...

    @property
    def batch(self) -> int:
        ...
    ready_limit: int

    def allocate(self, nbytes: int, stream: Stream | None=..., tag: str=..., frames: tuple | None=...) -> DeviceBlock:
        ...

    def free_fast(self, block: DeviceBlock, poisoned: bool=...) -> None:
        ...
