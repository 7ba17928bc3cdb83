"""Memory resources (layer 2): stream-ordered allocators, adaptors and cross-stream tracking."""

from .adaptors import (LOG_HEADER, BudgetResource, Counter, LoggingResource, ResourceAdaptor, Statistics,
                       StatisticsResource, TrackingResource)
from .async_resource import AsyncResource
from .current import get_current_resource, set_current_resource
from .direct import DirectResource
from .guard import DebugGuardResource, DeferredGuardResource, first_poisoned_offset, holds_poison
from .pinned import PinnedBuffer, PinnedHostResource
from .pool import PoolResource
from .resource import DeviceMemoryResource, TrackedResource
from .._types import Access
from .types import TRANSITIONS, UNTAGGED, AllocTag, BlockId, BlockState, StreamId
from .block import DeviceBlock, Generation
from .vmm import VmmResource

__all__ = [
    "Access", "AllocTag", "UNTAGGED", "Generation", "BlockId", "BlockState", "DeviceBlock", "TRANSITIONS",
    "StreamId", "DeviceMemoryResource", "TrackedResource", "DirectResource", "AsyncResource", "PoolResource",
    "PinnedHostResource", "PinnedBuffer", "VmmResource", "ResourceAdaptor", "BudgetResource",
    "LoggingResource",
    "StatisticsResource", "TrackingResource", "DebugGuardResource", "DeferredGuardResource", "holds_poison",
    "first_poisoned_offset",
    "Counter", "Statistics", "LOG_HEADER",
    "get_current_resource", "set_current_resource",
]
