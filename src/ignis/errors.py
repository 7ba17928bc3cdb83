"""The one error hierarchy of Ignis.

Design rules:

- ``IgnisError`` is the base of everything Ignis raises on purpose.
- Each error keeps its facts as attributes (generation, bytes, owners,
  streams, stacks) and builds a message that says what happened and what to
  do about it.
- Built-in bases are kept where their meaning fits: out-of-memory and
  out-of-budget are ``MemoryError``; closed objects are ``RuntimeError``.
- Every error pickles (the facts travel, the message is rebuilt as it was),
  so errors cross process boundaries (multiprocessing, IPC, collectives).
"""

from __future__ import annotations

from typing import Any

from .units import format_bytes

__all__ = [
    "IgnisError",
    "DriverError",
    "UnsupportedError",
    "ClosedError",
    "StaleHandleError",
    "UseAfterFreeError",
    "DoubleFreeError",
    "MemoryContractViolation",
    "ReadOnlyError",
    "OutOfBudgetError",
    "OutOfMemoryError",
    "StreamMisuseError",
    "OutOfBoundsError",
    "RaceError",
    "UninitializedReadError",
    "InvalidTransitionError",
    "SafetensorsError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "ForkedProcessError",
]


def _rebuild(cls: type, message: str, state: dict[str, Any]) -> "IgnisError":
    err = BaseException.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class IgnisError(Exception):
    """Base of every error Ignis raises on purpose.

    Subclasses pass their facts as keyword fields; each becomes an attribute.

    Args:
        message: the full message (``str(error)``; also ``error.message``).
        **fields: facts about the failure; each becomes an attribute of the error.
    """

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.__dict__.update(fields)

    def __reduce__(self) -> tuple:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def __str__(self) -> str:
        return self.message


# Hints for the driver statuses people actually meet; the message of a
# DriverError ends with the hint when there is one.
_DRIVER_HINTS = {
    "CUDA_ERROR_OUT_OF_MEMORY": "free or trim cached memory, or ask for less",
    "CUDA_ERROR_INVALID_VALUE": "an argument (pointer, size or handle) is not valid for this call",
    "CUDA_ERROR_INVALID_HANDLE": "the stream, event or handle was destroyed or never created",
    "CUDA_ERROR_LAUNCH_FAILED": "a kernel faulted; the context is unusable until Device.rebuild()",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel touched memory it does not own; the context must be rebuilt (Device.rebuild())",
    "CUDA_ERROR_NOT_SUPPORTED": "this device or driver does not support the operation",
    "CUDA_ERROR_NO_DEVICE": "no CUDA device is visible; use IGNIS_BACKEND=emulated to run without a GPU",
    "CUDA_ERROR_INVALID_DEVICE": "the device ordinal is out of range",
    "CUDA_ERROR_DEINITIALIZED": "the driver is shutting down",
    "CUDA_ERROR_NOT_READY": "the work has not finished yet",
}


class DriverError(IgnisError):
    """A driver call failed. ``status`` is the numeric CUresult, ``name`` its
    symbolic name and ``call`` the driver function that returned it.

    The message ends with a hint for the statuses people meet most.

    Args:
        status: the numeric status (a ``CUresult``, or NVRTC's for a compile error).
        name: its symbolic name (``"CUDA_ERROR_OUT_OF_MEMORY"``).
        call: the driver function that returned it (``"cuMemAlloc"``).
        detail: more about the failure (an NVRTC log, "injected fault"...).
    """

    def __init__(self, status: int, name: str, call: str, detail: str = "") -> None:
        hint = _DRIVER_HINTS.get(name, "")
        msg = f"{call} failed: {name} ({status})"
        if detail:
            msg += f": {detail}"
        if hint:
            msg += f" [{hint}]"
        super().__init__(msg, status=status, name=name, call=call, detail=detail)


class UnsupportedError(IgnisError, NotImplementedError):
    """The active backend or device cannot do this; the message names which.

    Args:
        what: what was asked for.
        backend: the backend's name (``"cuda"``, ``"emulated"``).
        hint: what to do instead, or ``""``.
    """

    def __init__(self, what: str, backend: str, hint: str = "") -> None:
        msg = f"{what} is not supported by the {backend!r} backend"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg, what=what, backend=backend)


class ClosedError(IgnisError, RuntimeError):
    """An object was used after ``close()`` (streams, events, resources).

    Args:
        what: the object, as it prints.
        hint: what to do instead (default: create a new one).
    """

    def __init__(self, what: str, hint: str = "") -> None:
        msg = f"{what} is closed and cannot be used"
        msg += f"; {hint}" if hint else "; create a new one"
        super().__init__(msg, what=what)


class StaleHandleError(IgnisError):
    """A handle outlived the context or device it was made for.

    ``reason`` is one of "device state dropped", "device shutting down",
    "context rebuilt".

    Args:
        reason: why the handle is stale (one of the three above).
        what: the kind of handle (``"stream"``, ``"GpuRef"``...).
        generation: the context generation the handle was made at, if known.
        current_generation: the device's generation now, if known.
        device_id: the device's ordinal, if known.
        op: what was refused (``"use"``, ``"save"``...), if said.
    """

    def __init__(
        self,
        reason: str,
        *,
        what: str = "handle",
        generation: int | None = None,
        current_generation: int | None = None,
        device_id: int | None = None,
        op: str | None = None,
    ) -> None:
        msg = f"cannot {op} stale {what}: {reason}" if op else f"stale {what}: {reason}"
        if generation is not None and current_generation is not None:
            msg += f" (made at context generation {generation}, device {device_id} is now at {current_generation})"
        if reason == "device shutting down":
            # rebuild() does not undo a shutdown: no advice to rebuild here
            msg += ("; Device.shutdown() was called, so the device accepts no new work for the rest of this "
                    "process (no allocation, stream or use)")
        else:
            msg += "; memory from before a context rebuild is gone: allocate again on the rebuilt device"
        super().__init__(
            msg,
            reason=reason,
            what=what,
            generation=generation,
            current_generation=current_generation,
            device_id=device_id,
            op=op,
        )


class UseAfterFreeError(IgnisError):
    """Memory was used after it was freed (or a stale BlockId was presented).

    Args:
        detail: what was done to what.
        generation: the freed allocation's generation, if known.
        ptr: its device address, if known.
        array_id: the ``NvArray`` id, if an array was used.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, generation: int | None = None, ptr: int | None = None,
                 array_id: int | None = None, **more: Any) -> None:
        msg = f"use after free: {detail}"
        if generation is not None:
            msg += f" (generation {generation})"
        super().__init__(msg, generation=generation, ptr=ptr, array_id=array_id, detail=detail, **more)


class DoubleFreeError(UseAfterFreeError):
    """The same memory was freed twice.

    Args:
        detail: what was freed again.
        generation: the allocation's generation, if known.
        ptr: its device address, if known.
        array_id: the ``NvArray`` id, if an array was freed.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, generation: int | None = None, ptr: int | None = None,
                 array_id: int | None = None, **more: Any) -> None:
        super().__init__(detail, generation=generation, ptr=ptr, array_id=array_id, **more)
        self.message = self.message.replace("use after free:", "double free:", 1)
        self.args = (self.message,)


class MemoryContractViolation(IgnisError):
    """An ownership rule was broken: wrong owner, double acquire, free while shared.

    Args:
        detail: what was refused and why.
        array_id: the ``NvArray`` id.
        owner: the array's owner at the time.
        caller: the owner name that asked.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, array_id: int | None = None, owner: str | None = None,
                 caller: str | None = None, **more: Any) -> None:
        super().__init__(f"memory contract violation: {detail}", array_id=array_id, owner=owner,
                         caller=caller, detail=detail, **more)


class ReadOnlyError(MemoryContractViolation, ValueError):
    """A write to memory whose producer marked it read-only (a read-only DLPack import, a
    non-writeable NumPy array, ``bytes``, a read-only mapping). Reads are allowed.

    Args:
        detail: what was refused and what to do instead (a writable copy: ``clone()``).
        array_id: the ``NvArray`` id.
        owner: the array's owner.
        caller: the owner name that asked, if any.
        **more: further facts, each an attribute.
    """


def _fmt_bytes(n: int | None) -> str:
    return "?" if n is None else format_bytes(n, 2)


class OutOfBudgetError(IgnisError, MemoryError):
    """A budget adaptor refused an allocation (deterministically).

    Args:
        requested: the bytes asked for.
        remaining: the bytes left in the budget.
        limit: the budget, in bytes, if known.
    """

    def __init__(self, requested: int, remaining: int, limit: int | None = None) -> None:
        msg = (f"out of budget: requested {requested} bytes ({_fmt_bytes(requested)}), "
               f"remaining {remaining} bytes ({_fmt_bytes(remaining)})")
        if limit is not None:
            msg += f" of a {limit}-byte limit"
        msg += "; free arrays you no longer need or raise the budget"
        super().__init__(msg, requested=requested, remaining=remaining, limit=limit)


class OutOfMemoryError(IgnisError, MemoryError):
    """The device (or its driver) could not satisfy an allocation.

    Args:
        requested: the bytes asked for.
        device: the device's ordinal.
        device_total: the device's total memory in bytes, if known.
        device_free: the device's free memory in bytes (the driver's view), if known.
        live_bytes: bytes the resource has handed out, if known.
        cached_bytes: bytes the resource holds but has not handed out, if known.
        largest_free_block: the largest cached free block in bytes, if known.
        detail: the driver's words, if any.
    """

    def __init__(self, requested: int, *, device: int = 0, device_total: int | None = None,
                 device_free: int | None = None, live_bytes: int | None = None,
                 cached_bytes: int | None = None, largest_free_block: int | None = None,
                 detail: str = "") -> None:
        msg = (f"out of memory on device {device}: asked for {_fmt_bytes(requested)} ({requested} bytes); "
               f"device total {_fmt_bytes(device_total)}, free {_fmt_bytes(device_free)}; "
               f"Ignis holds {_fmt_bytes(live_bytes)} live and {_fmt_bytes(cached_bytes)} cached "
               f"(largest free cached block {_fmt_bytes(largest_free_block)})")
        if detail:
            msg += f"; {detail}"
        msg += ("; try: free arrays you no longer need, resource.trim() to return cached memory, "
                "a smaller batch, or a BudgetResource to find who allocates")
        super().__init__(msg, requested=requested, device=device, device_total=device_total,
                         device_free=device_free, live_bytes=live_bytes, cached_bytes=cached_bytes,
                         largest_free_block=largest_free_block)


class StreamMisuseError(IgnisError):
    """The stream-ordered contract was violated, or cross-stream tracking was
    asked of a resource that cannot do it.

    Args:
        detail: what was refused and what to do instead.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, **more: Any) -> None:
        super().__init__(f"stream misuse: {detail}", detail=detail, **more)


class OutOfBoundsError(IgnisError):
    """Bytes outside a block were written (guard canaries) or would be accessed.

    Args:
        detail: what was found or refused.
        generation: the block's generation, if known.
        ptr: the block's (or array's) device address, if known.
        tag: the allocation's tag, if known.
        side: ``"before"`` or ``"after"`` the block.
        offset: where, in bytes relative to the block.
        stack: where the block was allocated, formatted, if captured.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, generation: int | None = None, ptr: int | None = None,
                 tag: str | None = None, side: str | None = None, offset: int | None = None,
                 stack: str | None = None, **more: Any) -> None:
        msg = f"out of bounds: {detail}"
        if stack:
            msg += f"\nallocated at:\n{stack}"
        super().__init__(msg, generation=generation, ptr=ptr, tag=tag, side=side, offset=offset,
                         stack=stack, detail=detail, **more)


class RaceError(IgnisError):
    """Two accesses to the same bytes on unordered streams (or a use racing a free).

    Args:
        detail: the two accesses and why they race.
        first: the earlier access (the sanitizer's record of it).
        second: the later access.
        kind: the message's first words (default ``"race"``).
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, first: Any = None, second: Any = None, kind: str = "race",
                 **more: Any) -> None:
        msg = f"{kind}: {detail}"
        super().__init__(msg, first=first, second=second, kind=kind, detail=detail, **more)


class UninitializedReadError(IgnisError):
    """A read of bytes that nothing wrote since they were allocated (the sanitizer).
    ``first`` describes the allocation, ``second`` the read.

    Args:
        detail: what was read.
        first: the allocation.
        second: the read.
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, first: Any = None, second: Any = None, **more: Any) -> None:
        super().__init__(f"uninitialized read: {detail}", first=first, second=second,
                         kind="uninitialized read", detail=detail, **more)


class InvalidTransitionError(IgnisError, RuntimeError):
    """A lifecycle state change that the transition table does not allow.

    Args:
        what: the object (a block, with its address, generation and tag).
        state: its state's name.
        attempted: the state it was asked to move to.
    """

    def __init__(self, what: str, state: str, attempted: str) -> None:
        super().__init__(f"{what}: cannot go from {state} to {attempted}", what=what, state=state,
                         attempted=attempted)


class SafetensorsError(IgnisError, ValueError):
    """A safetensors file is malformed. ``file``, ``tensor`` (or None) and ``problem`` say where and what.

    Args:
        file: the file's name.
        problem: what is wrong.
        tensor: the tensor's name, or None for the file as a whole.
    """

    def __init__(self, file: str, problem: str, tensor: str | None = None) -> None:
        where = f"{file}: " + (f"tensor {tensor!r}: " if tensor is not None else "")
        super().__init__(f"invalid safetensors file {where}{problem}", file=file, tensor=tensor,
                         problem=problem)


class CollectiveError(IgnisError, RuntimeError):
    """A collective or point-to-point operation failed: a peer died or closed its
    communicator, a peer did not answer in time, ranks called different
    operations, or NCCL reported an error. It names the rank that failed
    (``rank``, when known), the operation (``op``) and the rank that raised it
    (``this_rank``). ``kind`` is one of "peer_died", "peer_closed", "timeout",
    "mismatch", "nccl", "init", "closed", "stream" (the communicator's stream
    failed), "aborted", "failed_earlier" (an access to an array that a failed
    operation was to write; ``cause_kind`` and ``__cause__`` say what failed).

    Args:
        detail: what happened.
        op: the operation, if known.
        rank: the rank that failed, if known.
        this_rank: the rank raising the error, if known.
        kind: one of the kinds above (default ``"error"``).
        **more: further facts, each an attribute.
    """

    def __init__(self, detail: str, *, op: str | None = None, rank: int | None = None,
                 this_rank: int | None = None, kind: str = "error", **more: Any) -> None:
        where = f"rank {this_rank}" if this_rank is not None else "this rank"
        head = f"collective {op} failed on {where}" if op else f"collective failure on {where}"
        super().__init__(f"{head}: {detail}", detail=detail, op=op, rank=rank, this_rank=this_rank,
                         kind=kind, **more)


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A peer did not take part in an operation within the communicator's time-out.

    Args:
        detail: what happened.
        op: the operation, if known.
        rank: the rank that did not answer, if known.
        this_rank: the rank raising the error, if known.
        kind: ``"timeout"``, or ``"init"`` when a rank never joined.
        **more: further facts, each an attribute.
    """

    def __reduce__(self) -> tuple:
        # TimeoutError is an OSError, whose instances must be made by OSError.__new__.
        return (_rebuild_timeout, (self.message, dict(self.__dict__)))


def _rebuild_timeout(message: str, state: dict[str, Any]) -> CollectiveTimeoutError:
    err = OSError.__new__(CollectiveTimeoutError, message)
    err.__dict__.update(state)
    return err


class ForkedProcessError(IgnisError, RuntimeError):
    """Ignis was used in a child process made by ``fork()`` after the parent had
    used the device: the child has none of the parent's device state (the
    emulator's stream threads, the CUDA driver's context), so nothing it
    inherited can work. Start such children with the ``spawn`` (or
    ``forkserver``) start method instead. ``backend``, ``parent_pid`` and
    ``pid`` say which backend, which parent and which child.

    Args:
        what: what was attempted.
        backend: the backend's name.
        parent_pid: the parent process's pid.
        pid: this process's pid.
    """

    def __init__(self, what: str, *, backend: str, parent_pid: int, pid: int) -> None:
        super().__init__(
            f"cannot {what} in a process made by fork(): this process (pid {pid}) is a fork of pid "
            f"{parent_pid}, which had already used the {backend!r} backend, and a forked child has none "
            "of its device state (Ignis cannot re-initialize the device in a forked subprocess). Start "
            "processes that use Ignis with the 'spawn' or 'forkserver' start method: "
            "multiprocessing.get_context('spawn').Process(...) or multiprocessing.set_start_method('spawn') "
            "(for a pool: multiprocessing.get_context('spawn').Pool(...)), or fork before the parent first "
            "uses Ignis",
            what=what, backend=backend, parent_pid=parent_pid, pid=pid)
