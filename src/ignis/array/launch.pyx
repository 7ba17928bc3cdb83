"""``launch``: queue a Kernel with tracked access to its array arguments.

Preflight first (nothing is queued if any check fails): argument count and
kinds, arrays alive and on one device, every array in a resource that can
track cross-stream use (seeds/004's preflight), declared byte ranges inside
their arrays. Then ``prepare_block_use`` for each array (waits under ``auto``
ordering, sanitizer checks on the declared ranges), the launch, and
``finish_block_use``.

Compiled: the preflight runs here without Python frames, each tracked use is
the array's own (``begin_use`` / ``end_use`` of ``ignis/array/nvarray.pyx``, in its
``_tracked.pxi``, called as C); the launch itself is ``Kernel``'s
(``ignis.runtime.kernel``: the packed parameters, straight to the driver on
the cuda backend's common case). The emulated backend runs ``host_impl``
through its ``kernel_launch``, as before.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import OutOfBoundsError, StreamMisuseError, UnsupportedError
from ..runtime import current as _rt_current
from ..runtime.kernel import RawPtr
from .nvarray import NvArray

from ignis.array.nvarray cimport begin_use, end_use
from ignis.runtime.kernel cimport Kernel
from ignis.runtime.stream cimport Stream

__all__ = ["launch"]

# Read on every launch: the override count of ``with stream:`` / ``set_device`` (a list
# mutated in place), the array class.
cdef list _OVERRIDES = _rt_current.overrides
cdef object _NvArray = NvArray


def _dim3(x: Any, what: str) -> tuple[int, int, int]:
    if type(x) is int and x > 0:
        return (x, 1, 1)
    t = (x,) if isinstance(x, int) else tuple(x)
    if not 1 <= len(t) <= 3 or not all(isinstance(v, int) and v > 0 for v in t):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, got {x!r}")
    return (t + (1, 1))[:3]


def _preflight_error(kernel: Kernel, i: int, arg: Any, spec: Any, device: Any) -> Exception:
    """The clear error for an array argument that fails the preflight (slow path)."""
    if not isinstance(arg, NvArray):
        return TypeError(f"kernel {kernel.name} argument {i} is declared {spec.name} (an array), "
                         f"got {type(arg).__name__}")
    arg._check_live(f"pass to kernel {kernel.name}")
    if device is not None and arg.device is not device:
        return ValueError(f"kernel {kernel.name}: arrays on devices {device.ordinal} and {arg.device.ordinal}")
    return StreamMisuseError(
        f"kernel {kernel.name} refused before launch: argument {i} (NvArray#{arg.id}) lives in a "
        f"{type(arg._mr).__name__}, which cannot track cross-stream uses; allocate it from a "
        "PoolResource or AsyncResource")


def launch(kernel: Kernel, grid: Any, block: Any, *args: Any, stream: Stream | None = None,
           shared_mem: int = 0) -> None:
    """Queue ``kernel`` on ``stream`` with tracked access to every array argument.

    Everything is checked before anything is queued (the preflight): the kernel,
    the argument count, ``grid`` and ``block``, and each array argument against its
    declaration in ``kernel``'s ``access``: an ``NvArray``, live (not freed, nor its
    base; writable if the access writes), on the same device as the other arrays,
    in a memory resource that can track cross-stream uses, and a declared byte range
    inside the array. A launch that fails the preflight raises and queues nothing.

    Then, for each array argument, the use is begun on the launch stream: under
    ``auto`` ordering the event waits its access needs are queued there (a READ
    waits for the last write from another stream; a WRITE or READ_WRITE also waits
    for every read from another stream), and the sanitizer, when on, checks the
    declared byte range. The kernel is queued (compiled first on a GPU, at its
    first launch on the device), and each use is recorded, also when queuing
    failed. A use on the array's own stream with nothing pending elsewhere costs
    no driver call. Under ``manual`` ordering no waits are queued: the program's
    own events must order the streams (run it under the sanitizer to check).

    Arrays over foreign memory (``ig.from_dlpack``) and empty arrays have no block
    to track: they are passed through, and ordering them is the caller's job.
    Scalars are passed as their declared C type (on a GPU) or NumPy type (to
    ``host_impl``); a value that does not convert raises when the kernel is queued.

    Args:
        kernel: the ``ig.Kernel``.
        grid: the number of blocks: a positive int, or 1 to 3 positive ints (x, y, z).
        block: the threads per block, the same way.
        *args: the kernel's arguments, one per ``access`` declaration: ``NvArray`` for
            an array argument (its device address is passed), a Python or NumPy number
            for a scalar.
        stream: the ``Stream`` to queue on. None: the stream that a ``with stream:``
            block of this thread made current on the arrays' device, else the first
            array argument's own stream, else (no array argument) the current device's default
            stream.
        shared_mem: dynamic shared memory per block, in bytes (ignored by the emulator).

    Raises:
        TypeError: ``kernel`` is not a Kernel, the argument count differs from the
            declarations, an array argument is not an ``NvArray``, ``stream`` is not a
            ``Stream``, or (when the kernel is queued) a scalar its C type does not take
            (ctypes' message, see ``Kernel.pack``).
        ValueError: a bad ``grid`` or ``block``; arrays on different devices; a
            ``stream`` on another device than the arrays.
        UseAfterFreeError: an array argument (or its base) was freed.
        ReadOnlyError: an access that writes to read-only memory.
        CollectiveError: an array that a failed collective was to write.
        StreamMisuseError: an array in a resource that cannot track cross-stream uses
            (a ``DirectResource``, for one); allocate it from a ``PoolResource`` or
            ``AsyncResource``.
        OutOfBoundsError: a declared byte range outside its array.
        ClosedError: the stream was closed.
        StaleHandleError: the stream predates a context rebuild, or the device is
            shutting down.
        UnsupportedError: the kernel has no ``host_impl`` (emulated backend) or no
            ``source`` (cuda backend).
        DriverError: compilation failed (with NVRTC's log) or the driver refused the
            launch.

    Example::

        k = ig.kernels.kernel("copy", 4)      # the built-in copy: (dst WRITE, src READ, n int64)
        a, b = ig.ones(1024), ig.empty(1024)
        s = ig.Device(0).create_stream()
        ig.launch(k, 4, 256, b, a, 1024, stream=s)   # on s: waits for a's fill on its own stream
    """
    cdef Kernel k
    cdef Stream s
    cdef tuple plan, ent
    cdef list ranges = None
    cdef list pending = None
    cdef Py_ssize_t i, j, nplan
    if not isinstance(kernel, Kernel):
        raise TypeError(f"launch expects an ignis.Kernel, got {type(kernel).__name__}")
    k = <Kernel>kernel
    if len(args) != k.nargs:
        raise TypeError(f"kernel {k.name} declares {len(k.specs)} argument(s), got {len(args)}")
    g = (grid, 1, 1) if type(grid) is int and grid > 0 else _dim3(grid, "grid")
    b = (block, 1, 1) if type(block) is int and block > 0 else _dim3(block, "block")
    plan = k.plan
    nplan = len(plan)
    device = None
    for j in range(nplan):
        ent = <tuple>plan[j]
        i = ent[0]
        arg = args[i]
        if type(arg) is not _NvArray or arg._freed or (arg._block is not None and not arg._tracks) \
                or (device is not None and arg.device is not device):
            raise _preflight_error(k, i, arg, ent[1], device)
        if arg._base is not None or arg._gate is not None:
            arg._check_live(f"pass to kernel {k.name}", ent[1])
        device = arg.device
        rng = ent[2]
        if rng is None:
            continue
        lo, hi = rng(*args)
        if lo < 0 or hi > arg.nbytes or hi < lo:
            raise OutOfBoundsError(
                f"kernel {k.name} argument {i} declares bytes [{lo}, {hi}) of NvArray#{arg.id}, which "
                f"has {arg.nbytes} bytes", ptr=arg.device_ptr, generation=arg.generation, tag=arg.tag,
                side="before" if lo < 0 else "after", offset=lo if lo < 0 else hi)
        if ranges is None:
            ranges = [None] * nplan
        ranges[j] = (lo, hi - lo)
    if device is None:
        device = _rt_current.current_device()
    if stream is None:  # this thread's ``with stream:`` on the device, else the first array's stream
        stream = _rt_current.stream_override(device) if _OVERRIDES[0] else None
        if stream is None:
            stream = args[(<tuple>plan[0])[0]].stream if nplan else device.default_stream
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis.Stream (device.create_stream(), device.default_stream), "
                        f"got {type(stream).__name__}")
    s = <Stream>stream
    if s.device is not device:
        raise ValueError(f"kernel {k.name}: stream is on device {s.device.ordinal}, arrays on {device.ordinal}")
    state = device.state
    if s._closed or s._generation != state.generation or not state.accepting_ops:
        s._check()  # raises: a closed or stale stream's handle must not reach the driver
    backend = device.backend
    # Each array's tracked use (ignis/array/_tracked.pxi, of nvarray.pyx): a use clean on ``s`` costs
    # nothing while the sanitizer is off, the common same-stream launch.
    try:
        for j in range(nplan):
            ent = <tuple>plan[j]
            if ranges is not None and ranges[j] is not None:
                lo, nb = ranges[j]
            else:
                lo, nb = 0, -1
            begin_use(args[ent[0]], s, ent[1], k.name, lo, nb)
            if pending is None:
                pending = []
            pending.append(ent)
        if backend.host_kernels:
            backend.kernel_launch(_host_call(k, backend, args), g, b, shared_mem, s.handle, ())
        else:
            k._queue(device, s, g, b, shared_mem, args)
    finally:
        if pending is not None:
            for ent in pending:
                end_use(args[ent[0]], s, ent[1])


def _host_call(kernel: Kernel, backend: Any, args: Sequence[Any]) -> Callable[[], None]:
    if kernel.host_impl is None:
        raise UnsupportedError(f"kernel {kernel.name!r} without host_impl", backend.name,
                               "give the Kernel a host_impl= to run it without a GPU")
    conv: list[Any] = []
    for (what, spec, _), arg in zip(kernel.specs, args):
        if what == "array":
            buf, off = backend.allocation_view(arg._ptr)
            conv.append(RawPtr(buf, off, arg.dtype.numpy))
        else:
            conv.append(spec.numpy.type(arg))
    impl = kernel.host_impl

    def run() -> None:
        impl(*conv)

    run.__qualname__ = f"kernel {kernel.name}"
    return run
