# Type stub of the compiled module ignis.memory.guard_base (its source: src/ignis/memory/guard_base.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from .resource import DeviceMemoryResource
__all__ = ['GuardBase', 'fill_bytes']

def fill_bytes(backend: object, ptr: int, value: int, nbytes: int, handle: int) -> None:
    ...

class GuardBase(DeviceMemoryResource):
    upstream: DeviceMemoryResource
    canary_bytes: int
    poison: int
    canary: int
    quarantine_count: int | None
    quarantine_bytes: int | None
    capture_stacks: bool
