"""An array's tracked use, compiled: ``NvArray._begin`` / ``_end`` (the checks and waits
before work that touches an array's bytes, and the record after) and ``NvArray.use``'s
``with`` block. ``nvarray.py`` binds these functions as NvArray's methods; they are the
only implementation. The array's fields are read as attributes (NvArray is a Python class
with ``__slots__``); the block and the stream are compiled types read as typed fields."""

from __future__ import annotations

from .._types import Access
from ..errors import StreamMisuseError
from ..memory import ordering as _ord
from cpython.object cimport PyObject

from ..memory.block cimport DeviceBlock
from ..memory.resource cimport TrackedResource
from ..runtime.stream cimport Stream

cdef extern from "Python.h":
    PyObject **_PyObject_GetDictPtr(object)

cdef dict _ORD = _ord.__dict__  # ``checker`` (the sanitizer's hook) changes at any time
cdef object _RW = Access.READ_WRITE
cdef dict _PLAIN = {}  # resource type -> it keeps TrackedResource's prepare / finish_block_use


cdef inline bint _direct(object mr) except -1:
    """``mr``'s prepare / finish_block_use are TrackedResource's own (no subclass or instance
    overrides them): the compiled callers may call their compiled bodies directly."""
    cls = type(mr)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = issubclass(cls, TrackedResource) \
            and cls.prepare_block_use is TrackedResource.prepare_block_use \
            and cls.finish_block_use is TrackedResource.finish_block_use
    if not plain:
        return False
    cdef PyObject **dp = _PyObject_GetDictPtr(mr)  # an adaptor sets its upstream's methods on itself
    if dp == NULL or dp[0] == NULL:
        return True
    d = <dict>dp[0]
    return "prepare_block_use" not in d and "finish_block_use" not in d


cdef inline bint _clean_on(object block, object stream) except -1:
    """``block`` is clean on ``stream`` (ignis.memory.resource, "Clean"): its last write was
    there, nothing was recorded after it and no reader is pending; a use needs no wait or record."""
    cdef DeviceBlock b
    if type(block) is DeviceBlock:
        b = <DeviceBlock>block
        return b._ws is stream and not b._we and b._rd is None
    return block._ws is stream and not block._we and block._rd is None


cdef int begin_use(object arr, object stream, object access, object op, Py_ssize_t off,
                   Py_ssize_t n) except -1:
    cdef Stream s
    if arr._freed or arr._base is not None or arr._gate is not None:
        arr._check_live("use", access, op)
    chk = _ORD["checker"]
    block = arr._block
    if arr._tracks:  # prepare_block_use refuses a closed or stale stream itself
        if chk is None:
            if _clean_on(block, stream):
                if type(stream) is Stream:
                    s = <Stream>stream
                    if not s._closed and s._generation == s.device.state.generation:
                        return 0
                elif not stream._closed and stream._generation == stream.device.state.generation:
                    return 0
            mr = arr._mr
            if type(stream) is Stream and _direct(mr):
                (<TrackedResource>mr)._prepare_c(block, <Stream>stream, access, None)
            else:
                mr.prepare_block_use(block, stream, access)
        else:
            arr._mr.prepare_block_use(block, stream, access,
                                      (arr._ptr - block.ptr + off, arr.nbytes if n < 0 else n, op))
        return 0
    if stream._closed or stream._generation != stream.device.state.generation:
        stream._check()  # a closed or stale stream's handle must not reach the driver
    if block is not None and stream is not block.alloc_stream:
        raise StreamMisuseError(
            f"NvArray#{arr.id} lives in a {type(arr._mr).__name__}, which cannot track cross-stream "
            f"uses, so it can only be used on its own stream #{block.alloc_stream.id} "
            f"(asked: stream #{stream.id}); allocate it from a PoolResource or AsyncResource")
    if chk is not None and block is not None:
        chk.access(block, stream, access, (arr._ptr - block.ptr + off, arr.nbytes if n < 0 else n, op))
    return 0


cdef int end_use(object arr, object stream, object access) except -1:
    if arr._tracks:
        b = arr._block
        if _clean_on(b, stream):
            return 0  # clean on this stream: nothing to record
        mr = arr._mr
        if _direct(mr):
            (<TrackedResource>mr)._finish_c(b, stream, access)
        else:
            mr.finish_block_use(b, stream, access)
    return 0


def _begin(self, stream, access, op="use", off=0, n=-1):
    """Checks and waits before queuing work that touches bytes ``[off, off + n)``
    of this array (``n < 0``: all of them) on ``stream``: the array is live, the waits
    its ``access`` needs after other streams' uses are queued there (under ``auto``
    ordering), and the sanitizer, if on, checks the bytes."""
    begin_use(self, stream, access, op, off, n)


def _end(self, stream, access):
    """Record the use just queued on ``stream`` (after ``_begin``)."""
    end_use(self, stream, access)


cdef class TrackedUse:
    """The ``with`` block of ``NvArray.use``: the use begun on entry (its waits queued,
    the sanitizer's check), recorded on exit, also when the block raised."""

    cdef readonly object array
    cdef readonly object stream
    cdef readonly object access

    def __enter__(self):
        a = self.array
        begin_use(a, self.stream, self.access, "use()", 0, -1)
        return a._ptr

    def __exit__(self, *exc):
        end_use(self.array, self.stream, self.access)

    def __repr__(self):
        return f"<use of NvArray#{self.array.id} ({self.access.name.lower()}) on stream #{self.stream.id}>"


def use(self, stream=None, access=_RW):
    """Use the raw pointer in foreign work (PyTorch, CuPy, Triton, custom CUDA)
    queued on ``stream`` inside the ``with`` block: the waits it needs are
    queued before, and the use is recorded after. The block gives the device address.
    For a byte range, or for a layer that holds the array meanwhile, see ``access``.

    Args:
        stream: the ``Stream`` the foreign work is queued on; None: the array's own.
        access: what the work does to the bytes: an ``Access`` or ``"read"`` /
            ``"write"`` / ``"read_write"`` (default READ_WRITE).

    Returns:
        A ``with`` block that gives the array's device address.

    Raises:
        UseAfterFreeError: the array (or its base) was freed.
        ReadOnlyError: ``access`` writes to read-only memory.
        StreamMisuseError: the array's resource cannot track cross-stream uses and
            ``stream`` is not the block's own.
        ClosedError: the stream was closed.
        StaleHandleError: the stream predates a context rebuild.
    """
    cdef TrackedUse u = TrackedUse.__new__(TrackedUse)
    u.array = self
    u.stream = self.stream if stream is None else stream
    u.access = access if type(access) is Access else Access.parse(access)
    return u
