"""NvArray: the one canonical device tensor (after seeds/001).

Design and rules:
- An NvArray either owns a block from a memory resource, or is a view into
  its parent's block (``base``), or adopts foreign memory (``from_dlpack``).
  Only an owning array frees memory; a view keeps its parent alive and never
  frees; a parent with live views refuses ``free()``.
- Every operation that touches device bytes is a tracked use of the block
  (``prepare_block_use`` before, ``finish_block_use`` after) on the stream it
  runs on, so an array written on stream A and read on stream B gets the event
  wait it needs without the user doing anything. On a resource that cannot
  track, work is allowed only on the block's own stream.
- ``free()`` refuses while ``ref_count > 0`` or while a layer other than the
  caller owns the array; a second free is a ``DoubleFreeError``; any use after
  free is a ``UseAfterFreeError`` naming the array id and generation.
- An owning array that is garbage-collected returns its block in stream order;
  an explicit ``free()`` cancels that. Nothing is freed while the interpreter
  is shutting down.
- Owner transitions, ref counts and free are guarded by a per-array lock.

Compiled (Cython): ``NvArray`` is an extension type whose fields are declared in
``nvarray.pxd``; its creation (``ig.empty``, the constructor), ``free``, collection
and tracked use (``use``, ``access``, and ``begin_use`` / ``end_use`` for
``launch.pyx``) are this one implementation.

The module is one extension, its source split by concern: this file (identity,
defaults, gates, the class: creation, ownership, views, indexing, free) and three
parts it includes at its end: ``_tracked.pxi`` (the tracked use: ``begin_use`` /
``end_use``, ``TrackedUse``, the ``access`` block), ``_transfers.pxi`` (memset, fill,
device and host copies) and ``_dlcapsule.pxi`` (DLPack's deleter and capsule
destructor). The class's methods for those concerns check their arguments and call
the parts' C functions.
"""

from __future__ import annotations

import gc
import operator
from collections import deque
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .. import backends
from .. import dtypes as _dt
from ..dtypes import DType
from ..errors import (DoubleFreeError, MemoryContractViolation, OutOfBoundsError, ReadOnlyError,
                       StaleHandleError, UseAfterFreeError)
from .._types import MAX_EXTENT, MAX_NDIM, Access, shape_problem
from ..memory import BlockState, DeviceMemoryResource, get_current_resource
from ..memory.current import on_resource_change
from ..memory.types import UNTAGGED
from ..memory.block import DeviceBlock
from ..errors import StreamMisuseError
from ..runtime import Device, Stream
from ..runtime import current as _rt_current
from ..safety.contract import DEFAULT_OWNER, contract, validate_owner

cdef str _COLLECTIVE = "collective"  # a layer of Ignis, registered for good (as the default owner)
from . import hostcopy

from cpython.object cimport PyObject
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME_COARSE
from ..memory.resource cimport ResourceLock, lock_take, lock_give
from ..memory.hooks cimport Hooks
from ..memory.hooks import HOOKS as _HOOKS
from ..memory.pool cimport PoolResource, pool_deallocate, pool_direct
from ..memory.resource import ResourceLock
from ..memory.block cimport DeviceBlock as _Block, block_clean_on
from ..memory.resource cimport TrackedResource
from ..runtime.stream cimport Stream as _Stream

from .._cpython cimport ignis_finalizing, not_on_instance
from cpython.pycapsule cimport PyCapsule_IsValid, PyCapsule_GetPointer
from cpython.exc cimport PyErr_Fetch, PyErr_Restore

cdef extern from "Python.h":
    int Py_IsInitialized() nogil

if TYPE_CHECKING:
    from ..memory import PinnedBuffer
    from ..safety import GpuRef

__all__ = ["NvArray"]


cdef unsigned long long _id_next = 0


cdef inline object _new_id():
    """A process-unique array id (the GIL serializes the counter)."""
    global _id_next
    v = _id_next
    _id_next += 1
    return v


cdef inline int _identify(NvArray a, shape, dt, device, stream, owner, numel, nbytes, mr) except -1:
    """A new array's identity and description (the constructor's and ``_wrap``'s)."""
    a.id = _new_id()
    a.shape = shape
    a.dtype = dt
    a.device = device
    a.stream = stream
    a.owner = owner
    a.ref_count = 0
    a.created_at = _now()
    a.numel = numel
    a.nbytes = nbytes
    a._mr = mr
    return 0


cdef inline double _now() noexcept:
    """``time.time()`` to the clock's coarse tick (a few milliseconds at most), without the
    call: the coarse clock costs a few nanoseconds where the precise one can cost 50 (a
    virtual machine's clock), on every array's creation."""
    cdef timespec ts
    if clock_gettime(CLOCK_REALTIME_COARSE, &ts) != 0:
        return 0.0
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9

_NAMES = {n: _dt.dtype(n) for n in _dt.names()}  # dtype name -> DType, the constructor's fast path
# Per-array locks are striped: arrays are many and short-lived; a lock is only
# held for a few attribute updates and never while another array's is held.
# ResourceLock: a plain lock (``with``, acquire, release, locked) that the compiled free
# takes without a Python call.
_LOCKS = tuple(ResourceLock() for _ in range(64))


cdef inline ResourceLock _stripe(NvArray a):
    """The stripe lock of ``a`` (by its id)."""
    return <ResourceLock>_LOCKS[(<Py_ssize_t>a.id) & 63]


cdef inline bint _in_context(NvArray a) except -1:
    """``a`` was made in its device's current context: no ``Device.rebuild()`` (nor fork)
    since. Its own stream was made with it, so it carries the context generation the memory
    belongs to."""
    st = a.stream
    g = a.device.state.generation
    sg = (<_Stream>st)._generation if type(st) is _Stream else st._generation
    return sg is g or sg == g


cdef inline bint _plainly_usable(NvArray a) except -1:
    """``a`` passes ``_check_live`` without a closer look: not freed, not a view, no gate, and
    made in its device's current context."""
    return a._freed is False and a._base is None and a._gate is None and _in_context(a)


cdef inline bint _plain_on(NvArray a, object stream) except -1:
    """``a`` needs no check beyond those of ``stream`` (which every tracked use makes before
    its handle reaches the driver): not freed, not a view, no gate, and made in the context
    ``stream`` belongs to. False sends the caller to ``_check_live``, the full check."""
    if a._freed is not False or a._base is not None or a._gate is not None:
        return False
    st = a.stream
    if st is stream:
        return True
    if type(st) is _Stream and type(stream) is _Stream:
        return (<_Stream>st)._generation is (<_Stream>stream)._generation \
            or (<_Stream>st)._generation == (<_Stream>stream)._generation
    return _in_context(a)


_READ, _WRITE, _RW = Access.READ, Access.WRITE, Access.READ_WRITE


def _shape(shape: Any) -> tuple[int, ...]:
    if type(shape) is int and shape >= 0:
        return (shape,)
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ValueError(f"shape must be a sequence of non-negative ints, got {shape!r}") from None
    bad = [d for d in dims if d < 0]
    if bad:
        raise ValueError(f"shape {dims} has negative dimension(s) {bad}; dimensions must be >= 0")
    return dims


def _window(shape: Any, dtype: Any, offset: Any, what: str) -> tuple:
    """``(shape, dtype, nbytes, offset)`` of a typed window ``shape`` x ``dtype`` at byte ``offset``
    (``view_bytes``, ``from_block``): each checked, the offset a non-negative int."""
    dt = dtype if isinstance(dtype, DType) else _dt.dtype(dtype)
    shp = _shape(shape)
    _check_fits(shp, dt)
    if type(offset) is not int and not isinstance(offset, np.integer) or isinstance(offset, bool):
        raise TypeError(f"{what}: offset must be an int, not {type(offset).__name__}")
    if offset < 0:
        raise ValueError(f"{what}: offset {offset} is negative")
    return shp, dt, _numel(shp) * dt.itemsize, int(offset)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_fits(shape: tuple[int, ...], dt: DType) -> None:
    """Refuse a shape that the formats arrays are exported to cannot describe
    (``ignis._types.shape_problem``: too many dimensions, or an extent past 2**63 - 1 bytes)."""
    problem = shape_problem(shape, dt.itemsize)
    if problem is not None:
        raise ValueError(f"shape {shape} of {dt.name} cannot be an array: {problem}")


# An int shape at most this spans an extent DLPack can describe for every dtype (items are 8 bytes
# at most; the bound leaves room): the constructor takes it without the full check.
cdef object _INT_SHAPE_MAX = MAX_EXTENT // 16


_fast = [None]  # (device, stream, generation, version, defaults) for device 0
# The version of the defaults: a new backend or current resource makes a new one (their owners
# call _drop_defaults, registered with them below), and a cache made with an older one is not used.
cdef unsigned long long _defaults_version = 0

# Memory of arrays collected by the cyclic garbage collector, returned at the next
# array creation or free (never from inside the collector, see NvArray.__del__).
_deferred: deque = deque()
_in_gc = [False]


def _gc_phase(phase: str, info: dict) -> None:
    _in_gc[0] = phase == "start"


gc.callbacks.append(_gc_phase)


def _release(mr: Any, block: Any, pinned: Any) -> None:
    try:
        if pinned is not None:
            pinned.release()
        if block is not None:
            mr.deallocate(block)
    except Exception:
        pass


def drain_deferred() -> None:
    """Return memory of arrays the garbage collector found in reference cycles (deferred to a
    safe point: the next array creation or free, ``ig.synchronize()``, the end of ``ignis run``)."""
    while _deferred:
        try:
            mr, block, pinned = _deferred.popleft()
        except IndexError:
            return
        _release(mr, block, pinned)


class _Gate:
    """What an access to an array (and to every view of it) must pass first."""

    __slots__ = ()

    def check(self, array: "NvArray", what: str, access: Access | None) -> None:
        raise NotImplementedError


class _ReadOnly(_Gate):
    """Memory whose producer marked it read-only: reads pass, every write raises."""

    __slots__ = ("source",)

    def __init__(self, source: str) -> None:
        self.source = source

    def check(self, array: "NvArray", what: str, access: Access | None) -> None:
        if access is not None and access is not _READ:
            raise ReadOnlyError(
                f"cannot {what} NvArray#{array.id}: its memory is read-only ({self.source}); writing "
                "needs a writable copy (clone())", array_id=array.id, owner=array.owner)


class _Poisoned(_Gate):
    """A failed operation was to write this memory: its bytes are not what the program
    expects, so every access raises the error that ``make_error(array, what)`` builds."""

    __slots__ = ("make_error",)

    def __init__(self, make_error: Any) -> None:
        self.make_error = make_error

    def check(self, array: "NvArray", what: str, access: Access | None) -> None:
        raise self.make_error(array, what)


class _Export:
    """A live DLPack export of an array. The entry that keeps the exported tensor alive
    holds it, so it dies when the consumer's deleter runs (or the capsule dies unconsumed)."""

    __slots__ = ("array_id", "created_at", "__weakref__")

    def __init__(self, array_id: int) -> None:
        self.array_id = array_id
        self.created_at = _now()


# In an array's _exports: it was exported through __cuda_array_interface__, which has no
# release signal. Its free() then retires the array at once, but its memory goes back only
# when the array object is collected; CAI consumers (CuPy, PyTorch, Numba) hold the object
# for as long as they use its memory, so none of them can see that memory reused.
_CAI = "__cuda_array_interface__"


class _ReturnWhenCollected:
    """A freed block whose memory may still be used through a CAI export: it goes back to
    its resource when this object (kept by the array) is collected."""

    __slots__ = ("mr", "block")

    def __init__(self, mr: Any, block: Any) -> None:
        self.mr, self.block = mr, block

    def __del__(self) -> None:
        if ignis_finalizing():  # a C test: this module's globals may be cleared by now
            return
        if _in_gc[0]:
            _deferred.append((self.mr, self.block, None))
        else:
            _release(self.mr, self.block, None)


def _defaults() -> tuple[Device, Stream, DeviceMemoryResource, bool]:
    """The current device, its current stream, current resource and whether that tracks.
    While no thread has a current device or stream of its own (device 0 and its default
    stream), cached until any of them changes; the constructor reads the same cache
    (``_defaults_cached``)."""
    if _rt_current.overrides[0]:
        dev = _rt_current.current_device()
        mr = get_current_resource(dev)
        return dev, _rt_current.current_stream(dev), mr, mr.supports_block_use_tracking
    cached = _defaults_cached()
    if cached is not None:
        return cached
    v = _defaults_version  # read first: a change while the defaults are looked up keeps them out
    dev = Device(0)
    mr = get_current_resource(dev)
    out = (dev, dev.default_stream, mr, mr.supports_block_use_tracking)
    with _rt_current.lock:  # an override that began meanwhile dropped the cache: leave it dropped
        if not _rt_current.overrides[0]:
            _fast[0] = (dev, dev.default_stream, dev.state.generation, v, out)
    return out


def _drop_defaults() -> None:
    global _defaults_version
    _defaults_version += 1
    _fast[0] = None


_rt_current.on_first_override(_drop_defaults)
backends.on_backend_change(_drop_defaults)
on_resource_change(_drop_defaults)

cdef object _DEFERRED = _deferred
cdef dict _NAMES_C = _NAMES
cdef list _OVERRIDES = _rt_current.overrides
cdef list _FAST = _fast


cdef inline tuple _defaults_cached():
    """``_defaults()``'s cache while it holds (no backend or current resource changed since, the
    device's generation and the stream are those it was made with), else None."""
    f = _FAST[0]
    if f is None:
        return None
    t = <tuple>f
    st = t[1]
    if <unsigned long long>t[3] != _defaults_version:
        return None
    state = t[0].state
    if state.generation != t[2] or not state.accepting_ops:
        return None
    if (<_Stream>st)._closed if type(st) is _Stream else st._closed:
        return None
    return <tuple>t[4]


def _no_comparison(a: "NvArray", op: str) -> str:
    return (f"NvArray#{a.id} {op} ...: arrays are not compared with {op}: an NvArray holds device memory and "
            "does no math. Use `a is b` for identity; compare values on the host "
            "(np.array_equal(a.to_numpy(), b.to_numpy())) or element-wise on the device with PyTorch or CuPy "
            f"through DLPack (torch.from_dlpack(a) {op} torch.from_dlpack(b), zero-copy)")


def _index_text(key: Any) -> str:
    keys = key if isinstance(key, tuple) else (key,)

    def one(k: Any) -> str:
        if isinstance(k, slice):
            return ":".join("" if v is None else repr(v) for v in (k.start, k.stop)) + \
                ("" if k.step is None else f":{k.step!r}")
        return "..." if k is Ellipsis else repr(k)
    return ", ".join(one(k) for k in keys)


def _parse_mode(mode: Any) -> Access:
    if type(mode) is Access:
        return mode
    if isinstance(mode, str):
        try:
            return Access[mode.upper().replace("-", "_")]
        except KeyError:
            pass
    raise ValueError(f"unknown access mode {mode!r}: use 'read', 'write', 'read_write' or an ig.Access")


def _parse_by(by: Any) -> str | None:
    return None if by is None else validate_owner(by)


cdef inline object _by(object by):
    """``_parse_by`` without a Python call for the owners every block names (the default
    owner and the layers of Ignis are registered for good: an owner is never unregistered)."""
    if by is None or by is DEFAULT_OWNER or by is _COLLECTIVE:
        return by
    return validate_owner(by)


cdef inline object _mode(object mode):
    """``_parse_mode`` without a Python call for an ``Access``."""
    if type(mode) is Access:
        return mode
    return _parse_mode(mode)


cdef inline NvArray _root_of(NvArray a):
    """The array that holds ``a``'s memory (``a._root()`` as a C call)."""
    while a._base is not None:
        a = <NvArray?>a._base
    return a


cdef class NvArray:
    """A device tensor with an owner, a stream, a ref count and a generation-checked identity.

    Arrays are C-contiguous. Make them with ``ig.empty`` (this constructor),
    ``ig.zeros``, ``ig.full``, ``ig.from_numpy``, ``ig.asarray`` or
    ``ig.from_dlpack``; views (``a[i]``, ``slice``, ``reshape``) share their
    parent's memory and keep it alive. Every operation that touches the bytes is
    a tracked use on the stream it runs on (``stream=None``: the stream a ``with
    stream:`` block made current on the array's device, else the array's own),
    so a use on another stream waits for the work it must follow. An owning
    array that is garbage-collected returns its memory in stream order; an
    explicit ``free()`` does it at once and cancels that.

    An NvArray is a memory container with tracked access: it moves bytes (copies,
    fills, ``a[i] = v``, host transfers) and does no math. For math, hand it to
    PyTorch or CuPy through DLPack (``torch.from_dlpack(a)``, ``cupy.from_dlpack(a)``:
    zero-copy, the same memory); so ``a == b`` and ``bool(a)`` raise ``TypeError``
    rather than compare identities or read device memory.

    Attributes:
        id: a process-unique number, shown as ``NvArray#id`` in errors.
        shape: the shape, a tuple of ints.
        dtype: the element type, an ``ig.DType`` (compares equal to NumPy's dtypes).
        device: the ``ig.Device`` the memory is on.
        stream: the array's own ``Stream`` (the allocation's, for a new array).
        owner: the owner name (``"compute"`` unless a layer acquired it).
        ref_count: references taken with ``incref()`` and not yet dropped.
        created_at: ``time.time()`` at creation, to the system clock's coarse tick (a few
            milliseconds at most).
        numel: the number of elements.
        nbytes: the size in bytes.
    """

    # The fields are declared in nvarray.pxd (typed, readable and writable from Python).

    @property
    def _lock(self) -> ResourceLock:
        return _stripe(self)

    def __init__(self, shape: Any, dtype: Any = _dt.float32, *, device: "Device | int | None" = None,
                 stream: Stream | None = None, owner: str = DEFAULT_OWNER,
                 mr: DeviceMemoryResource | None = None, tag: str = UNTAGGED) -> None:
        """Allocate an uninitialized array (same as ``ig.empty``).

        Args:
            shape: an int or a sequence of non-negative ints.
            dtype: anything ``ig.dtype`` resolves (default float32).
            device: the device (an ``ig.Device`` or ordinal); None: ``stream``'s device, else
                the current device.
            stream: the ``Stream`` the allocation is ordered on, which becomes the array's
                own; None: the current stream of the device.
            owner: the initial owner name (default ``"compute"``).
            mr: the memory resource to allocate from; None: the device's current resource
                (``ig.get_current_resource``, a ``PoolResource`` unless set).
            tag: a label for the allocation, shown in logs, statistics and reports.

        Raises:
            ValueError: a negative or non-integer dimension, an unknown dtype or owner, or a
                ``stream`` on another device than ``device``.
            TypeError: ``stream`` is not an ``ig.Stream``.
            OutOfMemoryError: the resource cannot get the memory (``OutOfBudgetError`` from
                a ``BudgetResource``).
            ClosedError: the stream or the resource was closed.
            StaleHandleError: the stream or the resource predates a context rebuild.
        """
        self._allocate(shape, dtype, device, stream, owner, mr, tag)

    cdef int _allocate(self, shape, dtype, device, stream, owner, mr, tag) except -1:
        """The constructor's work (``ig.empty`` calls it on a new object directly)."""
        cdef tuple f
        self._freed = True  # until memory is in hand, so __del__ does nothing
        if _DEFERRED:
            drain_deferred()
        if type(shape) is int and shape >= 0 and shape <= _INT_SHAPE_MAX:
            numel = shape
            shape = (shape,)
        else:
            shape = _shape(shape)
            numel = _numel(shape)
        if type(dtype) is DType:
            dt = dtype
        else:
            dt = _NAMES_C.get(dtype) if type(dtype) is str else None
            if dt is None:
                dt = _dt.dtype(dtype)
        if owner is not DEFAULT_OWNER and owner != DEFAULT_OWNER:
            validate_owner(owner)
        if stream is None and mr is None and (device is None or device == 0) and not _OVERRIDES[0]:
            f = _defaults_cached()  # None unless the device accepts work (not shut down)
            if f is None:
                f = _defaults()
                if not (<tuple>f)[0].state.accepting_ops:
                    (<tuple>f)[0]._check_usable("allocate an array")
            dev, stream, mr, tracks = f
        else:
            if stream is not None:
                if type(stream) is not Stream:
                    raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
                dev = stream.device
                if device is not None and Device(device) is not dev:
                    raise ValueError(f"stream {stream!r} is on device {dev.ordinal}, not device {device}")
            else:
                dev = _rt_current.current_device() if device is None else Device(device)
                stream = _rt_current.current_stream(dev)
            if not dev.state.accepting_ops:
                dev._check_usable("allocate an array")
            if mr is None:
                mr = get_current_resource(dev)
            tracks = mr.supports_block_use_tracking
        nbytes = numel * dt.itemsize
        if nbytes > MAX_EXTENT or (numel == 0 and len(shape) > 1) or len(shape) > MAX_NDIM:
            _check_fits(shape, dt)
        _identify(self, shape, dt, dev, stream, owner, numel, nbytes, mr)
        self._base = self._views = self._pinned = self._keepalive = self._gate = self._exports = None
        if nbytes:
            if pool_direct(mr, "allocate"):
                block = (<PoolResource>mr)._allocate_c(nbytes, stream, tag)
                self._ptr = (<_Block>block).ptr
            else:
                block = mr.allocate(nbytes, stream, tag)
                self._ptr = block.ptr
            self._block = block
            self._tracks = tracks
        else:
            self._ptr = 0
            self._block = None
            self._tracks = False
        self._freed = False
        if contract.track_all:
            contract.track(self)
        return 0

    @classmethod
    def from_foreign(cls, ptr: int, shape: Any, dtype: Any, device: "Device | int", stream: "Stream | None" = None,
                     *, owner: str = DEFAULT_OWNER, keepalive: Any = None) -> "NvArray":
        """An array over device memory Ignis did not allocate (another library's buffer, an
        import): Ignis never frees it, and ``keepalive`` (the producer's object) lives as long
        as the array and its views. Its uses are not ordered across streams (no block records
        them): the producer's stream order is the program's to keep.

        Args:
            ptr: the device address of the first element.
            shape: the array's shape.
            dtype: its element type (a ``DType`` or its name).
            device: the device the memory is on.
            stream: the array's stream; None: the device's default stream.
            owner: the array's owner (see ``transfer_ownership``).
            keepalive: an object to keep alive while the array is.

        Raises:
            TypeError: ``ptr`` is not an int, or ``stream`` is not a Stream.
            ValueError: ``ptr`` is negative (or 0 for a non-empty array), the shape is invalid,
                or ``stream`` is another device's.
        """
        shp, dt, n, _ = _window(shape, dtype, 0, "from_foreign")
        if type(ptr) is not int and not isinstance(ptr, np.integer) or isinstance(ptr, bool):
            raise TypeError(f"from_foreign: ptr must be an int device address, not {type(ptr).__name__}")
        ptr = int(ptr)
        if ptr < 0 or (ptr == 0 and n):
            raise ValueError(f"from_foreign: {ptr:#x} is not a device address of {shp} {dt.name}")
        validate_owner(owner)
        dev = device if isinstance(device, Device) else Device(device)
        s = dev.default_stream if stream is None else stream
        if not isinstance(s, Stream):
            raise TypeError(f"from_foreign: stream must be an ignis Stream, not {type(s).__name__}")
        if s.device is not dev:
            raise ValueError(f"from_foreign: {s!r} is a stream of device {s.device.ordinal}, not of device "
                             f"{dev.ordinal}")
        return cls._wrap(shp, dt, dev, s, ptr, None, None, owner, keepalive=keepalive)

    @classmethod
    def from_block(cls, block: DeviceBlock, resource: DeviceMemoryResource, shape: Any, dtype: Any,
                   stream: "Stream | None" = None, *, offset: int = 0, owner: str = DEFAULT_OWNER) -> "NvArray":
        """An array over a block that ``resource`` handed out (a resource of one's own, an
        import's mapping), starting ``offset`` bytes in. The array takes the block: ``free()``
        (or the array's collection) hands it back to ``resource``, and its uses are tracked as
        the resource tracks them. Wrap a block once: two arrays over one block would free it twice.

        Args:
            block: a LIVE ``DeviceBlock`` of ``resource`` (``resource.holds(block)``).
            resource: the resource it came from.
            shape: the array's shape.
            dtype: its element type (a ``DType`` or its name).
            stream: the array's stream; None: the block's.
            offset: where the array starts in the block, in bytes.
            owner: the array's owner.

        Raises:
            TypeError: ``block``, ``resource``, ``offset`` or ``stream`` is not one.
            ValueError: the block is not live or not ``resource``'s, the array would leave it, or
                ``stream`` is another device's.
        """
        if type(block) is not DeviceBlock:
            raise TypeError(f"from_block: block must be a DeviceBlock, not {type(block).__name__}")
        if not isinstance(resource, DeviceMemoryResource):
            raise TypeError(f"from_block: resource must be a DeviceMemoryResource, not {type(resource).__name__}")
        if block.state is not BlockState.LIVE:
            raise ValueError(f"from_block: block {block.ptr:#x} is {block.state.name}, not LIVE")
        if not resource.holds(block):
            raise ValueError(f"from_block: block {block.ptr:#x} is not a live block of {type(resource).__name__}: "
                             "an array frees its block into the resource named, so it must be the one that made it")
        shp, dt, n, offset = _window(shape, dtype, offset, "from_block")
        if offset + n > block.bytes:
            raise ValueError(f"from_block: bytes [{offset}, {offset + n}) of {shp} {dt.name} leave block "
                             f"{block.ptr:#x} ({block.bytes} bytes)")
        validate_owner(owner)
        s = block.alloc_stream if stream is None else stream
        if not isinstance(s, Stream):
            raise TypeError(f"from_block: stream must be an ignis Stream, not {type(s).__name__}")
        if s.device is not resource.device:
            raise ValueError(f"from_block: {s!r} is not a stream of device {resource.device.ordinal}")
        return cls._wrap(shp, dt, resource.device, s, block.ptr + offset, block, resource, owner)

    @classmethod
    def _wrap(cls, shape: tuple[int, ...], dt: DType, device: Device, stream: Stream, ptr: int,
              block: DeviceBlock | None, mr: DeviceMemoryResource | None, owner: str,
              base: "NvArray | None" = None, keepalive: Any = None) -> "NvArray":
        """An array over memory it does not allocate (a view or foreign memory)."""
        cdef NvArray a = NvArray.__new__(cls)
        numel = _numel(shape)
        _identify(a, shape, dt, device, stream, owner, numel, numel * dt.itemsize, mr)
        a._ptr = ptr
        a._block = block
        a._tracks = bool(mr is not None and block is not None and mr.supports_block_use_tracking)
        a._base = base
        a._views = a._pinned = a._gate = a._exports = None
        a._keepalive = keepalive
        a._freed = False
        return a

    # -- identity ------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def freed(self) -> bool:
        """True once ``free()`` succeeded on this array."""
        return self._freed

    @property
    def is_view(self) -> bool:
        """True for a view into another array's memory (``base`` is that array)."""
        return self._base is not None

    @property
    def base(self) -> "NvArray | None":
        """The array this one is a view of, or None."""
        return self._base

    @property
    def owns_memory(self) -> bool:
        """True if this array allocated its memory and frees it (not a view, not foreign memory,
        not empty)."""
        return self._base is None and self._block is not None and self._keepalive is None

    @property
    def generation(self) -> int | None:
        """The generation of the block this array's bytes live in (None for foreign memory)."""
        return None if self._block is None else self._block.generation

    @property
    def tag(self) -> str | None:
        """The allocation's tag, or None where there is no block (foreign memory, zero bytes)."""
        return None if self._block is None else self._block.tag

    @property
    def device_id(self) -> int:
        """The ordinal of the array's device."""
        return self.device.ordinal

    @property
    def device_ptr(self) -> int:
        """The device address (for FFI). Raises ``UseAfterFreeError`` if the array was freed.

        Taking the address is not a tracked use: queue work on it inside ``use()``."""
        if self._freed is not False or not _in_context(self):
            self._check_live("take the device pointer of")
        return self._ptr

    @property
    def resource(self) -> DeviceMemoryResource | None:
        """The memory resource the array's block came from (None for foreign memory)."""
        return self._mr

    @property
    def block(self) -> "DeviceBlock | None":
        """The block the array's bytes live in (its root's, for a view); None for foreign
        memory and for zero bytes. For resources and tools: it is the resource's to free."""
        return self._block

    @property
    def root(self) -> "NvArray":
        """The array that holds this one's memory: itself, unless it is a view."""
        return _root_of(self)

    @property
    def tracked(self) -> bool:
        """Whether the array's resource orders its uses across streams (``use()`` queues the
        waits a use needs); an untracked array may only be used on its own stream, or after
        the program ordered it there."""
        return bool(self._tracks)

    def check_usable(self, what: str = "use", access: "Access | None" = None) -> None:
        """Raise unless the array may be touched now: not freed, no freed base, made in its
        device's current context, and no mark on it or its base refuses ``access`` (read-only
        memory refuses a write; a failed operation's target refuses everything). Every
        operation that takes an array passes here before it touches the array's memory.

        Args:
            what: the operation, as the error names it ("save", "use in all_reduce").
            access: what it would do to the bytes (an ``Access``), or None (nothing yet).

        Raises:
            UseAfterFreeError: the array or its base was freed.
            StaleHandleError: its device's context was rebuilt since it was made.
            ReadOnlyError: ``access`` writes, and the memory is read-only.
        """
        if not _plainly_usable(self):
            self._check_live(what, access)

    def mark_read_only(self, reason: str) -> None:
        """From now on refuse every write to this array and its views (reads pass), saying
        ``reason`` (for memory whose producer said it is read-only, such as a DLPack import
        with its read-only flag).

        Args:
            reason: why, as the errors say it.
        """
        if not isinstance(reason, str) or not reason:
            raise TypeError("mark_read_only needs the reason as a non-empty str")
        self._gate = _ReadOnly(reason)

    def mark_failed(self, make_error: Any) -> None:
        """A failed operation was to write this array (a collective that failed, say): from
        now on every access to it, to its root and to every view of them raises
        ``make_error(array, what)``; freeing stays allowed.

        Args:
            make_error: called as ``make_error(array, what)``; returns the exception to raise.
        """
        if not callable(make_error):
            raise TypeError(f"mark_failed needs a function make_error(array, what), not {type(make_error).__name__}")
        self._poison(make_error)

    def view_bytes(self, offset: int, shape: Any, dtype: Any) -> "NvArray":
        """A zero-copy view of ``shape`` elements of ``dtype`` starting ``offset`` bytes into
        this array (a typed window into one buffer: a loader that places many tensors in one
        allocation). The view shares the array's memory, owner and stream, as views do.

        Args:
            offset: the first byte, a multiple of ``dtype``'s item size (an empty view may
                start at any offset, past the end too: it touches no byte).
            shape: the view's shape.
            dtype: the view's element type (a ``DType`` or its name).

        Raises:
            ValueError: the window leaves the array, or ``offset`` is misaligned or negative.
            UseAfterFreeError / StaleHandleError: as ``check_usable``.
        """
        self._check_live("view")
        shp, dt, n, offset = _window(shape, dtype, offset, "view_bytes")
        if n and offset + n > self.nbytes:  # an empty window touches no byte: anywhere
            raise ValueError(f"view_bytes: bytes [{offset}, {offset + n}) of {shp} {dt.name} leave NvArray#{self.id} "
                             f"({self.nbytes} bytes)")
        if offset % dt.itemsize:
            raise ValueError(f"view_bytes: offset {offset} is not a multiple of {dt.name}'s item size "
                             f"({dt.itemsize} bytes)")
        return self._register_view(NvArray._wrap(shp, dt, self.device, self.stream, self._ptr + offset,
                                                 self._block, self._mr, self.owner, base=self))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d NvArray")
        return self.shape[0]

    # An array is a memory container: no math, so no element-wise ``==`` and no truth value
    # (either would mean reading device memory behind the program's back). Identity is what
    # hashing and ``is`` use, as for any object.
    def __eq__(self, other: Any) -> NoReturn:
        raise TypeError(_no_comparison(self, "=="))

    def __ne__(self, other: Any) -> NoReturn:
        raise TypeError(_no_comparison(self, "!="))

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __bool__(self) -> NoReturn:
        raise TypeError(
            f"the truth value of NvArray#{self.id} ({self.numel} element(s) in device memory) is not defined: "
            "reading it would copy from the device. Test for an array with `a is not None`, for emptiness "
            "with `a.numel == 0`; read a one-element array's value with a.item(); compare values on the "
            "host (a.to_numpy()) or on the device with PyTorch or CuPy (torch.from_dlpack(a), zero-copy)")

    @property
    def size(self) -> int:
        """The number of elements (NumPy's and CuPy's name for ``numel``)."""
        return self.numel

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Bytes to step in each dimension (arrays and views are C-contiguous)."""
        out, step = [], self.dtype.itemsize
        for d in reversed(self.shape):
            out.append(step)
            step *= max(d, 1)
        return tuple(reversed(out))

    def __repr__(self) -> str:
        """Shape, dtype, device, stream and a few values, as NumPy, PyTorch and CuPy print
        theirs (reading the values waits for the array's pending writes). Never raises."""
        where = f"dtype={self.dtype.name}, device={self.device.ordinal}, stream=#{self.stream.id}"
        if self.owner != DEFAULT_OWNER:
            where += f", owner={self.owner}"
        if self.readonly:
            where += ", readonly"
        head = f"ignis.NvArray#{self.id}("
        try:
            self._check_live("show")
            values = np.array2string(self._peek(), separator=", ", prefix=head, threshold=24, edgeitems=3)
        except Exception as e:  # freed, poisoned, or a failed read: say so instead of the values
            return f"<{head}shape={self.shape}, {where}): {type(e).__name__}: {str(e).splitlines()[0]}>"
        return f"{head}{values}, shape={self.shape}, {where})"

    def _peek(self) -> np.ndarray:
        """The values a repr shows: all of a small array; the first and last few of a large one."""
        if self.numel <= 1024:
            return self.to_numpy()
        flat = self.reshape(-1)
        ends = np.concatenate([flat[:3].to_numpy(), flat[-3:].to_numpy()])
        # an array that array2string summarizes to exactly these six values
        return np.concatenate([ends[:3], np.zeros(1019, ends.dtype), ends[3:]])

    # -- liveness and tracked use ------------------------------------------------
    def _check_live(self, what: str = "use", access: Access | None = None, op: str | None = None) -> None:
        """Raise unless this array may be touched: not freed, no freed base, made in its
        device's current context (no ``Device.rebuild()`` since: the memory is gone and its
        addresses may belong to new arrays), and every gate on the way to the root passed
        (read-only memory refuses an ``access`` that writes; a failed operation's target
        refuses everything). Every operation that takes an array passes here before it
        touches the array's memory (the tracked use, ``begin_use``, sends it here whenever
        its fast test does not vouch for the array)."""
        a = self
        while a is not None:
            if a._freed:
                if a is self:
                    raise UseAfterFreeError(f"cannot {what} NvArray#{self.id}: it was freed", array_id=self.id,
                                            generation=self.generation, ptr=self._ptr)
                raise UseAfterFreeError(f"cannot {what} NvArray#{self.id}: its base NvArray#{a.id} was freed",
                                        array_id=self.id, generation=self.generation, ptr=self._ptr)
            a = a._base
        if not _in_context(self):
            self._stale(what)
        a = self
        while a is not None:
            if a._gate is not None:
                a._gate.check(self, op or what, access)
            a = a._base

    def _stale(self, what: str) -> None:
        """Raise the error for an array made before its device's context was rebuilt (or in
        the parent of a forked process)."""
        dev = self.device
        state = dev.state
        if state.forked_from is not None:
            raise dev.backend.forked_error(f"{what} NvArray#{self.id}")
        raise StaleHandleError("context rebuilt", what=f"NvArray#{self.id}", op=what,
                               generation=self.stream._generation, current_generation=state.generation,
                               device_id=dev.ordinal)

    @property
    def readonly(self) -> bool:
        """True for memory that must not be written (a read-only DLPack import, and its views)."""
        a: NvArray | None = self
        while a is not None:
            if isinstance(a._gate, _ReadOnly):
                return True
            a = a._base
        return False

    def _poison(self, make_error: Any) -> None:
        """A failed operation was to write this array: from now on every access to it, to its
        root and to every view of them raises ``make_error(array, what)``; freeing stays allowed."""
        cdef NvArray root = self._root()
        root._gate = _Poisoned(make_error)

    def use(self, stream: Stream | None = None, access: "Access | str" = _RW) -> "TrackedUse":
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
            StaleHandleError: the array or the stream predates a context rebuild (on entry).
        """
        cdef TrackedUse u = TrackedUse.__new__(TrackedUse)
        u.array = self
        u.stream = self.stream if stream is None else stream
        u.access = access if type(access) is Access else Access.parse(access)
        return u

    def access(self, stream: Stream | None = None, mode: "Access | str" = "read", *, by: str | None = DEFAULT_OWNER,
               op: str = "access()", offset: int = 0, nbytes: int | None = None,
               finish_on_error: bool = True) -> "_TrackedAccess":
        """A tracked access to bytes of this array for owner ``by``, as a ``with`` block that
        gives their device address: the one way a layer (Ignis's own, or yours) touches an
        array's memory outside Ignis's operations.

        Entering the block (1) checks the array (not freed, no freed base, no failed
        operation's poison, no write to read-only memory) and its owner, (2) acquires it for
        ``by`` when ``by`` is a layer (``ig.contract.acquire``: a view acquires its root),
        (3) prepares the use on ``stream``: the waits it needs after earlier uses on other
        streams are queued there, and the sanitizer, if on, checks the bytes, exactly as
        ``use()`` and Ignis's own operations do; then gives the address of byte ``offset``.
        Leaving it (4) records the use on ``stream``, so later uses and the free are ordered
        after the work queued in the block, and (5) releases what (2) acquired. If the block
        raises, the use is still recorded (the work queued before the error must be waited
        for) unless ``finish_on_error=False``, and the array is released either way. Nothing
        is recorded for a use whose preparation failed, and an array that could not be
        acquired is left as it was.

        Owners: ``by="compute"`` (the default) is your own code: the array must not be held
        by a layer, and nothing is acquired. A layer's name (``"io"``, ``"collective"``,
        ``"ipc"``, or one from ``ig.register_owner``) holds the array for the block: refused,
        as ``contract.acquire`` refuses, while any layer (``by`` itself included) holds it or
        it is shared (``ref_count > 1``). ``by=None`` skips ownership: a plain tracked use
        whoever holds the array, for a layer that already holds it for longer than one
        access (a collective group) or for protocol exports. Several arrays at once:
        ``NvArray.access_all``.

        Args:
            stream: the ``Stream`` the work on the pointer is queued on; None: the stream a
                ``with stream:`` block made current on the array's device, else the array's own.
            mode: what the work does to the bytes: ``"read"`` (default), ``"write"``,
                ``"read_write"`` or an ``ig.Access``.
            by: the owner making the access (see above); default ``"compute"``.
            op: the operation's name, shown in sanitizer reports and errors.
            offset: the first byte used, from the array's start (default 0).
            nbytes: how many bytes are used; None: from ``offset`` to the end.
            finish_on_error: whether a ``with`` block that raises still records the use
                (default True). False only where the block queues nothing it leaves behind
                when it raises (a failed collective poisons what it was to write).

        Returns:
            A context manager; ``with a.access(...) as ptr:`` gives the device address of
            byte ``offset`` (an int).

        Raises:
            ValueError: an unknown ``mode`` or owner, or a negative ``nbytes``.
            TypeError: ``stream`` is not an ``ig.Stream``, or ``offset`` / ``nbytes`` are not ints.
            OutOfBoundsError: ``[offset, offset + nbytes)`` leaves the array.
            UseAfterFreeError: the array (or its base) was freed.
            ReadOnlyError: ``mode`` writes to read-only memory.
            MemoryContractViolation: the owner rules above refuse the access.
            StreamMisuseError: the array's resource cannot track cross-stream uses and
                ``stream`` is not the block's own.
            ClosedError: the stream was closed.
            StaleHandleError: the array or the stream predates a context rebuild.

        Example::

            ig.register_owner("prefetcher")
            with x.access(s, "write", by="prefetcher", op="prefetch") as ptr:
                my_library.fill(ptr, x.nbytes, stream=s.handle)   # queued on s
        """
        acc = _parse_mode(mode)
        s = _stream_for(self, None) if stream is None else _check_stream(stream)
        off, n = self._byte_range(offset, nbytes, op)
        return _tracked_access([(self, acc, off, n)], s, _by(by), op, finish_on_error, True)

    @staticmethod
    def access_all(uses: Any, stream: Stream | None = None, *, by: str | None = DEFAULT_OWNER,
                   op: str = "access()", finish_on_error: bool = True) -> "_TrackedAccess":
        """Tracked accesses to several arrays at once, as one ``with`` block (``access`` for
        each, all or nothing): every array is checked and acquired for ``by`` before any use
        is prepared, so an array that is refused leaves the others untouched; the uses are
        then prepared in order, recorded in order when the block ends, and the arrays
        released. Two views of one root acquire it once.

        Args:
            uses: ``(NvArray, mode)`` or ``(NvArray, mode, offset, nbytes)`` for each use, as the
                arguments of ``access``. ``mode=None`` holds the array for ``by`` with the
                others but makes no tracked use of it: the caller orders its work on it
                itself (for memory whose resource cannot track, waited for on its stream).
            stream: the ``Stream`` the work is queued on; None: the first array's, as for
                ``access``.
            by: the owner making the accesses, as for ``access``.
            op: the operation's name, shown in sanitizer reports and errors.
            finish_on_error: as for ``access``.

        Returns:
            A context manager that gives the list of device addresses, one per use.

        Raises:
            TypeError: a use is not ``(NvArray, mode[, offset, nbytes])``; the rest as ``access``.
        """
        return access_block(uses, stream, by, op, finish_on_error)

    def _byte_range(self, offset: Any, nbytes: Any, op: str) -> tuple[int, int]:
        """``(offset, nbytes)`` checked against this array's bytes (``nbytes`` None: to the end)."""
        if type(offset) is not int:
            if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
                raise TypeError(f"{op}: offset must be an int, got {type(offset).__name__}")
            offset = int(offset)
        if nbytes is None:
            n = self.nbytes - offset
        elif isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise TypeError(f"{op}: nbytes must be an int or None, got {type(nbytes).__name__}")
        else:
            n = int(nbytes)
            if n < 0:
                raise ValueError(f"{op}: nbytes must be >= 0, got {n}")
        if offset < 0 or offset + n > self.nbytes or n < 0:
            raise OutOfBoundsError(
                f"{op}: bytes [{offset}, {offset + max(n, 0)}) of NvArray#{self.id}, which has {self.nbytes} bytes",
                ptr=self._ptr, generation=self.generation, tag=self.tag, side="before" if offset < 0 else "after",
                offset=offset if offset < 0 else offset + max(n, 0), array_id=self.id)
        return offset, n

    # -- ownership and reference counts -------------------------------------------
    def incref(self) -> int:
        """Note that another component holds this array (``free()`` refuses while any does).

        Returns:
            The new ``ref_count``.

        Raises:
            UseAfterFreeError: the array was freed.
        """
        with self._lock:
            self._check_live("incref")
            self.ref_count += 1
            return self.ref_count

    def decref(self) -> int:
        """Drop a reference taken with ``incref()``.

        Returns:
            The new ``ref_count``.

        Raises:
            UseAfterFreeError: the array was freed.
            MemoryContractViolation: ``ref_count`` is already 0.
        """
        with self._lock:
            self._check_live("decref")
            if self.ref_count <= 0:
                raise MemoryContractViolation(f"NvArray#{self.id} ref_count is already 0: decref without incref",
                                              array_id=self.id, owner=self.owner)
            self.ref_count -= 1
            return self.ref_count

    def transfer_ownership(self, new_owner: str) -> str:
        """Hand the array to ``new_owner`` directly (``contract.acquire`` / ``release``
        are the checked way for layers). A view's owner is its root's: handing a view
        over hands over the root and every view of it.

        Args:
            new_owner: a registered owner name.

        Returns:
            ``new_owner``.

        Raises:
            ValueError: ``new_owner`` is not a registered owner.
            UseAfterFreeError: the array was freed.
            MemoryContractViolation: the root's ``ref_count`` is above 1.
        """
        validate_owner(new_owner)
        root = self._root()
        with root._lock:
            self._check_live("transfer ownership of")
            if root.ref_count > 1:
                raise MemoryContractViolation(
                    f"cannot transfer ownership of NvArray#{root.id} while ref_count={root.ref_count} > 1",
                    array_id=root.id, owner=root.owner, caller=new_owner)
            root._set_owner(new_owner)
        return new_owner

    def _root(self) -> "NvArray":
        """The array that holds this one's memory (itself unless it is a view)."""
        return _root_of(self)

    def _set_owner(self, owner: str) -> "list[NvArray]":
        """Set the owner of this root array and of every live view of it (their owner is
        its). Returns the arrays changed."""
        cdef NvArray a
        todo, done = [self], []
        while todo:
            a = todo.pop()
            a.owner = owner
            done.append(a)
            if a._views:
                todo.extend(v for v in (r() for r in a._views) if v is not None)
        return done

    def ref(self) -> "GpuRef":
        """A generation-checked handle that keeps this array's memory alive (a ``GpuRef``).

        Raises:
            UseAfterFreeError: the array was freed.
        """
        from ..safety import GpuRef
        self._check_live("take a GpuRef to")
        return GpuRef(self)

    # -- free ------------------------------------------------------------------
    def free(self, by: str = DEFAULT_OWNER) -> None:
        """Give the memory back (stream-ordered). Views only mark themselves freed.

        The block goes back to its resource (``deallocate``, stream-ordered), and
        the pinned staging buffer of ``pin()`` goes back too. An array that adopted
        foreign memory (``from_dlpack``) drops its reference to the producer. An
        array exported through ``__cuda_array_interface__`` (which has no release
        signal) is retired at once, but its memory goes back only when the array
        object is collected.

        Refused (``MemoryContractViolation``) while ``ref_count > 0``, while a layer other
        than ``by`` owns the array, while views of it are alive, and while a DLPack consumer
        still holds an export of it. If the resource refuses to take the memory back (a
        driver error), the error is raised and the array stays live: ``free()`` can be
        called again.

        Args:
            by: the owner freeing the array (default ``"compute"``); it must be the owner.

        Raises:
            DoubleFreeError: the array was already freed.
            MemoryContractViolation: one of the refusals above; the array is untouched.
            DriverError: the resource refused the memory (the array stays live).
        """
        cdef bint refused
        if _DEFERRED:
            drain_deferred()
        cdef ResourceLock lk = _stripe(self)
        lock_take(lk)
        try:
            refused = self._freed is not False or self.ref_count > 0 or \
                (self.owner is not by and self.owner != by) or self._views or self._exports
            if not refused:
                self._freed = True
        finally:
            lock_give(lk)
        if refused:
            self._free_checked(by)  # the full checks: raises, or frees an array with dead views
            return
        if self._pinned is None and self._keepalive is None:  # the common case
            if self._base is None and self._block is not None:
                try:
                    pool_deallocate(self._mr, self._block)
                except BaseException:
                    self._freed = False  # the resource kept the block: it can be freed again
                    raise
            return
        self._give_back()

    def _live_exports(self) -> tuple[list, bool]:
        """(the live DLPack export tokens, whether it was exported through the CUDA array
        interface); forgets dead tokens. Call with the array's lock held."""
        exports = self._exports
        if not exports:
            return [], False
        live = [t for t in (e() for e in exports if e is not _CAI) if t is not None]
        cai = _CAI in exports
        if not live and not cai:
            self._exports = None
        elif len(live) + cai < len(exports):
            self._exports = [weakref.ref(t) for t in live] + ([_CAI] if cai else [])
        return live, cai

    def _add_export(self, token: "_Export | str") -> None:
        """Count an export (a DLPack token, or _CAI) on this array and on each base up to its root."""
        cdef NvArray a = self
        while a is not None:
            with a._lock:
                if a._exports is not None and len(a._exports) > 64:
                    a._live_exports()
                if a._exports is None:
                    a._exports = []
                if token is not _CAI:
                    a._exports.append(weakref.ref(token))
                elif _CAI not in a._exports:
                    a._exports.append(_CAI)
            a = a._base

    def _free_checked(self, by: str) -> None:
        lock = _stripe(self)
        lock.acquire()
        try:
            if self._freed is not False:
                raise DoubleFreeError(f"NvArray#{self.id} was already freed", array_id=self.id,
                                      generation=self.generation, ptr=self._ptr)
            if self.ref_count > 0:
                raise MemoryContractViolation(
                    f"cannot free NvArray#{self.id} while ref_count={self.ref_count} > 0 (another component "
                    "holds it; it must decref first)", array_id=self.id, owner=self.owner, caller=by)
            if self.owner != by:
                raise MemoryContractViolation(
                    f"NvArray#{self.id} is owned by {self.owner!r}; {by!r} cannot free it (the owner must "
                    "release it first)", array_id=self.id, owner=self.owner, caller=by)
            exports, _ = self._live_exports()
            if exports:
                names = ", ".join(sorted({f"NvArray#{t.array_id}" for t in exports}))
                raise MemoryContractViolation(
                    f"cannot free NvArray#{self.id}: {len(exports)} DLPack export(s) of its memory are still "
                    f"alive (exported from {names}), so a consumer (NumPy, PyTorch, CuPy, ...) may still use "
                    "it. Drop what the consumer imported first; or drop this array instead of freeing it: "
                    "its memory then goes back when the last consumer lets go",
                    array_id=self.id, owner=self.owner, caller=by, exports=len(exports))
            views = self._views
            if views:
                live = [v for v in (r() for r in views) if v is not None and not v._freed]
                if live:
                    raise MemoryContractViolation(
                        f"cannot free NvArray#{self.id}: {len(live)} view(s) of it are still alive "
                        f"(NvArray#{', #'.join(str(v.id) for v in live[:5])}); free or drop the views first",
                        array_id=self.id, owner=self.owner, caller=by)
            self._freed = True
        finally:
            lock.release()
        self._give_back()

    def _give_back(self) -> None:
        """After ``_freed`` was set: the pinned buffer, then the block (or the foreign memory's
        keep-alive). A block the resource refuses to take back leaves the array live."""
        pinned = self._pinned
        try:
            if pinned is not None:
                self._pinned = None
                pinned.release(self.stream)
        finally:
            if self._base is None and self._block is not None:
                if self._keepalive is None:
                    if self._exports is not None and _CAI in self._exports:
                        # Exported with no release signal: back when this object is collected.
                        self._keepalive = _ReturnWhenCollected(self._mr, self._block)
                    else:
                        try:
                            self._mr.deallocate(self._block)
                        except BaseException:
                            self._freed = False
                            raise
            elif self._keepalive is not None:
                self._keepalive = None

    def __del__(self) -> None:
        if self._freed is not False or ignis_finalizing():
            return
        self._freed = True
        pinned = self._pinned
        block = self._block if self._base is None and self._keepalive is None else None
        if pinned is None and block is None:
            return
        if _in_gc[0]:
            # The cyclic collector may run while this thread holds a resource's
            # lock: hand the memory back later, from a safe place.
            _deferred.append((self._mr, block, pinned))
            return
        if pinned is None:
            try:
                pool_deallocate(self._mr, block)
            except Exception:
                pass  # as _release: a failed return at collection is not raised
            return
        _release(self._mr, block, pinned)

    # -- views -------------------------------------------------------------------
    def _view(self, shape: tuple[int, ...], offset: int) -> "NvArray":
        self._check_live("view")
        return self._register_view(NvArray._wrap(shape, self.dtype, self.device, self.stream, self._ptr + offset,
                                                 self._block, self._mr, self.owner, base=self))

    def _register_view(self, v: "NvArray") -> "NvArray":
        """Keep a weak reference to the new view ``v`` (its owner follows this array's)."""
        with self._lock:
            if self._views is None:
                self._views = []
            elif len(self._views) > 64:
                self._views = [r for r in self._views if r() is not None]
            self._views.append(weakref.ref(v))
        return v

    def slice(self, dim: int, start: int, length: int) -> "NvArray":
        """A zero-copy view of ``[start, start + length)`` along ``dim``; only contiguous slices."""
        nd = len(self.shape)
        if not (isinstance(dim, int) and -nd <= dim < nd):
            raise ValueError(f"dimension {dim} out of range for shape {self.shape}")
        dim %= nd
        size = self.shape[dim]
        if not (isinstance(start, int) and isinstance(length, int)) or start < 0 or length < 0 \
                or start + length > size:
            raise ValueError(f"slice [{start}, {start}+{length}) exceeds dimension {dim} of size {size} "
                             f"in shape {self.shape}")
        leading = _numel(self.shape[:dim])
        if leading > 1 and length != size:
            raise ValueError(f"slice(dim={dim}) of shape {self.shape} would be strided (non-contiguous), which "
                             "a view cannot represent; use a copy (e.g. a gather kernel, or to_numpy() and "
                             "from_numpy()) for strided slices")
        trailing = _numel(self.shape[dim + 1:])
        shape = self.shape[:dim] + (length,) + self.shape[dim + 1:]
        return self._view(shape, start * trailing * self.dtype.itemsize)

    def reshape(self, *shape: Any) -> "NvArray":
        """A zero-copy view with another shape of the same number of elements (one -1 allowed)."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        dims = [operator.index(d) for d in shape]
        if dims.count(-1) > 1:
            raise ValueError("only one dimension can be -1 in reshape")
        if -1 in dims:
            known = _numel(tuple(d for d in dims if d != -1))
            if known == 0 or self.numel % known:
                raise ValueError(f"cannot reshape {self.shape} ({self.numel} elements) into {tuple(shape)}")
            dims[dims.index(-1)] = self.numel // known
        new = _shape(tuple(dims))
        if _numel(new) != self.numel:
            raise ValueError(f"cannot reshape {self.shape} ({self.numel} elements) into {new} "
                             f"({_numel(new)} elements)")
        _check_fits(new, self.dtype)
        return self._view(new, 0)

    def __getitem__(self, key: Any) -> "NvArray":
        """A zero-copy view: integers and contiguous slices, as long as the bytes selected
        are contiguous (``a[i]``, ``a[i, j]``, ``a[2:5]``, ``a[i, 2:5]``, ``a[1:3, :]``)."""
        if not isinstance(key, tuple):
            key = (key,)
        if key.count(Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        if len(key) > self.ndim:
            raise IndexError(f"too many indices ({len(key)}) for an array of {self.ndim} dimension(s)")
        out = self
        for done, k in enumerate(key):  # each index applies to the first remaining dimension
            if isinstance(k, slice):
                break
            if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
                raise TypeError(f"NvArray views take integers, contiguous slices and '...', not "
                                f"{type(k).__name__}; for fancy or boolean indexing copy to the host "
                                "(to_numpy()) or gather on the device (ig.kernels.gather)")
            n = out.shape[0]
            i = operator.index(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} out of range for a dimension of size {n}")
            out = out.slice(0, i % n, 1).reshape(out.shape[1:])
        else:
            return out
        # a slice: the rest of the key must be full slices, or the view would be strided
        start, stop, step = k.indices(out.shape[0])
        if step != 1:
            raise ValueError("only contiguous slices (step 1) are views; use a copy for strided selection "
                             "(to_numpy()[...] on the host, or ig.kernels.gather on the device)")
        for j, rest in enumerate(key[done + 1:], 1):
            if not (isinstance(rest, slice) and rest.indices(out.shape[j]) == (0, out.shape[j], 1)):
                raise ValueError(f"index {key!r} selects a strided (non-contiguous) region of shape {self.shape}, "
                                 "which a view cannot represent; index the leading dimensions first "
                                 "(a[i][2:5]) or copy (to_numpy()[...], ig.kernels.gather)")
        return out.slice(0, start, max(0, stop - start))

    def __setitem__(self, key: Any, value: Any) -> None:
        """``a[key] = value``: a tracked write of the region ``a[key]`` selects (integers and
        contiguous slices, as for views), on the array's stream (or the current one of a
        ``with stream:`` block). ``value``: a scalar (every element of the region set to it,
        on the device), a host array or sequence (broadcast to the region's shape, converted
        to the dtype and copied host to device), or an NvArray of the region's shape and
        dtype (copied device to device).

        Raises:
            IndexError: an index out of range, or too many indices.
            TypeError: an index that is not an integer or a slice (fancy, boolean indexing).
            ValueError: a region that is not contiguous (a step other than 1, a slice before
                an integer), or a value that does not fit the region.
        """
        try:
            region = self[key]
        except (TypeError, ValueError) as e:
            raise type(e)(
                f"NvArray#{self.id}[{_index_text(key)}] = ...: only a contiguous region is written in place "
                "(integers and slices of step 1 that leave the trailing dimensions whole: a[i] = v, a[2:5] = v, "
                "a[i, 2:5] = v); write other regions through PyTorch or CuPy (torch.from_dlpack(a)[...] = v, "
                "zero-copy) or on the host (h = a.to_numpy(); h[...] = v; a.from_host(h))") from None
        if isinstance(value, NvArray):
            if value.shape != region.shape or value.dtype is not region.dtype:
                raise ValueError(f"NvArray#{self.id}[{_index_text(key)}] = NvArray#{value.id}: the region is "
                                 f"{region.shape} {region.dtype.name}, the value {value.shape} {value.dtype.name}; "
                                 "an array is assigned only to a region of its shape and dtype")
            region.copy_(value)
        elif np.ndim(value) == 0:
            _fill(region, value, None, "a[...] = value")
        else:
            host = np.asarray(value)
            try:
                host = np.broadcast_to(host, region.shape)
            except ValueError:
                raise ValueError(f"NvArray#{self.id}[{_index_text(key)}] = value: a value of shape {host.shape} "
                                 f"does not fit the region of shape {region.shape}") from None
            host = np.ascontiguousarray(host, dtype=self.dtype.numpy).reshape(-1)
            _upload(region, host.view(np.uint8), None, "a[...] = value")

    def __delitem__(self, key: Any) -> NoReturn:
        raise TypeError(f"NvArray#{self.id}: elements cannot be deleted (an array's size is fixed); make a new "
                        "array of the size you want and copy into it")

    # -- bytes in and out: memset, fill, device and host copies (bodies: _transfers.pxi) --------
    def zero_(self, *, stream: Stream | None = None) -> "NvArray":
        """Set every byte to zero with a device memset."""
        return _zero(self, stream)

    def fill_(self, value: Any, *, stream: Stream | None = None) -> "NvArray":
        """Set every element to ``value``, on the device (a memset when all bytes
        of the element are equal, otherwise one element written and doubled by
        device-to-device copies)."""
        if np.ndim(value) != 0:
            raise TypeError(f"fill_ takes one scalar value, got {type(value).__name__} of shape "
                            f"{np.shape(value)}; to write several values use from_host(...)")
        return _fill(self, value, stream, "fill_")

    def copy_(self, src: "NvArray", *, stream: Stream | None = None) -> "NvArray":
        """Copy ``src``'s bytes into this array (same shape and dtype), device to device; also
        from an array on another device: peer to peer where the two devices allow it (their
        peer access is enabled on first use), else staged through pinned host memory; queued
        on this array's stream, ordered after the source's pending writes, and the source
        kept from reuse and later writes until the copy has read it."""
        return _copy_into(self, src, stream)

    def clone(self, *, stream: Stream | None = None) -> "NvArray":
        """An independent, owned copy with the same shape, dtype, owner and bytes."""
        return _clone(self, stream)

    def copy(self, *, stream: Stream | None = None) -> "NvArray":
        """A new array with the same contents (``clone()``: NumPy's and CuPy's name)."""
        return _clone(self, stream)

    def write_rows(self, src: "NvArray", start_row: int, *, stream: Stream | None = None) -> "NvArray":
        """Copy ``src`` (rows of the same width) into this buffer from row ``start_row``
        on (the KV-cache append): O(rows written), device to device."""
        return _write_rows(self, src, start_row, stream)

    def from_host_raw(self, data: Any, *, stream: Stream | None = None) -> "NvArray":
        """Copy bytes already in this dtype's little-endian layout to the device, with no
        per-element conversion (exact for bfloat16 / float16)."""
        mv = memoryview(data).cast("B")
        if mv.nbytes != self.nbytes:
            raise ValueError(f"from_host_raw: expected {self.nbytes} bytes for shape {self.shape} "
                             f"{self.dtype.name}, got {mv.nbytes} bytes")
        _upload(self, np.frombuffer(mv, np.uint8), stream, "host-to-device copy")
        return self

    def from_host(self, data: Any, *, stream: Stream | None = None) -> "NvArray":
        """Copy host values (a sequence or NumPy array of ``numel`` elements, any shape) to the device."""
        arr = np.asarray(data)
        if arr.size != self.numel:
            raise ValueError(f"from_host: expected {self.numel} elements for shape {self.shape}, "
                             f"got {arr.size}")
        arr = np.ascontiguousarray(arr, dtype=self.dtype.numpy).reshape(-1)
        _upload(self, arr.view(np.uint8), stream, "host-to-device copy")
        return self

    def to_numpy(self, *, stream: Stream | None = None) -> np.ndarray:
        """Copy to a new NumPy array (waits for the copy). Large results live in pinned memory.
        An operation that failed while the host waited and was to write this array (a
        collective) makes this raise its error instead of returning what the copy read."""
        return _to_numpy(self, stream)

    def to_host(self, *, stream: Stream | None = None) -> np.ndarray:
        """The same as ``to_numpy()``: a copy in a new NumPy array (waits for the copy)."""
        return _to_numpy(self, stream)

    def tolist(self) -> Any:
        """The values as nested Python lists (``to_numpy().tolist()``; waits for the copy)."""
        return _to_numpy(self, None).tolist()

    def item(self, *, stream: Stream | None = None) -> Any:
        """The value of a one-element array as a Python scalar (a tracked read; waits for the copy).

        Raises:
            ValueError: the array has more or fewer than one element.
        """
        self._check_live("read an element of", _READ, "item()")
        if self.numel != 1:
            raise ValueError(f"item() reads a one-element array; NvArray#{self.id} has {self.numel} elements "
                             f"(shape {self.shape}): index one first (a[i].item()) or copy them all (to_numpy())")
        return _to_numpy(self, stream).reshape(()).item()

    def pin(self) -> "PinnedBuffer":
        """Give the array its own pinned host staging buffer (``pinned_host``).

        Returns:
            The ``PinnedBuffer`` (``nbytes`` bytes), until ``unpin()`` or ``free()``.

        Raises:
            UseAfterFreeError: the array was freed.
            RuntimeError: the array is already pinned.
        """
        with self._lock:
            self._check_live("pin")
            if self._pinned is not None:
                raise RuntimeError(f"NvArray#{self.id} is already pinned; unpin() first")
            self._pinned = hostcopy.pinned_pool().allocate(self.nbytes)
            return self._pinned

    def unpin(self) -> None:
        """Give back the pinned staging buffer of ``pin()`` (ordered after the array's stream).

        Raises:
            UseAfterFreeError: the array was freed.
            RuntimeError: the array is not pinned.
        """
        with self._lock:
            self._check_live("unpin")
            if self._pinned is None:
                raise RuntimeError(f"NvArray#{self.id} has no pinned memory; pin() first")
            buf, self._pinned = self._pinned, None
        buf.release(self.stream)

    @property
    def pinned_host(self) -> np.ndarray | None:
        """The pinned staging buffer as uint8, or None when not pinned."""
        return None if self._pinned is None else self._pinned.array

    # -- conversions that would hide a copy or a sharing -----------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(f"NvArray#{self.id} lives in device memory and is not converted to a NumPy array "
                        "implicitly; call to_numpy() for a host copy")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"NvArray#{self.id} cannot be pickled or deep-copied: it is device memory. To share it "
                        "with another process, allocate it from a VmmResource and use ignis.ipc (ipc.export, "
                        "ipc.open); to copy it use clone() on the device or to_numpy() to the host")

    # -- interop (DLPack, CUDA array interface) --------------------------------------------
    # The export module (array/dlpack_export.py, imported with the package) builds on this
    # module's export records; it hands its three functions over when it binds its callbacks.
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        return _exporter()[0](self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _exporter()[1](self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return _exporter()[2](self)


def empty(shape: Any, dtype: Any = _dt.float32, *, device: "Device | int | None" = None,
          stream: Stream | None = None, owner: str = DEFAULT_OWNER,
          mr: DeviceMemoryResource | None = None, tag: str = UNTAGGED) -> NvArray:
    """Allocate an uninitialized array: the ``NvArray`` constructor (see it for the
    arguments and errors), without the call through the class."""
    cdef NvArray a = NvArray.__new__(NvArray)
    a._allocate(shape, dtype, device, stream, owner, mr, tag)
    return a


# The rest of the module, by concern (one compiled module: C calls between the parts):
include "_tracked.pxi"     # the tracked use: begin_use / end_use, TrackedUse, _TrackedAccess
include "_transfers.pxi"   # bytes in and out: memset, fill, device and host copies
include "_dlcapsule.pxi"   # DLPack: what a consumer's deleter and a dead capsule call


cpdef _TrackedAccess access_block(object uses, object stream, object by, object op, bint finish_on_error):
    """``NvArray.access_all(uses, stream, by=by, op=op, finish_on_error=finish_on_error)``, with its
    arguments by position: for compiled callers (a C call), and the one implementation of both."""
    cdef list items = []
    cdef NvArray a
    for use in uses:
        if not isinstance(use, tuple) or len(use) not in (2, 4) or not isinstance(use[0], NvArray):
            raise TypeError(f"access_all: each use is (NvArray, mode) or (NvArray, mode, offset, nbytes), "
                            f"got {use!r:.80}")
        a = <NvArray>use[0]
        mode = use[1]
        if len(use) == 2:
            items.append((a, None if mode is None else _mode(mode), 0, a.nbytes))
        else:
            off, n = a._byte_range(use[2], use[3], op)
            items.append((a, None if mode is None else _mode(mode), off, n))
    if stream is not None:
        s = stream if type(stream) is _Stream else _check_stream(stream)
    elif items:
        s = _stream_for(<NvArray>items[0][0], None)
    else:
        s = _rt_current.current_stream()
    return _tracked_access(items, s, _by(by), op, finish_on_error, False)
