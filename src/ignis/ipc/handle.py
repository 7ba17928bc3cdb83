"""IpcHandle: an exported array as a file descriptor plus its descriptor.

Rules:
- A handle owns its fd: ``close()`` (or the context manager, or garbage
  collection) closes it; ``detach()`` hands it over. Opening a handle does not
  consume it; it can be opened more than once and closed afterwards.
- The descriptor is untrusted input whenever it comes from elsewhere:
  ``IpcDescriptor.parse`` checks every field's type and range, the dtype,
  and that ``offset + shape * itemsize`` lies inside ``size``, and raises
  ``ValueError`` saying which field is wrong. ``open`` checks again, before
  any driver call, that ``size`` fits the device and that the fd is open; a
  ``size`` larger than the real allocation is refused when the importer
  maps the memory (also ``ValueError``).
- Plain ``pickle`` of a handle is refused (an fd number means nothing in
  another process). ``multiprocessing`` pickles it through its fd-passing
  reduction (``DupFd``), so a handle can be a ``Process`` argument or travel
  through a ``Queue`` or ``Pipe``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

from .. import dtypes as _dt
from ..errors import ClosedError

__all__ = ["IpcDescriptor", "IpcHandle", "VERSION", "MAX_DESCRIPTOR_BYTES"]

VERSION = 1
MAX_DESCRIPTOR_BYTES = 64 << 10
_MAX_BYTES = 1 << 50          # 1 PiB: far beyond any device, small enough to rule out overflow games
_MAX_NDIM = 32
_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SERVICE = re.compile(r"ignis-ipc/([0-9]{1,10})/[0-9a-f]{16}")
_DTYPES = frozenset(_dt.names())
_FIELDS = ("version", "size", "offset", "shape", "dtype", "generation", "device_uuid", "pid", "uid", "service")


def _show(v: Any) -> str:
    """A short repr of untrusted data (a huge int's repr raises; a huge list's floods the message)."""
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001
        return f"<a {type(v).__name__}>"
    return r if len(r) <= 80 else f"{r[:77]}..."


def _bad(field: str, why: str) -> ValueError:
    return ValueError(f"invalid IPC descriptor: {field} {why}; the handle is corrupt, truncated or forged "
                      "(export the array again with ig.ipc.export)")


def _int(d: dict, field: str, lo: int, hi: int) -> int:
    v = d[field]
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(field, f"must be an int in [{lo}, {hi}], got {_show(v)}")
    return v


@dataclass(frozen=True, slots=True)
class IpcDescriptor:
    """What an importer needs besides the fd.

    ``size``: bytes of the exported allocation (what gets mapped);
    ``offset``: where the array starts in it; ``shape`` / ``dtype``: the array;
    ``generation``: the exporter's block generation; ``device_uuid``: the GPU;
    ``pid`` / ``uid``: the exporting process and its user; ``service``: the
    exporter's liveness service ("" when there is none).
    """

    size: int
    offset: int
    shape: tuple[int, ...]
    dtype: str
    generation: int
    device_uuid: str
    pid: int
    uid: int
    service: str = ""
    version: int = VERSION

    @property
    def nbytes(self) -> int:
        """Bytes of the array (``prod(shape) * itemsize``)."""
        n = _dt.dtype(self.dtype).itemsize
        for d in self.shape:
            n *= d
        return n

    def validated(self) -> "IpcDescriptor":
        """This descriptor, checked as ``parse`` checks untrusted data (one made by
        calling the class directly skipped that); raises ``ValueError`` if it fails."""
        d = {f: getattr(self, f) for f in _FIELDS}
        shape = d["shape"]
        d["shape"] = list(shape) if isinstance(shape, (list, tuple)) else shape
        return type(self).parse(d)

    def to_bytes(self) -> bytes:
        """The descriptor as compact JSON (what ``parse`` reads)."""
        d = {f: getattr(self, f) for f in _FIELDS}
        d["shape"] = list(self.shape)
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: "bytes | bytearray | memoryview | str | dict") -> "IpcDescriptor":
        """Validate untrusted descriptor data (bytes from ``to_bytes``, or its dict)."""
        if isinstance(data, dict):
            d = data
        elif not isinstance(data, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"an IPC descriptor is parsed from bytes, str or a dict, got {type(data).__name__}")
        else:
            raw = bytes(data, "utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
            if len(raw) > MAX_DESCRIPTOR_BYTES:
                raise _bad("data", f"is {len(raw)} bytes, more than the {MAX_DESCRIPTOR_BYTES}-byte limit")
            try:
                d = json.loads(raw)
            except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a 5000-digit int, deep nesting
                raise _bad("data", f"is not a complete JSON object ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(d, dict):
            raise _bad("data", f"must be a JSON object, got {type(d).__name__}")
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise _bad("data", f"lacks field(s) {', '.join(missing)}")
        extra = sorted(str(k) for k in d if k not in _FIELDS)
        if extra:
            raise _bad("data", f"has unknown field(s) {', '.join(extra)}")
        if type(d["version"]) is not int or d["version"] != VERSION:
            raise ValueError(f"IPC descriptor version {str(d['version'])[:40]!r} was made by an incompatible "
                             f"Ignis; this one reads version {VERSION}: use the same Ignis on both sides")
        size = _int(d, "size", 1, _MAX_BYTES)
        offset = _int(d, "offset", 0, size - 1)
        generation = _int(d, "generation", 1, 2**63 - 1)
        pid = _int(d, "pid", 1, 2**31 - 1)
        uid = _int(d, "uid", 0, 2**32 - 1)
        shape = d["shape"]
        if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_NDIM \
                or any(type(x) is not int or not 0 <= x <= _MAX_BYTES for x in shape):
            raise _bad("shape", f"must be a list of at most {_MAX_NDIM} non-negative ints, got {_show(shape)}")
        name = d["dtype"]
        if not isinstance(name, str) or name not in _DTYPES:
            raise _bad("dtype", f"must be one of {', '.join(_dt.names())}, got {_show(name)}")
        uuid = d["device_uuid"]
        if not isinstance(uuid, str) or not _UUID.fullmatch(uuid):
            raise _bad("device_uuid", f"must look like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {_show(uuid)}")
        service = d["service"]
        m = _SERVICE.fullmatch(service) if isinstance(service, str) else None
        if not isinstance(service, str) or service and (m is None or int(m.group(1)) != pid):
            raise _bad("service", f"must be '' or the exporter's own service name, got {_show(service)}")
        itemsize = _dt.dtype(name).itemsize
        nbytes = itemsize
        for x in shape:
            nbytes *= x
        if nbytes == 0:
            raise _bad("shape", f"{tuple(shape)} has no elements; an empty array has nothing to share")
        if offset % itemsize:
            raise _bad("offset", f"{offset} is not a multiple of the {itemsize}-byte {name} element")
        if offset + nbytes > size:
            raise _bad("shape", f"{tuple(shape)} of {name} ({nbytes} bytes) at offset {offset} runs past the "
                       f"end of the {size}-byte allocation")
        return cls(size, offset, tuple(shape), name, generation, uuid, pid, uid, service)


class IpcHandle:
    """An exported array: an open file descriptor for its memory and its descriptor.
    Made by ``ig.ipc.export`` (or received); opened with ``ig.ipc.open``."""

    __slots__ = ("_fd", "descriptor", "__weakref__")

    def __init__(self, fd: int, descriptor: IpcDescriptor) -> None:
        if type(fd) is not int or not 0 <= fd < 2 ** 31:
            raise ValueError(f"fd must be an open file descriptor (an int in [0, 2**31)), got {_show(fd)}")
        if not isinstance(descriptor, IpcDescriptor):
            raise TypeError(f"descriptor must be an IpcDescriptor, got {type(descriptor).__name__}")
        self._fd = fd
        self.descriptor = descriptor

    @property
    def fd(self) -> int:
        """The file descriptor (still owned by the handle)."""
        if self._fd < 0:
            raise ClosedError(repr(self), "export the array again to get a new handle")
        return self._fd

    @property
    def closed(self) -> bool:
        """True once the handle's fd was closed or handed over (``close()``, ``detach()``)."""
        return self._fd < 0

    def detach(self) -> int:
        """Give up ownership of the fd and return it (the caller closes it)."""
        fd = self.fd
        self._fd = -1
        return fd

    def close(self) -> None:
        """Close the fd. Idempotent. Arrays already opened from the handle stay valid."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "IpcHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            try:
                self.close()
            except OSError:
                pass

    def __reduce__(self) -> Any:
        raise TypeError("an IpcHandle holds a file descriptor, which plain pickle cannot carry; pass it as a "
                        "multiprocessing Process argument or through a multiprocessing Queue / Pipe, or send "
                        "it over a Unix socket with ig.ipc.send_handle")

    def __repr__(self) -> str:
        d = self.descriptor
        state = "closed" if self._fd < 0 else f"fd={self._fd}"
        return (f"<ignis.ipc.IpcHandle {state} shape={list(d.shape)} dtype={d.dtype} size={d.size} "
                f"generation={d.generation} pid={d.pid}>")


def _rebuild_handle(dup: Any, data: bytes) -> IpcHandle:
    fd = dup.detach()
    try:
        return IpcHandle(fd, IpcDescriptor.parse(data))
    except BaseException:
        os.close(fd)
        raise


def _reduce_handle(h: IpcHandle) -> tuple:
    # DupFd: under spawn / forkserver the fd is passed to the child at start;
    # otherwise (a Queue) a resource-sharer thread hands it over once.
    return _rebuild_handle, (reduction.DupFd(h.fd), h.descriptor.to_bytes())


reduction.register(IpcHandle, _reduce_handle)
