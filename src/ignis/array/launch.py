"""``launch``: queue a Kernel with tracked access to its array arguments.

Preflight first (nothing is queued if any check fails): argument count and
kinds, arrays alive and on one device, every array in a resource that can
track cross-stream use (seeds/004's preflight), declared byte ranges inside
their arrays. Then ``prepare_block_use`` for each array (waits under ``auto``
ordering, sanitizer checks on the declared ranges), the launch, and
``finish_block_use``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import OutOfBoundsError, StreamMisuseError, UnsupportedError
from ..memory import ordering as _ord
from ..runtime import Stream
from ..runtime import current as _rt_current
from ..runtime.kernel import Kernel, RawPtr
from .nvarray import NvArray

__all__ = ["launch"]


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
            declarations, or an array argument is not an ``NvArray``.
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
    if type(kernel) is not Kernel and not isinstance(kernel, Kernel):
        raise TypeError(f"launch expects an ignis.Kernel, got {type(kernel).__name__}")
    if len(args) != kernel.nargs:
        raise TypeError(f"kernel {kernel.name} declares {len(kernel.specs)} argument(s), got {len(args)}")
    g = (grid, 1, 1) if type(grid) is int and grid > 0 else _dim3(grid, "grid")
    b = (block, 1, 1) if type(block) is int and block > 0 else _dim3(block, "block")
    uses: list[tuple[NvArray, Any, int, int]] = []
    device = None
    for i, acc, rng in kernel.plan:
        arg = args[i]
        if type(arg) is not NvArray or arg._freed or (arg._block is not None and not arg._tracks) \
                or (device is not None and arg.device is not device):
            raise _preflight_error(kernel, i, arg, acc, device)
        if arg._base is not None or arg._gate is not None:
            arg._check_live(f"pass to kernel {kernel.name}", acc)
        device = arg.device
        if rng is None:
            uses.append((arg, acc, 0, arg.nbytes))
            continue
        lo, hi = rng(*args)
        if lo < 0 or hi > arg.nbytes or hi < lo:
            raise OutOfBoundsError(
                f"kernel {kernel.name} argument {i} declares bytes [{lo}, {hi}) of NvArray#{arg.id}, which "
                f"has {arg.nbytes} bytes", ptr=arg.device_ptr, generation=arg.generation, tag=arg.tag,
                side="before" if lo < 0 else "after", offset=lo if lo < 0 else hi)
        uses.append((arg, acc, lo, hi - lo))
    if device is None:
        device = _rt_current.current_device()
    if stream is not None:
        s = stream
    else:  # this thread's ``with stream:`` on the device, else the first array's stream
        s = _rt_current.stream_override(device) if _rt_current.overrides[0] else None
        if s is None:
            s = uses[0][0].stream if uses else device.default_stream
    if s.device is not device:
        raise ValueError(f"kernel {kernel.name}: stream is on device {s.device.ordinal}, arrays on {device.ordinal}")
    state = device.state
    if s._closed or s._generation != state.generation or not state.accepting_ops:
        s._check()  # raises: a closed or stale stream's handle must not reach the driver
    backend = device.backend
    # A use of a block that is clean on ``s`` (ignis.memory.resource, "Clean") needs no
    # prepare / finish while the sanitizer is off: the common same-stream launch.
    fast = _ord.checker is None
    pending: list | None = None  # uses begun that must be finished
    try:
        for arr, acc, lo, nb in uses:
            bl = arr._block
            if bl is None or not (fast and bl._ws is s and not bl._we and bl._rd is None):
                arr._begin(s, acc, kernel.name, lo, nb)
                if pending is None:
                    pending = []
                pending.append((arr, acc))
        if backend.host_kernels:
            backend.kernel_launch(_host_call(kernel, backend, args), g, b, shared_mem, s.handle, ())
        else:
            last = kernel._last
            fn = last[2] if last is not None and last[0] is device and last[1] == state.generation \
                else kernel._function(device)
            backend.kernel_launch(fn, g, b, shared_mem, s.handle, kernel.marshal(*args))
    finally:
        if pending is not None:
            for arr, acc in pending:
                arr._end(s, acc)


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
