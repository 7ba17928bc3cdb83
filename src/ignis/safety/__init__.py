"""Safety layer (layer 3): ownership contract and generation-checked handles.

Cross-stream hazard records live with the blocks in the memory layer
(``ignis.memory.resource``), which orders frees and reuse by them.
"""

from ..memory.ordering import get_ordering, ordering, set_ordering
from . import sanitizer
from .contract import DEFAULT_OWNER, MemoryContract, contract, owners, register_owner
from .gpuref import GpuRef

__all__ = ["MemoryContract", "contract", "register_owner", "owners", "DEFAULT_OWNER", "GpuRef", "sanitizer",
           "ordering", "set_ordering", "get_ordering"]
