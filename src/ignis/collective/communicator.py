"""Communicator: collectives on NvArrays with enforced ownership.

Design and rules:
- Every operation validates its arrays first (NvArray, live, on the
  communicator's device, contiguous, matching dtypes and sizes, a dtype NCCL
  can reduce), so a mistake is a ``TypeError`` / ``ValueError`` on the rank
  that made it instead of a hang or wrong bytes on all of them.
- Ownership (seeds/000: the collective layer acquires arrays before operating
  and releases them when done): each operation acquires its arrays for
  ``"collective"`` (``MemoryContractViolation`` if another layer holds one,
  or it is shared), queues the waits their last uses need on the
  communicator's stream, enqueues the operation there, records the use and
  releases them (one ``NvArray.access_all`` block). So the arrays are free again as soon
  as the work is *ordered*, without waiting for it: a later reader on any
  stream waits for the collective on the device, not on the host, and a free
  is deferred behind it. Inside ``with comm.group():`` arrays stay acquired
  (owner ``"collective"``) until the group is issued at the end of the block.
- Operations run on the communicator's own stream, in call order; all ranks
  must call the same collectives in the same order (as with NCCL). A group
  may mix collectives with send/recv; send/recv pairs that would wait on each
  other must be in one group.
- Failures: the first failure (a peer died, closed, hung or called another
  operation, an NCCL error, the stream failed) is kept in ``Health``; the
  engine aborts, and every later operation, ``synchronize()`` and
  ``barrier()`` raise ``CollectiveError``. ``close()`` never raises for a
  failed communicator. Only the communicator fails: the device, its streams
  and every array the failed calls were not to write go on (an aborted NCCL
  call ends, as a call of the emulator's transport does, without failing its
  stream).
- Stale data: an operation returns once it is queued, so it can fail after
  it returned. Each engine keeps the arrays that its queued operations are to
  write (weak references to their roots, until it knows the operations
  finished); when the communicator fails, every one of them is poisoned
  (``NvArray.mark_failed``) *before* the failure is published and before the
  engine aborts or lets its stream go on. From then on every access to such an
  array or a view of it (host copy, clone, fill, kernel launch, ``use()``,
  DLPack export, the next collective) raises a ``CollectiveError`` that names
  the operation that was to write it, this rank, the failed rank and the
  cause; ``free()`` stays allowed. Arrays an operation only reads are left
  alone. A call that raises at once (the communicator had already failed,
  bad arguments) issued nothing and poisons nothing: its arrays are as they
  were. An access queued *before* the failure was known cannot be stopped:
  it runs once the failed call has ended and sees the bytes as they are, on
  both backends. A host read of a target itself (``to_numpy``) checks again
  after its wait and raises; a device copy of it queued that early copies the
  stale bytes into an array nothing poisons.
- One thread at a time per communicator.
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

try:  # compiled, Cython's (its class directives below); as plain Python, what of it import needs
    import cython
except ImportError:
    from .._cython_shim import cython

from .. import dtypes as _dt
from ..array import NvArray
from ..array.nvarray import access_block
from ..errors import DriverError, MemoryContractViolation
from .._types import Access
from .errors import CollectiveError
from .ops import _BY_NAME as _OPS
from .ops import FP8, Plan, ReduceOp, movement_plan, reduction_plan

if TYPE_CHECKING:
    from ..runtime import Device, Stream

__all__ = ["Communicator", "Health"]

OWNER = "collective"
_SETTLE_WAIT = 10.0  # how long a caller waits for a claimed failure's first hooks (the abort waits 5 s at most)
# NvArray views are contiguous by construction; arrays that carry strides (subclasses, a
# future strided NvArray) are checked.
_READ, _WRITE, _RW = Access.READ, Access.WRITE, Access.READ_WRITE
_ref = weakref.ref


class Health:
    """The first failure of one communicator, shared by its engine, watchdog and rendezvous.

    ``oldest`` (set by the engine) returns the label of the oldest operation
    not finished yet, so a death reported from outside names it.

    ``fail(err)`` for the first failure: sets ``claimed`` (at once, under the
    lock), runs the ``first`` hooks (the engine poisons the arrays its queued
    operations were to write; NCCL's then aborts), then publishes ``error`` and
    runs the other hooks (wake waiters). So whoever sees ``error`` also sees the
    poison and the abort. The communicator's own checks read ``claimed``: a failure
    counts from the moment it is claimed (a call made while the hooks run is refused,
    and a ``synchronize()`` that the abort lets finish still raises)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.error: CollectiveError | None = None
        self.claimed: CollectiveError | None = None
        self.oldest: Callable[[], str | None] = lambda: None
        self._first: list[Callable[[CollectiveError], None]] = []
        self._hooks: list[Callable[[CollectiveError], None]] = []
        self._lock = threading.Lock()
        self._published = threading.Event()
        self._told = False  # the program has been raised the failure itself (``report``)

    def add_hook(self, fn: Callable[[CollectiveError], None], *, first: bool = False) -> None:
        """Call ``fn(error)`` once, on the first failure (``first``: before it is published)."""
        (self._first if first else self._hooks).append(fn)

    def fail(self, err: CollectiveError) -> bool:
        """Record ``err`` if it is the first failure; returns whether it was. A first
        failure that named no operation takes the operation of a later report."""
        with self._lock:
            first = self.claimed
            if first is not None:
                if first.op is None and err.op is not None:
                    better = type(first)(first.detail, op=err.op, rank=first.rank, this_rank=first.this_rank,
                                         kind=first.kind)
                    better.__cause__ = first.__cause__
                    self.claimed = better
                    if self.error is first:
                        self.error = better
                return False
            self.claimed = err
        for fn in list(self._first):
            try:
                fn(err)
            except Exception:
                pass
        with self._lock:
            self.error = self.claimed
        self._published.set()
        for fn in list(self._hooks):
            try:
                fn(err)
            except Exception:
                pass
        return True

    def peer_died(self, rank: int, why: str) -> None:
        """Fail the communicator because rank ``rank`` died (``kind="peer_died"``), naming the
        oldest unfinished operation.

        Args:
            rank: the rank that died (negative if not known).
            why: what was seen.
        """
        self.fail(CollectiveError(why, op=self.oldest(), rank=rank if rank >= 0 else None, this_rank=self.rank,
                                  kind="peer_died"))

    def report(self, op: str | None = None) -> CollectiveError:
        """The error a call of the program (``op``) raises after the failure. The first time, it
        has the failure's own kind and the rank it names, wherever the failure was found (the
        call matcher, the watchdog, a gate, a peer's goodbye): a program learns what went wrong
        from the first error it sees. Afterwards, ``again(op)`` (kind ``"failed_earlier"`` for
        another operation)."""
        e = self.again()
        with self._lock:
            told, self._told = self._told, True
        if told or op is None or e.op is None or e.op == op:
            return self.again(op)  # (a failure that named no operation is raised naming ``op``)
        first = type(e)(f"the communicator failed earlier, in {e.op}, and cannot be used: {e.detail}", op=op,
                        rank=e.rank, this_rank=self.rank, kind=e.kind)
        first.__cause__ = e.__cause__
        return first

    def told(self) -> None:
        """The program was raised the failure itself (by the call that found it)."""
        with self._lock:
            self._told = True

    def again(self, op: str | None = None) -> CollectiveError:
        """The error to raise for ``op`` (default: the failed operation itself) after the failure;
        a failure still being claimed (its first hooks running on another thread: the poison, the
        abort) is waited for first, a bounded while."""
        if self.error is None:
            self._published.wait(_SETTLE_WAIT)
        e = self.error or self.claimed
        assert e is not None
        if op is None or e.op is None or e.op == op:
            again = type(e)(e.detail, op=op or e.op, rank=e.rank, this_rank=self.rank, kind=e.kind)
            again.__cause__ = e.__cause__
            return again
        return CollectiveError(f"the communicator failed earlier, in {e.op}, and cannot be used: {e.detail}",
                               op=op, rank=e.rank, this_rank=self.rank, kind="failed_earlier")


class _Poison:
    """``make_error`` for ``NvArray.mark_failed``: a new ``CollectiveError`` per access, naming
    the operation that was to write the array, this rank, the failed rank and the cause."""

    __slots__ = ("label", "cause", "this_rank")

    def __init__(self, label: str, cause: CollectiveError, this_rank: int) -> None:
        self.label = label
        self.cause = cause
        self.this_rank = this_rank

    def __call__(self, array: NvArray, what: str) -> CollectiveError:
        c = self.cause
        why = c.detail if c.rank is None or f"rank {c.rank}" in c.detail else f"rank {c.rank}: {c.detail}"
        if c.op is None or c.op == self.label:
            how = f"failed ({why})"
        else:
            how = f"did not finish: the communicator failed in {c.op} ({why})"
        err = CollectiveError(
            f"cannot {what} NvArray#{array.id}: {self.label} was to write it and {how}, so its bytes are stale or "
            "partial. Free it, and recompute it or receive it again on a new communicator",
            op=self.label, rank=c.rank, this_rank=self.this_rank, kind="failed_earlier", cause_kind=c.kind,
            array_id=array.id)
        err.__cause__ = c
        return err


def poison(targets: "tuple | list", cause: CollectiveError, this_rank: int) -> None:
    """Poison the arrays of ``targets`` (``(weakref to a root array, _Op)`` pairs) that still live."""
    for ref, op in targets:
        a = ref()
        if a is not None:
            a.mark_failed(_Poison(op.label, cause, this_rank))


def _target(a: NvArray, op: "_Op") -> tuple:
    """What an engine keeps of an array that ``op`` writes: a weak reference to its root
    (a view dropped meanwhile must not unpoison its parent), and the operation."""
    return (_ref(a.root), op)


# Out of the cyclic collector, one made per call (communicator.pxd says why; Cython takes the
# directive only here, on the class, not in the .pxd).
@cython.no_gc
@cython.cclass
class _Op:
    """One operation as the engines see it (pointers and counts, no arrays).

    ``count`` is in the engine's units (NCCL elements: bytes for data movement,
    float32 pairs for complex64); ``header()`` speaks in the caller's elements.
    ``seq`` numbers collectives per communicator, and send/recv per peer."""

    __slots__ = ("name", "seq", "send_ptr", "send_bytes", "recv_ptr", "recv_bytes", "count", "plan", "op",
                 "red", "root", "dtype")

    def __init__(self, name: str, seq: int, send: NvArray | None, recv: NvArray | None, count: int,
                 plan: Plan, op: ReduceOp | None, root: int, dtype: str) -> None:
        self.name = name
        self.seq = seq
        if send is not None:
            self.send_ptr = send.device_ptr
            self.send_bytes = send.nbytes
        else:
            self.send_ptr = self.send_bytes = 0
        if recv is send and send is not None:  # in place
            self.recv_ptr = self.send_ptr
            self.recv_bytes = self.send_bytes
        elif recv is not None:
            self.recv_ptr = recv.device_ptr
            self.recv_bytes = recv.nbytes
        else:
            self.recv_ptr = self.send_ptr
            self.recv_bytes = 0
        self.count = count
        self.plan = plan
        self.op = op
        self.red = -1 if op is None else op.code  # NCCL's ncclRedOp_t
        self.root = root
        self.dtype = dtype

    @property
    def label(self) -> str:
        """How errors name this call: "all_reduce #12", "send #3 to rank 1"."""
        if self.name == "send":
            return f"send #{self.seq + 1} to rank {self.root}"
        if self.name == "recv":
            return f"recv #{self.seq + 1} from rank {self.root}"
        return f"{self.name} #{self.seq}"

    def header(self) -> dict[str, Any]:
        p2p = self.name in ("send", "recv")
        return {"op": "send/recv" if p2p else self.name, "dtype": self.dtype,
                "count": self.count // self.plan.per_element,
                "root": -1 if p2p else self.root, "red": self.op.name.lower() if self.op else None}


class _Group:
    __slots__ = ("ops", "held", "roots", "stream", "holds")

    def __init__(self, stream: "Stream") -> None:
        self.ops: list[_Op] = []
        self.held: dict[int, list] = {}  # id(array) -> [array, Access, the first _Op that writes it]
        self.roots: set[int] = set()  # ids of the roots acquired (a view is held through its root)
        self.stream = stream
        # The group's holds: each root acquired for "collective" (an access that holds and makes
        # no use: the uses are made when the group is issued) until release().
        self.holds = ExitStack()

    def add(self, a: NvArray, acc: Access, op: "_Op") -> None:
        """Acquire ``a`` for the group, once; an array used twice gets the union of the accesses."""
        entry = self.held.get(id(a))
        if entry is None:
            root = a.root
            if id(root) not in self.roots:
                self.holds.enter_context(NvArray.access_all([(a, None)], self.stream, by=OWNER, op=op.name))
                self.roots.add(id(root))
            self.held[id(a)] = [a, acc, None if acc is _READ else op]
        else:
            entry[1] = _merge(entry[1], acc)
            if entry[2] is None and acc is not _READ:
                entry[2] = op

    def release(self) -> None:
        """Give every array the group holds back (never raises for one no longer held)."""
        try:
            self.holds.close()
        except MemoryContractViolation:
            pass


def _merge(a: Access, b: Access) -> Access:
    if a is b:
        return a
    return _RW


class Communicator:
    """A group of ranks (one process per device) that run collectives on NvArrays.

    Made by ``ig.collective.init_process_group()``; not constructed directly.
    ``rank`` / ``world_size`` / ``device`` / ``stream`` / ``backend`` say what it is."""

    def __init__(self, engine: Any, *, rank: int, world_size: int, device: "Device", stream: "Stream",
                 timeout: float, health: Health, rendezvous: Any = None, owns_stream: bool = True) -> None:
        self._engine = engine
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.stream = stream
        self.timeout = timeout
        self._health = health
        self._rdzv = rendezvous
        self._owns_stream = owns_stream
        self._group: _Group | None = None
        self._seq = 0
        self._p2p_sent = [0] * world_size
        self._p2p_recvd = [0] * world_size
        self._closed = False
        self._on_close: list[Callable[[Communicator], None]] = []
        self._scratch: NvArray | None = None
        self._plans: dict[tuple[int, int], Plan] = {}
        self._poll: Callable[..., None] | None = engine.poll  # NCCL's asynchronous errors
        self._last_dt = self._last_red = self._last_plan = None  # the last reduction's plan

    # -- identity ----------------------------------------------------------------------
    @property
    def size(self) -> int:
        """The number of ranks (``world_size``)."""
        return self.world_size

    @property
    def backend(self) -> str:
        """``"nccl"`` or ``"emulated"``."""
        return self._engine.name

    @property
    def bindings(self) -> str | None:
        """Which NCCL bindings are in use ("nccl4py", "cupy", "ctypes"); None when emulated."""
        return getattr(self._engine, "bindings", None)

    @property
    def is_closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    @property
    def error(self) -> CollectiveError | None:
        """The failure that broke this communicator, if any."""
        return self._health.error

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._health.error else "open")
        return (f"<ignis.collective.Communicator rank={self.rank}/{self.world_size} backend={self.backend} "
                f"device={self.device.ordinal} {state}>")

    # -- checks ------------------------------------------------------------------------
    def _check_usable(self, what: str) -> None:
        """Raise if this communicator is closed or failed; on NCCL, first ask it for an
        asynchronous error (``ncclCommGetAsyncError``), so a call does not queue behind one."""
        if self._closed:
            raise CollectiveError("the communicator is closed; make a new one with init_process_group()", op=what,
                                  this_rank=self.rank, kind="closed")
        if self._poll is not None:
            self._poll()
        if self._health.claimed is not None:
            raise self._health.report(what)

    def _array(self, a: Any, what: str, role: str) -> NvArray:
        if not isinstance(a, NvArray):
            hint = ("; adopt it with ig.from_dlpack(x) (contiguous arrays only)"
                    if hasattr(a, "__dlpack__") or hasattr(a, "__cuda_array_interface__") else "")
            raise TypeError(f"{what}: {role} must be an ignis NvArray, got {type(a).__name__}{hint}")
        a.check_usable(f"use in {what}")  # freed, a freed base, stale, or a failed collective's target
        if a.device is not self.device:
            raise ValueError(f"{what}: {role} NvArray#{a.id} is on device {a.device.ordinal}, but this "
                             f"communicator (rank {self.rank}) works on device {self.device.ordinal}; allocate it "
                             f"there (device={self.device.ordinal}) or copy it over")
        # NvArray's arrays and views are C-contiguous; a subclass may say otherwise.
        strides = getattr(a, "strides", None) if type(a) is not NvArray else None
        if strides is not None and tuple(strides) not in (_c_strides(a.shape, 1),
                                                          _c_strides(a.shape, a.dtype.itemsize)):
            raise ValueError(f"{what}: {role} NvArray#{a.id} is not contiguous (shape {a.shape}, strides "
                             f"{tuple(strides)}); collectives need contiguous memory: use a contiguous copy")
        return a

    def _peer(self, r: Any, what: str, role: str) -> int:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.world_size:
            raise ValueError(f"{what}: {role} {r!r} is not a rank of this communicator (0..{self.world_size - 1})")
        return r

    @staticmethod
    def _same(a: NvArray, b: NvArray, what: str) -> None:
        if a.dtype is not b.dtype or a.shape != b.shape:
            raise ValueError(f"{what}: send and recv must have the same shape and dtype; got send {a.shape} "
                             f"{a.dtype.name}, recv {b.shape} {b.dtype.name}")

    def _reduction(self, dt: _dt.DType, op: ReduceOp, what: str) -> Plan:
        if dt is self._last_dt and op is self._last_red:
            return self._last_plan
        key = (id(dt), id(op))  # DType rows and ReduceOp members are unique and immortal
        plan = self._plans.get(key)
        if plan is not None:
            self._last_dt, self._last_red, self._last_plan = dt, op, plan
            return plan
        plan = reduction_plan(dt, op, what)
        if dt in FP8 and not getattr(self._engine, "fp8", True):
            raise ValueError(f"{what}: {dt.name} reductions need NCCL 2.24 or later (this one is "
                             f"{self._engine.api.version}); cast to float16 or bfloat16")
        self._plans[key] = plan
        self._last_dt, self._last_red, self._last_plan = dt, op, plan
        return plan

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    # -- issue ---------------------------------------------------------------------------
    def _submit(self, op: _Op, a: NvArray, acc: Access, b: NvArray | None = None,
                acc_b: Access = _WRITE) -> None:
        """Acquire ``a`` (and ``b``), order, enqueue, record, release; or add to the open group."""
        g = self._group
        if g is not None:
            g.add(a, acc, op)
            if b is not None:
                g.add(b, acc_b, op)
            g.ops.append(op)
            return
        # Held for "collective" (two views of one array: once), ordered on the communicator's
        # stream, recorded and released. A failed run records nothing: it poisons what it was
        # to write, and the others must not wait on a failed stream.
        # (``NvArray.access_all``'s block, held without the ``with`` protocol: compiled, its
        # enter and exit are C calls, where ``with`` looks up and binds two methods a call)
        uses = ((a, acc),) if b is None else ((a, acc), (b, acc_b))
        block = access_block(uses, self.stream, OWNER, op.name, False)
        block.enter()
        try:
            if acc is not _READ:
                targets: tuple = (_target(a, op),) if b is None else (_target(a, op), _target(b, op))
            else:
                targets = () if b is None or acc_b is _READ else (_target(b, op),)
            try:
                self._engine.run((op,), self.stream, targets)
            except BaseException as e:
                self._run_failed((op,), targets, e)
        except BaseException:
            block.exit(False)
            raise
        block.exit(True)

    def _run_failed(self, ops: "list[_Op] | tuple[_Op, ...]", targets: tuple, e: BaseException) -> None:
        """The engine raised while queuing ``ops``: part of the work may be queued, so the
        communicator fails and ``targets`` are poisoned; raises the ``CollectiveError``."""
        err = e if isinstance(e, CollectiveError) else CollectiveError(
            f"queuing it failed: {type(e).__name__}: {e}", op=ops[0].label, this_rank=self.rank, kind="error")
        self._health.fail(err)
        poison(targets, self._health.error or self._health.claimed or err, self.rank)
        self._health.told()
        if err is e:
            raise e
        raise err from e

    def _issue(self, ops: "list[_Op] | tuple[_Op, ...]", held: list) -> None:
        s = self.stream
        # The group holds the arrays already (by=None: used, not acquired again).
        with NvArray.access_all([(a, acc) for a, acc, _ in held], s, by=None, op=ops[0].name,
                                finish_on_error=False):
            targets = tuple(_target(a, w) for a, _, w in held if w is not None)
            try:
                self._engine.run(ops, s, targets)
            except BaseException as e:
                self._run_failed(ops, targets, e)

    @contextmanager
    def group(self) -> Iterator["Communicator"]:
        """Issue every operation called inside the block as one group (``ncclGroupStart``/``End``):
        needed for send/recv pairs that would otherwise wait on each other, and cheaper for many
        small calls. Arrays stay acquired for ``"collective"`` until the block ends. An exception
        inside the block issues nothing (the other ranks then time out). Nested groups join the
        outer one."""
        if self._group is not None:
            yield self
            return
        self._check_usable("group")
        g = self._group = _Group(self.stream)
        try:
            yield self
        except BaseException:
            self._group = None
            g.release()
            raise
        self._group = None
        try:
            if g.ops:
                self._check_usable(g.ops[0].label)
                self._issue(g.ops, list(g.held.values()))
        finally:
            g.release()

    # -- collectives -----------------------------------------------------------------------
    def all_reduce(self, send: NvArray, recv: NvArray | None = None, *, op: "ReduceOp | str" = "sum") -> NvArray:
        """Reduce ``send`` over all ranks into ``recv`` (default: in place). Returns the result array."""
        what = "all_reduce"
        self._check_usable(what)
        red = _OPS.get(op) or ReduceOp.parse(op)
        s = self._array(send, what, "send")
        r = s if recv is None or recv is send else self._array(recv, what, "recv")
        if r is not s:
            self._same(s, r, what)
        plan = self._reduction(s.dtype, red, what)
        o = _Op(what, self._next(), s, r, s.numel * plan.per_element, plan, red, -1, s.dtype.name)
        if r is s:
            self._submit(o, s, _RW)
        else:
            self._submit(o, s, _READ, r, _WRITE)
        return r

    def broadcast(self, array: NvArray, *, root: int = 0) -> NvArray:
        """Copy ``root``'s ``array`` into ``array`` on every other rank (in place)."""
        what = "broadcast"
        self._check_usable(what)
        a = self._array(array, what, "array")
        root = self._peer(root, what, "root")
        plan = movement_plan(a.dtype)
        o = _Op(what, self._next(), a, a, a.numel * plan.per_element, plan, None, root, a.dtype.name)
        self._submit(o, a, _READ if self.rank == root else _WRITE)
        return a

    def reduce(self, send: NvArray, recv: NvArray | None = None, *, root: int = 0,
               op: "ReduceOp | str" = "sum") -> NvArray:
        """Reduce ``send`` over all ranks into ``recv`` (default: ``send``) on ``root`` only;
        other ranks' ``recv`` is not touched. Returns ``recv`` (``send`` where none)."""
        what = "reduce"
        self._check_usable(what)
        red = _OPS.get(op) or ReduceOp.parse(op)
        s = self._array(send, what, "send")
        r = s if recv is None or recv is send else self._array(recv, what, "recv")
        if r is not s:
            self._same(s, r, what)
        root = self._peer(root, what, "root")
        plan = self._reduction(s.dtype, red, what)
        seq = self._next()
        if self.rank != root:
            self._submit(_Op(what, seq, s, None, s.numel * plan.per_element, plan, red, root, s.dtype.name),
                         s, _READ)
            return r
        o = _Op(what, seq, s, r, s.numel * plan.per_element, plan, red, root, s.dtype.name)
        if r is s:
            self._submit(o, s, _RW)
        else:
            self._submit(o, s, _READ, r, _WRITE)
        return r

    def all_gather(self, send: NvArray, recv: NvArray | None = None) -> NvArray:
        """Concatenate every rank's ``send`` (in rank order) into ``recv`` on every rank.
        ``recv`` needs ``world_size * send.numel`` elements; default: a new
        ``(world_size, *send.shape)`` array on this communicator's stream."""
        what = "all_gather"
        self._check_usable(what)
        s = self._array(send, what, "send")
        if recv is None:
            r = NvArray((self.world_size, *s.shape), s.dtype, stream=self.stream)
        else:
            r = self._array(recv, what, "recv")
            if r.dtype is not s.dtype or r.numel != self.world_size * s.numel:
                raise ValueError(f"{what}: recv must hold world_size ({self.world_size}) x send.numel ({s.numel}) "
                                 f"= {self.world_size * s.numel} {s.dtype.name} elements; got {r.numel} "
                                 f"{r.dtype.name} (shape {r.shape})")
            if r is s:
                raise ValueError(f"{what}: send and recv are the same array; for in-place use pass the rank's "
                                 "slot of recv as send (recv[rank])")
        plan = movement_plan(s.dtype)
        o = _Op(what, self._next(), s, r, s.numel * plan.per_element, plan, None, -1, s.dtype.name)
        self._submit(o, s, _READ, r, _WRITE)
        return r

    def reduce_scatter(self, send: NvArray, recv: NvArray | None = None, *,
                       op: "ReduceOp | str" = "sum") -> NvArray:
        """Reduce ``send`` over all ranks and give rank ``i`` the ``i``-th of ``world_size``
        equal parts in ``recv`` (``send.numel / world_size`` elements; default: a new array,
        ``send.shape[1:]`` when the first dimension is ``world_size``, else 1-D)."""
        what = "reduce_scatter"
        self._check_usable(what)
        red = _OPS.get(op) or ReduceOp.parse(op)
        s = self._array(send, what, "send")
        n = self.world_size
        if recv is None:
            if s.numel % n:
                raise ValueError(f"{what}: send has {s.numel} elements, not a multiple of world_size ({n})")
            shape = s.shape[1:] if s.shape and s.shape[0] == n else (s.numel // n,)
            r = NvArray(shape, s.dtype, stream=self.stream)
        else:
            r = self._array(recv, what, "recv")
            if r.dtype is not s.dtype or r.numel * n != s.numel:
                raise ValueError(f"{what}: send must hold world_size ({n}) x recv.numel ({r.numel}) = "
                                 f"{n * r.numel} {r.dtype.name} elements; got {s.numel} {s.dtype.name} "
                                 f"(shape {s.shape})")
            if r is s:
                raise ValueError(f"{what}: send and recv are the same array; pass the rank's slot of send as recv")
        plan = self._reduction(s.dtype, red, what)
        o = _Op(what, self._next(), s, r, r.numel * plan.per_element, plan, red, -1, s.dtype.name)
        self._submit(o, s, _READ, r, _WRITE)
        return r

    # -- point to point ---------------------------------------------------------------------
    def send(self, array: NvArray, peer: int) -> None:
        """Send ``array`` to rank ``peer`` (which calls ``recv`` with the same shape and dtype)."""
        self._p2p("send", array, peer)

    def recv(self, array: NvArray, peer: int) -> NvArray:
        """Receive into ``array`` what rank ``peer`` sends. Returns ``array``."""
        return self._p2p("recv", array, peer)

    def _p2p(self, what: str, array: NvArray, peer: int) -> NvArray:
        """Queue a send (``array`` read) or a recv (``array`` written), numbered per peer and direction."""
        self._check_usable(what)
        a = self._array(array, what, "array")
        peer = self._peer(peer, what, "peer")
        plan = movement_plan(a.dtype)
        sending = what == "send"
        counts = self._p2p_sent if sending else self._p2p_recvd
        k = counts[peer]
        counts[peer] = k + 1
        op = _Op(what, k, a if sending else None, None if sending else a, a.numel * plan.per_element, plan, None,
                 peer, a.dtype.name)
        self._submit(op, a, _READ if sending else _WRITE)
        return a

    # -- synchronization -----------------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait on the host for everything queued on this communicator; raise its
        ``CollectiveError`` if it failed (it never waits past a failure). A failure of
        the stream itself fails the communicator too (a ``CollectiveError``, never a
        ``DriverError``). On NCCL it also confirms that every rank made the same calls
        (``matching``), so a mismatch raises here even where NCCL completed it."""
        self._check_usable("synchronize")
        engine = self._engine
        upto = engine.issued
        t0 = time.monotonic()
        delay = 0.0
        while True:
            if self._poll is not None:
                self._poll(True)
            try:
                done = self.stream.query()
            except DriverError as e:
                if self._health.claimed is None:
                    err = CollectiveError(f"the communicator's stream failed: {e}", op=self._health.oldest(),
                                          this_rank=self.rank, kind="stream")
                    err.__cause__ = e
                    self._health.fail(err)
                raise self._health.report() from None
            if done:
                break
            if self._health.claimed is not None:
                raise self._health.report()
            time.sleep(delay)
            delay = min(max(delay * 2, 2e-5), 1e-3)
        engine.confirm(max(0.0, self.timeout - (time.monotonic() - t0)))
        if self._health.claimed is not None:
            raise self._health.report()
        engine.finished(upto)

    def barrier(self) -> None:
        """Return once every rank has called ``barrier()`` (an all-reduce of one
        element, then ``synchronize()``)."""
        self._check_usable("barrier")
        if self._scratch is None:
            self._scratch = NvArray((1,), _dt.int32, stream=self.stream).zero_()
        self.all_reduce(self._scratch)
        self.synchronize()

    # -- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish queued work, then release the engine, the rendezvous and the stream.
        Idempotent; never raises for a communicator that failed."""
        if self._closed:
            return
        if self._health.claimed is None:
            try:
                self.synchronize()
            except CollectiveError:
                pass
        self._closed = True
        g, self._group = self._group, None
        if g is not None:
            g.release()
        try:
            if self._health.claimed is None:
                self._engine.close()
            else:
                self._engine.abort()
        finally:
            if self._rdzv is not None:
                self._rdzv.close()
            scratch, self._scratch = self._scratch, None
            if scratch is not None and not scratch.freed:
                try:
                    scratch.free()
                except Exception:
                    pass
            if self._owns_stream:
                try:
                    self.stream.close()
                except Exception:
                    pass
            for fn in self._on_close:
                try:
                    fn(self)
                except Exception:
                    pass

    def on_close(self, fn: "Callable[[Communicator], None]") -> None:
        """Call ``fn(self)`` once this communicator has closed (its owner forgets it there:
        the default process group does). Its errors are not raised from ``close()``.

        Args:
            fn: a function of the communicator.
        """
        if not callable(fn):
            raise TypeError(f"on_close takes a function, not {type(fn).__name__}")
        self._on_close.append(fn)

    def _abandon(self, why: str) -> None:
        """Fail this communicator for a reason of this rank's own (``why``), then close it: the
        engine aborts and tells the peers ``why``, so they fail at once, naming it."""
        if not self._closed and self._health.claimed is None:
            self._health.fail(CollectiveError(why, op=self._health.oldest(), this_rank=self.rank, kind="aborted"))
        self.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out = []
    step = itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))
