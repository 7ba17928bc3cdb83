# Type stub of the compiled module ignis.memory.block (its source: src/ignis/memory/block.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any, ClassVar
from .types import BlockId, BlockState
from ..runtime.stream import Stream
__all__ = ['DeviceBlock', 'Generation', 'next_generation']

def next_generation() -> int:
    ...

class Generation(int):
    __slots__: ClassVar[tuple[str, ...]]

    @staticmethod
    def next() -> Generation:
        ...

    def __repr__(self) -> str:
        ...

class DeviceBlock:

    @property
    def ptr(self) -> int:
        ...

    @property
    def alloc_stream(self) -> Stream:
        ...

    @property
    def bytes(self) -> int:
        ...

    @property
    def requested(self) -> int:
        ...

    @property
    def tag(self) -> str:
        ...

    @property
    def generation(self) -> int:
        ...
    align: ClassVar[int]

    def __init__(self, ptr: int, alloc_stream: Stream, nbytes: int, requested: int, tag: str, generation: int, impl: Any=...) -> None:
        ...

    @property
    def state(self) -> BlockState:
        ...

    @property
    def device_ordinal(self) -> int:
        ...

    @property
    def id(self) -> BlockId:
        ...

    def transition(self, new: BlockState) -> None:
        ...

    def clean_on(self, stream: Stream) -> bool:
        ...

    def hazard_record(self) -> tuple[Stream | None, int, dict[Stream, int] | None]:
        ...

    def lend_record(self) -> None:
        ...

    def __repr__(self) -> str:
        ...
