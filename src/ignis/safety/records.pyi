# Type stub of the compiled module ignis.safety.records (its source: src/ignis/safety/records.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from typing import Iterator

def addr_of(base: Any) -> int:
    ...

class _Rec:

    @property
    def sid(self) -> int:
        ...

    @property
    def stream_id(self) -> int | str:
        ...

    @property
    def epoch(self) -> int:
        ...

    @property
    def kind(self) -> str:
        ...

    @property
    def lo(self) -> int:
        ...

    @property
    def hi(self) -> int:
        ...

    @property
    def op(self) -> str:
        ...

    @property
    def frames(self) -> Any:
        ...

    @property
    def gen(self) -> int:
        ...

    @property
    def block(self) -> int:
        ...

    @property
    def per(self) -> int:
        ...

    @property
    def ch(self) -> int:
        ...

    def __init__(self, sid: int, stream_id: object, epoch: int, kind: str, lo: int, hi: int, op: str, frames: object, gen: object, block: int, per: int=..., ch: int=...) -> None:
        ...

    def stream_name(self) -> str:
        ...

    def describe(self) -> dict:
        ...

    def line(self) -> str:
        ...

    def __repr__(self) -> str:
        ...

class Clock:

    @property
    def seen(self) -> int:
        ...

    def __init__(self) -> None:
        ...

    def __getitem__(self, sid: int) -> int:
        ...

    def get(self, sid: int, default: int=...) -> int:
        ...

    def items(self) -> list[tuple[int, int]]:
        ...

    def __len__(self) -> int:
        ...

    def __repr__(self) -> str:
        ...

class RecordList:

    def __len__(self) -> int:
        ...

    def __getitem__(self, i: int) -> _Rec:
        ...

    def __iter__(self) -> Iterator[_Rec]:
        ...

    def __repr__(self) -> str:
        ...

class Graveyard:

    @property
    def max_len(self) -> int:
        ...

    def __len__(self) -> int:
        ...

    def keys(self) -> list:
        ...

    def values(self) -> list:
        ...

    def __iter__(self) -> Iterator[tuple[int, int]]:
        ...

    def __repr__(self) -> str:
        ...

class AddrMap:

    @property
    def live(self) -> int:
        ...

    def gen_at(self, base: int) -> int:
        ...

    def get(self, base: object, default: object=...) -> object:
        ...

    def __getitem__(self, base: object) -> object:
        ...

    def __contains__(self, base: object) -> bool:
        ...

    def __len__(self) -> int:
        ...

    def keys(self) -> list:
        ...

    def values(self) -> list:
        ...

    def items(self) -> list:
        ...

    def __iter__(self) -> Iterator[int]:
        ...

    def __repr__(self) -> str:
        ...
