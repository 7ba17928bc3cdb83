# Type stub of the compiled module ignis.runtime.kernel (its source: src/ignis/runtime/kernel.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any, ClassVar
from typing import Callable, Sequence
import numpy as np
__all__ = ['Kernel', 'RawPtr', 'SCALAR_CTYPES']
SCALAR_CTYPES: dict[str, Any]

def driver_calls() -> dict[str, int]:
    ...

class RawPtr:
    __slots__: ClassVar[tuple[str, ...]]

    def __init__(self, buf: np.ndarray, byte_offset: int, dtype: np.dtype) -> None:
        ...

    def __getitem__(self, key: Any) -> Any:
        ...

    def __setitem__(self, key: Any, value: Any) -> None:
        ...

class Kernel:
    source: str | None
    name: str
    host_impl: Callable[..., None] | None
    options: tuple[Any, ...]
    specs: list[Any]
    nargs: int
    array_args: tuple[Any, ...]
    plan: tuple[Any, ...]
    param_types: tuple[Any, ...]

    def __init__(self, source: str | None=..., name: str | None=..., access: Sequence[Any]=..., host_impl: Callable[..., None] | None=..., options: Sequence[str]=...) -> None:
        ...

    def pack(self, *args: Any) -> bytes:
        ...

    def marshal(self, *args: Any) -> list:
        ...

    def __repr__(self) -> str:
        ...
