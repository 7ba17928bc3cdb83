# Type stub of the compiled module ignis.memory.guard_base (its source: src/ignis/memory/guard_base.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from .block import DeviceBlock
from .resource import DeviceMemoryResource
from ..runtime.stream import Stream
__all__ = ['GuardBase', 'fill_bytes', 'MAX_BATCH']

def fill_bytes(backend: object, ptr: int, value: int, nbytes: int, handle: int) -> None:
    ...
MAX_BATCH: int

class GuardBase(DeviceMemoryResource):
    upstream: DeviceMemoryResource
    canary_bytes: int
    poison: int
    canary: int
    quarantine_count: int | None
    quarantine_bytes: int | None
    capture_stacks: bool
    stack_depth: int
    reused: int
    formatted_fresh: int
    resized: int
    batch: int
    ready_limit: int

    def allocate(self, nbytes: int, stream: Stream | None=..., tag: str=..., frames: tuple | None=...) -> DeviceBlock:
        ...

    def free_fast(self, block: DeviceBlock, poisoned: bool=...) -> None:
        ...
