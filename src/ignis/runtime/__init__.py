"""Runtime objects (layer 1): devices, streams, events."""

from .current import current_device, current_stream
from .device import Device, DeviceState, device_count
from .event import Event
from .kernel import Kernel, RawPtr
from .stream import Stream

__all__ = ["Device", "DeviceState", "device_count", "current_device", "current_stream", "Event", "Stream", "Kernel",
           "RawPtr"]
