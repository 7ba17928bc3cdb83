# Type stub of the compiled module ignis.memory.block (its source: src/ignis/memory/block.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any, ClassVar
from .types import BlockId, BlockState
from ..runtime.stream import Stream
__all__ = ['DeviceBlock']

class DeviceBlock:
    ptr: int
    alloc_stream: Stream
    bytes: int
    requested: int
    tag: str
    generation: int
    state: BlockState
    align: ClassVar[int]

    def __init__(self, ptr: int, alloc_stream: Stream, nbytes: int, requested: int, tag: str, generation: int, impl: Any=...) -> None:
        ...

    @property
    def device_ordinal(self) -> int:
        ...

    @property
    def id(self) -> BlockId:
        ...

    def transition(self, new: BlockState) -> None:
        ...

    def __repr__(self) -> str:
        ...
