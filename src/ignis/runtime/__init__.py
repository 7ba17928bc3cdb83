"""Runtime objects (layer 1): devices, streams, events."""

from .device import Device, DeviceState, device_count
from .event import Event
from .kernel import Kernel, RawPtr
from .stream import Stream

__all__ = ["Device", "DeviceState", "device_count", "Event", "Stream", "Kernel", "RawPtr"]
