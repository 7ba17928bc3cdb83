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

    @property
    def source(self) -> str | None:
        ...

    @property
    def name(self) -> str:
        ...

    @property
    def host_impl(self) -> Callable[..., None] | None:
        ...

    @property
    def options(self) -> tuple[Any, ...]:
        ...

    @property
    def specs(self) -> list[Any]:
        ...

    @property
    def nargs(self) -> int:
        ...

    @property
    def array_args(self) -> tuple[Any, ...]:
        ...

    @property
    def plan(self) -> tuple[Any, ...]:
        ...

    @property
    def param_types(self) -> tuple[Any, ...]:
        ...

    def __init__(self, source: str | None=..., name: str | None=..., access: Sequence[Any]=..., host_impl: Callable[..., None] | None=..., options: Sequence[str]=...) -> None:
        ...

    def pack(self, *args: Any) -> bytes:
        ...

    def marshal(self, *args: Any) -> list:
        ...

    def __repr__(self) -> str:
        ...
