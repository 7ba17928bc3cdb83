"""Where a device's default pool draws its memory from (``default_upstream``).

Its own module, below both the pool (whose ``PoolResource()`` with no upstream takes this one)
and ``memory.current`` (whose default resource is such a pool), so neither imports the other
to reach it."""

from __future__ import annotations

from ..runtime import Device
from .async_resource import AsyncResource
from .direct import DirectResource
from .resource import DeviceMemoryResource

__all__ = ["default_upstream"]


def default_upstream(device: Device) -> DeviceMemoryResource:
    """A new resource for the default pool to draw from: an ``AsyncResource`` where the
    device has stream-ordered memory pools, else a ``DirectResource``.

    Args:
        device: the ``ig.Device``.
    """
    if device.capabilities.get("memory_pools", False):
        return AsyncResource(device)
    return DirectResource(device)
