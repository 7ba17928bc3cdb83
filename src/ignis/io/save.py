"""Saving device arrays to a safetensors file.

Design:
- The header is built exactly as the reference library builds it
  (``format.build_header``): same order, same JSON, same padding, so the
  file is byte-identical to what ``safetensors`` writes for the same tensors
  and metadata (``__metadata__`` keys keep the caller's order; the reference
  writes them in hash order).
- The bytes move through ``pipeline.save``: device-to-host copies into a ring
  of pinned buffers overlapped with file writes, so the host never holds more
  than the ring, whatever the model's size.
- The file is written under a temporary name in the same directory and
  renamed over ``path`` when complete: a failed save leaves ``path`` as it was.
  A ``path`` that is a symbolic link is followed: the file it names is the one
  written (under a temporary name beside it), and the link stays a link. A
  path that names anything but a regular file (a character device, a FIFO, a
  directory, a socket) is refused before anything is written: renaming over it
  would replace it with a regular file.

Rules:
- Ownership: every array is acquired for ``"io"`` before the first byte moves
  (an array held by another layer is refused with ``MemoryContractViolation``
  and nothing is written) and released to ``"compute"`` afterwards, always.
- The device reads are ordered after every earlier tracked write to the
  arrays (the cross-stream tracking of the memory layer, or a wait on the
  array's stream where its resource cannot track).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from typing import Any, Mapping

from ..array import NvArray
from .._types import Access
from ..runtime import Stream, current_stream
from . import pipeline
from .format import METADATA_KEY, build_header
from .pipeline import PipelineOptions, Progress

__all__ = ["save_safetensors"]

_OWNER = "io"
_READ = Access.READ
_tmp_ids = itertools.count()


def _check_arrays(arrays: Any) -> list[tuple[str, NvArray]]:
    if not isinstance(arrays, Mapping):
        raise TypeError(f"arrays must be a mapping of names to NvArrays, got {type(arrays).__name__}")
    items = list(arrays.items())
    for name, a in items:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        if name == METADATA_KEY:
            raise ValueError(f"{METADATA_KEY!r} is reserved for the file's metadata; it cannot name a tensor")
        if not isinstance(a, NvArray):
            raise TypeError(f"tensor {name!r} is a {type(a).__name__}, not an NvArray "
                            "(convert with ig.asarray first)")
        a.check_usable("save")
    devices = {a.device for _, a in items}
    if len(devices) > 1:
        raise ValueError(f"save_safetensors saves arrays of one device; these are on devices "
                         f"{sorted(d.ordinal for d in devices)} (save one file per device)")
    return items


def _check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in metadata.items()):
        raise TypeError("metadata must map str to str (the safetensors format stores only strings)")
    return dict(metadata)


def save_safetensors(arrays: Mapping[str, NvArray], path: "str | os.PathLike[str]",
                     metadata: Mapping[str, str] | None = None, progress: Progress | None = None, *,
                     stream: Stream | None = None, options: PipelineOptions | None = None) -> None:
    """Write ``arrays`` to ``path`` in the safetensors format, straight from device memory.

    Args:
        arrays: ``{name: NvArray}``, all on one device.
        path: the file to write (replaced atomically when complete).
        metadata: ``__metadata__``, str -> str.
        progress: ``progress(done_bytes, total_bytes)``, called on this thread.
        stream: the stream the device reads are ordered on (default: the device's default stream).
        options: pipeline tuning (``PipelineOptions``).
    Raises:
        MemoryContractViolation: an array is held by another layer (nothing is written).
        UseAfterFreeError: an array was freed.
        StaleHandleError: an array was made before its device's context was rebuilt.
        OSError: the file cannot be written, or ``path`` names something other than a regular
            file (a device, a FIFO, a directory); ``path`` is left as it was.
    """
    path = _destination(os.fspath(path))
    opts = options if options is not None else PipelineOptions()
    if not isinstance(opts, PipelineOptions):
        raise TypeError(f"options must be a PipelineOptions, got {type(options).__name__}")
    items = _check_arrays(arrays)
    meta = _check_metadata(metadata)
    by_name = dict(items)
    header, layout = build_header(((n, a.dtype.safetensors, a.shape, a.nbytes) for n, a in items), meta)
    if stream is None:
        stream = current_stream(items[0][1].device if items else None)
    elif type(stream) is not Stream:
        raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
    elif items and stream.device is not items[0][1].device:
        raise ValueError(f"stream {stream!r} is on device {stream.device.ordinal}, the arrays on device "
                         f"{items[0][1].device.ordinal}")

    unique = list({id(a): a for _, a in items}.values())
    data_start = len(header)
    file_size = data_start + (layout[-1][2] if layout else 0)
    runs = [(data_start + b, by_name[n].device_ptr, e - b) for n, b, e in layout]
    chunks = pipeline.plan_chunks(runs, opts.chunk_bytes)
    # Every array is held for "io" (a view through its root) before the first byte moves.
    # The device reads are tracked uses, ordered after earlier writes through the memory
    # layer; an array whose resource cannot track is only held (mode None), and the reads
    # wait for its own stream instead. A failed save still records the reads it queued.
    uses = [(a, _READ if a.tracked else None) for a in unique]
    with NvArray.access_all(uses, stream, by=_OWNER, op="safetensors save"):
        waited: set[int] = set()
        for a in unique:
            if not a.tracked and a.stream is not stream and id(a.stream) not in waited:
                waited.add(id(a.stream))
                stream.wait(a.stream)
        _write(path, header, chunks, file_size, stream, opts, progress)


def _destination(path: str) -> str:
    """The regular file a save to ``path`` writes: ``path``, or the file its symbolic links
    name (which need not exist yet). Anything else is refused, since the finished file is
    renamed over it."""
    target = os.path.realpath(path)  # every link followed; a dangling one: the path it names
    try:
        st = os.stat(target)  # a link loop raises ELOOP here
    except FileNotFoundError:
        return target
    if stat.S_ISREG(st.st_mode):
        return target
    kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
            else "a block device" if stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    via = f" (through the link {path})" if target != os.path.abspath(path) else ""
    raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL,
                  f"cannot save safetensors to {target}{via}: it is {kind}, and a save writes a whole "
                  "file and renames it over the path, which would replace it; give the path of a regular "
                  "file (or of one to create)", path)


def _write(path: str, header: bytes, chunks: Any, file_size: int, stream: Stream, opts: PipelineOptions,
           progress: Progress | None) -> None:
    tmp = os.path.join(os.path.dirname(path) or ".",
                       f".{os.path.basename(path)}.ignis-tmp-{os.getpid()}-{next(_tmp_ids)}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            os.ftruncate(fd, file_size)
            pipeline.pwrite_all(fd, memoryview(header), 0)
            pipeline.save(fd, path, chunks, stream, opts, file_size, progress)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
