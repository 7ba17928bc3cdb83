"""Loading safetensors files straight into device memory.

Design:
- ``safe_open`` opens the file and validates the whole header (it is
  untrusted input, see ``format``); nothing is allocated until it passes.
- A load makes one device allocation for the tensors it reads and returns
  views into it (``separate=True``: one allocation per tensor). The views keep
  the allocation alive; it goes back to its resource, in stream order, when
  the last of them is gone. Tensors keep the file's layout on the device
  wherever it is naturally aligned, so a whole-file load is one run of
  copies; a tensor the file leaves misaligned starts a new 256-byte-aligned run.
- The bytes move through ``pipeline.load``: worker threads fill a ring of
  pinned buffers with positional reads, overlapped with host-to-device copies.

Rules:
- Ownership: every array of a load (and the allocation behind the views) is
  acquired for ``"io"`` before the first byte moves and released to
  ``"compute"`` once the bytes are on the device.
- On any error, after allocation too (a read, a driver call, the progress
  callback), every array of the load is freed before the error propagates.
- The file is opened non-blocking and must be a regular file, so a FIFO or a
  device node cannot hang the loader.
- A file changed under a load is a ``SafetensorsError``, never a crash or
  other bytes returned as tensor data: its size and modification time are
  taken when the header is read and compared before and after every load
  (the reads themselves stop at a file cut short; see ``pipeline``). Replacing
  the file by a rename is not a change: the open file keeps its old contents.
  A rewrite of the same size within one tick of the file system's clock
  (a few ms on some) leaves both unchanged and cannot be seen.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Iterable, Mapping

from .. import dtypes as _dt
from ..array import NvArray
from ..errors import ClosedError
from .._types import Access
from ..runtime import Device, Stream, current_stream
from . import pipeline
from .format import Header, SafetensorsError, TensorEntry, read_header, resolve_dtype_map
from .pipeline import PipelineOptions, Progress

__all__ = ["load_safetensors", "safe_open", "SafetensorsFile", "LOAD_TAG"]

LOAD_TAG = "ignis.io.load"
_RUN_ALIGN = 256
_OWNER = "io"
_WRITE = Access.WRITE


def _target_stream(device: "Device | int | None", stream: Stream | None) -> Stream:
    if stream is not None:
        if type(stream) is not Stream:
            raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
        if device is not None and Device(device) is not stream.device:
            raise ValueError(f"stream {stream!r} is on device {stream.device.ordinal}, not device {device}")
        return stream
    return current_stream(device)


def _open_regular(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SafetensorsError(path, "not a regular file")
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


class SafetensorsFile:
    """An open safetensors file with a validated header; tensors are read on demand.

    Made by ``safe_open``. ``close()`` it (or use it as a context manager).
    """

    def __init__(self, path: "str | os.PathLike[str]", device: "Device | int | None" = None, *,
                 dtype_map: Mapping[Any, Any] | None = None, options: PipelineOptions | None = None) -> None:
        self._fd = -1
        self.path = os.fspath(path)
        dmap = resolve_dtype_map(dtype_map)
        self.options = options if options is not None else PipelineOptions()
        if not isinstance(self.options, PipelineOptions):
            raise TypeError(f"options must be a PipelineOptions, got {type(options).__name__}")
        self.device = None if device is None else Device(device)
        fd = _open_regular(self.path)
        try:
            self._identity = _identity(fd)
            self._header: Header = read_header(fd, self.path, dmap)
            self._check_unchanged(fd, "while its header was read")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._index = self._header.index()

    # -- the header ----------------------------------------------------------------
    def keys(self) -> list[str]:
        """The tensor names, sorted (as the reference library lists them)."""
        return sorted(self._index)

    def metadata(self) -> dict[str, str] | None:
        """The file's ``__metadata__`` (None when it has none)."""
        m = self._header.metadata
        return None if m is None else dict(m)

    def info(self, name: str) -> TensorEntry:
        """Name, dtype code, dtype, shape and data offsets of one tensor."""
        e = self._index.get(name)
        if e is None:
            raise SafetensorsError(self.path, "no tensor of this name in the file", tensor=name)
        return e

    @property
    def nbytes(self) -> int:
        """Bytes in the data section (all tensors)."""
        return self._header.data_size

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Any:
        return iter(self.keys())

    # -- reading ---------------------------------------------------------------------
    def get(self, name: str, *, stream: Stream | None = None) -> NvArray:
        """Load one tensor into its own allocation."""
        return self.load([name], stream=stream, separate=True)[name]

    get_tensor = get

    def load(self, names: Iterable[str] | None = None, *, stream: Stream | None = None, separate: bool = False,
             progress: Progress | None = None) -> dict[str, NvArray]:
        """Load ``names`` (default: every tensor), in file order. See ``load_safetensors``."""
        if self._fd < 0:
            raise ClosedError(f"safetensors file {self.path!r}", "open it again with ig.io.safe_open")
        target = _target_stream(self.device, stream)
        entries = self._select(names)
        self._check_unchanged(self._fd, "since its header was read")
        return _load(self._fd, self._header, entries, target, separate, progress, self.options,
                     lambda: self._check_unchanged(self._fd, "while it was read"))

    def _check_unchanged(self, fd: int, when: str) -> None:
        """Raise ``SafetensorsError`` if the file's size or modification time moved."""
        now = _identity(fd)
        if now != self._identity:
            (size0, mtime0), (size1, mtime1) = self._identity, now
            what = f"its size went from {size0} to {size1} bytes" if size1 != size0 else \
                f"it was modified (mtime {mtime0} -> {mtime1} ns)"
            raise SafetensorsError(self.path, f"the file changed {when}: {what}; its header no longer "
                                              "describes it. Open it again once nothing writes to it")

    def _select(self, names: Iterable[str] | None) -> list[TensorEntry]:
        if names is None:
            return list(self._header.entries)
        if isinstance(names, str):
            names = [names]
        wanted = set()
        for n in names:
            if n not in self._index:
                raise SafetensorsError(self.path, "no tensor of this name in the file", tensor=n)
            wanted.add(n)
        return [e for e in self._header.entries if e.name in wanted]

    # -- lifetime ----------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._fd < 0

    def close(self) -> None:
        """Close the file. Idempotent; arrays already loaded stay valid."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"{len(self._index)} tensors, {self._header.data_size} bytes"
        return f"<ignis.io.SafetensorsFile {self.path!r} {state}>"


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_size, st.st_mtime_ns


def safe_open(path: "str | os.PathLike[str]", device: "Device | int | None" = None, *,
              dtype_map: Mapping[Any, Any] | None = None,
              options: PipelineOptions | None = None) -> SafetensorsFile:
    """Open a safetensors file for lazy reading: ``keys()``, ``metadata()``, ``get(name)``.

    The whole header is validated here. ``device`` defaults to the stream's
    device where one is given to ``get`` / ``load``, else device 0.
    Raises:
        SafetensorsError: the file is malformed (naming the tensor and the problem).
        OSError: the file cannot be opened.
    """
    return SafetensorsFile(path, device, dtype_map=dtype_map, options=options)


def load_safetensors(path: "str | os.PathLike[str]", device: "Device | int | None" = None,
                     stream: Stream | None = None, *, names: Iterable[str] | None = None,
                     dtype_map: Mapping[Any, Any] | None = None, separate: bool = False,
                     progress: Progress | None = None,
                     options: PipelineOptions | None = None) -> dict[str, NvArray]:
    """Load a safetensors file straight into device memory.

    Args:
        path: the file.
        device: the device (default: ``stream``'s, else 0).
        stream: the stream the arrays are ordered on (default: the device's default stream).
        names: load only these tensors (default: all).
        dtype_map: ``{safetensors code: dtype}`` to reinterpret a code's bytes as an Ignis
            dtype of the same item size (also loads codes Ignis has no dtype for, e.g.
            ``{"F8_E8M0": "uint8"}``). No conversion happens.
        separate: one allocation per tensor instead of views into one allocation.
        progress: ``progress(done_bytes, total_bytes)``, called on this thread.
        options: pipeline tuning (``PipelineOptions``).
    Returns:
        ``{name: NvArray}`` in file order, owned by ``"compute"``, with the bytes on the device.
    Raises:
        SafetensorsError: the file is malformed; nothing was allocated.
        OSError: the file cannot be opened or read.
        OutOfMemoryError: the device allocation failed.
    """
    with SafetensorsFile(path, device, dtype_map=dtype_map, options=options) as f:
        return f.load(names, stream=stream, separate=separate, progress=progress)


# -- the load itself -------------------------------------------------------------------
def _device_layout(entries: list[TensorEntry]) -> tuple[list[int], int]:
    """Device offsets for ``entries`` (file order) in one allocation, and its size.

    A tensor continues the current run (same file-to-device delta) when it follows
    the previous one in the file and stays naturally aligned; otherwise it starts
    a new run at the next 256-byte boundary."""
    offsets: list[int] = []
    dev_end = 0
    file_end = -1
    delta = 0
    for e in entries:
        size = e.dtype.itemsize
        if e.nbytes == 0:
            offsets.append(-(-dev_end // size) * size)
            continue
        if e.begin == file_end and (e.begin + delta) % size == 0:
            off = e.begin + delta
        else:
            off = -(-dev_end // _RUN_ALIGN) * _RUN_ALIGN
            delta = off - e.begin
        offsets.append(off)
        dev_end = off + e.nbytes
        file_end = e.end
    return offsets, dev_end


def _load(fd: int, header: Header, entries: list[TensorEntry], target: Stream, separate: bool,
          progress: Progress | None, opts: PipelineOptions, check: Any) -> dict[str, NvArray]:
    arrays: dict[str, NvArray] = {}
    made: list[NvArray] = []     # every array of this load, the hidden parent included
    runs: list[tuple[int, int, int]] = []
    base = header.data_start
    try:
        parent = None
        if not separate:
            offsets, size = _device_layout(entries)
            if size:
                parent = NvArray((size,), _dt.uint8, stream=target, tag=LOAD_TAG)
                made.append(parent)
        for i, e in enumerate(entries):
            if parent is None:
                a = NvArray(e.shape, e.dtype, stream=target, tag=LOAD_TAG)
            else:
                a = parent.view_bytes(offsets[i], e.shape, e.dtype)
            made.append(a)
            arrays[e.name] = a
            runs.append((base + e.begin, a.device_ptr, e.nbytes))
        owners = [a for a in made if a.owns_memory]  # the parent, or each separate array
        # Held for "io" (a view's owner is its root's: holding the parent holds its views)
        # and written on ``target``; the writes are recorded only when the load succeeded:
        # on a failure every array of the load is freed below.
        with NvArray.access_all([(a, _WRITE) for a in owners], target, by=_OWNER, op="safetensors load",
                                finish_on_error=False):
            chunks = pipeline.plan_chunks(runs, opts.chunk_bytes, opts.gap_bytes)
            try:
                pipeline.load(fd, chunks, target, opts, progress, header.file)
            except EOFError as exc:
                raise SafetensorsError(header.file, f"truncated: {exc}") from None
            check()  # the bytes read are the ones the header described
        return arrays
    except BaseException:
        for a in sorted(made, key=lambda a: not a.is_view):  # views before the parent
            if not a.freed:
                a.free(by=a.owner)
        raise
