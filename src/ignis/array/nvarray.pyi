# Type stub of the compiled module ignis.array.nvarray (its source: src/ignis/array/nvarray.pyx).
# Written by scripts/gen_stubs.py from that source; do not edit by hand.
from typing import Any
from typing import NoReturn
import numpy as np
from ..dtypes import DType
from .._types import Access
from ..memory import DeviceMemoryResource
from ..memory.block import DeviceBlock
from ..runtime import Device, Stream
from ..memory.resource import ResourceLock
from ..memory import PinnedBuffer
from ..safety import GpuRef
__all__ = ['NvArray']

def drain_deferred() -> None:
    ...

def empty(shape: Any, dtype: Any=..., *, device: Device | int | None=..., stream: Stream | None=..., owner: str=..., mr: DeviceMemoryResource | None=..., tag: str=...) -> NvArray:
    ...

def access_block(uses: Any, stream: Any, by: Any, op: Any, finish_on_error: bool) -> _TrackedAccess:
    ...

class NvArray:

    @property
    def id(self) -> int:
        ...

    @property
    def shape(self) -> tuple[int, ...]:
        ...

    @property
    def dtype(self) -> DType:
        ...

    @property
    def device(self) -> Device:
        ...

    @property
    def stream(self) -> Stream:
        ...

    @property
    def owner(self) -> str:
        ...

    @property
    def ref_count(self) -> int:
        ...

    @property
    def created_at(self) -> float:
        ...

    @property
    def numel(self) -> int:
        ...

    @property
    def nbytes(self) -> int:
        ...

    @property
    def _lock(self) -> ResourceLock:
        ...

    def __init__(self, shape: Any, dtype: Any=..., *, device: Device | int | None=..., stream: Stream | None=..., owner: str=..., mr: DeviceMemoryResource | None=..., tag: str=...) -> None:
        ...

    @classmethod
    def from_foreign(cls, ptr: int, shape: Any, dtype: Any, device: Device | int, stream: Stream | None=..., *, owner: str=..., keepalive: Any=...) -> NvArray:
        ...

    @classmethod
    def from_block(cls, block: DeviceBlock, resource: DeviceMemoryResource, shape: Any, dtype: Any, stream: Stream | None=..., *, offset: int=..., owner: str=...) -> NvArray:
        ...

    @property
    def ndim(self) -> int:
        ...

    @property
    def freed(self) -> bool:
        ...

    @property
    def is_view(self) -> bool:
        ...

    @property
    def base(self) -> NvArray | None:
        ...

    @property
    def owns_memory(self) -> bool:
        ...

    @property
    def generation(self) -> int | None:
        ...

    @property
    def tag(self) -> str | None:
        ...

    @property
    def device_id(self) -> int:
        ...

    @property
    def device_ptr(self) -> int:
        ...

    @property
    def resource(self) -> DeviceMemoryResource | None:
        ...

    @property
    def block(self) -> DeviceBlock | None:
        ...

    @property
    def root(self) -> NvArray:
        ...

    @property
    def tracked(self) -> bool:
        ...

    def check_usable(self, what: str=..., access: Access | None=...) -> None:
        ...

    def mark_read_only(self, reason: str) -> None:
        ...

    def mark_failed(self, make_error: Any) -> None:
        ...

    def view_bytes(self, offset: int, shape: Any, dtype: Any) -> NvArray:
        ...

    def __len__(self) -> int:
        ...

    def __eq__(self, other: Any) -> NoReturn:
        ...

    def __ne__(self, other: Any) -> NoReturn:
        ...

    def __hash__(self) -> int:
        ...

    def __bool__(self) -> NoReturn:
        ...

    @property
    def size(self) -> int:
        ...

    @property
    def itemsize(self) -> int:
        ...

    @property
    def strides(self) -> tuple[int, ...]:
        ...

    def __repr__(self) -> str:
        ...

    def _check_live(self, what: str=..., access: Access | None=..., op: str | None=...) -> None:
        ...

    @property
    def readonly(self) -> bool:
        ...

    def use(self, stream: Stream | None=..., access: Access | str=...) -> TrackedUse:
        ...

    def access(self, stream: Stream | None=..., mode: Access | str=..., *, by: str | None=..., op: str=..., offset: int=..., nbytes: int | None=..., finish_on_error: bool=...) -> _TrackedAccess:
        ...

    @staticmethod
    def access_all(uses: Any, stream: Stream | None=..., *, by: str | None=..., op: str=..., finish_on_error: bool=...) -> _TrackedAccess:
        ...

    def incref(self) -> int:
        ...

    def decref(self) -> int:
        ...

    def transfer_ownership(self, new_owner: str) -> str:
        ...

    def _root(self) -> NvArray:
        ...

    def _set_owner(self, owner: str) -> list[NvArray]:
        ...

    def ref(self) -> GpuRef:
        ...

    def free(self, by: str=...) -> None:
        ...

    def __del__(self) -> None:
        ...

    def slice(self, dim: int, start: int, length: int) -> NvArray:
        ...

    def reshape(self, *shape: Any) -> NvArray:
        ...

    def __getitem__(self, key: Any) -> NvArray:
        ...

    def __setitem__(self, key: Any, value: Any) -> None:
        ...

    def __delitem__(self, key: Any) -> NoReturn:
        ...

    def zero_(self, *, stream: Stream | None=...) -> NvArray:
        ...

    def fill_(self, value: Any, *, stream: Stream | None=...) -> NvArray:
        ...

    def copy_(self, src: NvArray, *, stream: Stream | None=...) -> NvArray:
        ...

    def clone(self, *, stream: Stream | None=...) -> NvArray:
        ...

    def copy(self, *, stream: Stream | None=...) -> NvArray:
        ...

    def write_rows(self, src: NvArray, start_row: int, *, stream: Stream | None=...) -> NvArray:
        ...

    def from_host_raw(self, data: Any, *, stream: Stream | None=...) -> NvArray:
        ...

    def from_host(self, data: Any, *, stream: Stream | None=...) -> NvArray:
        ...

    def to_numpy(self, *, stream: Stream | None=...) -> np.ndarray:
        ...

    def to_host(self, *, stream: Stream | None=...) -> np.ndarray:
        ...

    def tolist(self) -> Any:
        ...

    def item(self, *, stream: Stream | None=...) -> Any:
        ...

    def pin(self) -> PinnedBuffer:
        ...

    def unpin(self) -> None:
        ...

    @property
    def pinned_host(self) -> np.ndarray | None:
        ...

    def __array__(self, dtype: Any=..., copy: Any=...) -> np.ndarray:
        ...

    def __reduce_ex__(self, protocol: Any) -> Any:
        ...

    def __dlpack__(self, *, stream: Any=..., max_version: Any=..., dl_device: Any=..., copy: Any=...) -> Any:
        ...

    def __dlpack_device__(self) -> tuple[int, int]:
        ...

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        ...

class TrackedUse:

    @property
    def array(self) -> NvArray:
        ...

    @property
    def stream(self) -> Stream:
        ...

    @property
    def access(self) -> Access:
        ...

    def __enter__(self) -> int:
        ...

    def __exit__(self, *exc: object) -> None:
        ...

    def __repr__(self) -> str:
        ...

class _TrackedAccess:

    def __init__(self, uses: list, stream: Stream, by: str | None, op: str, finish_on_error: bool, single: bool) -> None:
        ...

    def __repr__(self) -> str:
        ...

    def __enter__(self) -> Any:
        ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        ...

    def enter(self) -> Any:
        ...

    def exit(self, ok: bool) -> Any:
        ...
