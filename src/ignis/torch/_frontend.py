"""The PyTorch front end: each op on CUDA tensors becomes checked accesses of byte ranges.

Design:
- Two engines see the ops; both hand the sanitizer the same list of accesses per op,
  queued on the current CUDA stream of the tensors' device (the raw ``cudaStream_t``,
  the same handle Ignis's streams have, so both share one vector clock):
  - the op observer (``_observer.cpp``, built by ``_native`` against the installed
    torch): a C++ RecordFunction callback that sees every dispatcher call on every
    thread, reads the tensors an op's spec names below Python, takes the stack
    (``capture_stack``) and hands the byte ranges to the sanitizer's
    ``foreign_access`` itself, once per checked op (record_stream to its
    ``extent_record_stream``); ops with host tensors while pinned memory is tracked
    come to ``_observed``, and copies with a host side and ``resize_`` to
    ``_observed_special`` (a copy between device tensors goes the direct way). The
    default in collect mode (``ignis run --sanitize``). It cannot raise inside an op:
    in raise mode what it finds is raised when checking stops.
  - the dispatch mode (``_Mode``, a ``TorchDispatchMode``): sees every aten op below
    autograd and autocast on the thread that entered it (and the autograd engine's
    threads, which carry it along), runs it, then reports it (``on_op``). Raises at the
    op; the default in raise mode and where the observer cannot be built.
  Both report the outermost op that is not a CompositeImplicitAutograd decomposition;
  the ops it runs inside are its own.
- Each op's spec (reads, writes, outputs) comes from its schema (``_ops``), cached.
- An access is a byte range of the tensor's storage: base = ``data_ptr -
  storage_offset * itemsize`` (the caching allocator's block), span
  ``[data_ptr, data_ptr + extent)`` and, for a view that is a regular set of
  chunks (a column, a block of columns), its period and chunk, so disjoint
  parts of one tensor do not conflict.
- PyTorch's GPU trace (``torch.cuda._gpu_trace``) feeds the clocks (event record /
  wait, stream / event / device synchronize) and the foreign extents (the caching
  allocator's free of a block; with the observer, a block's lifetime starts at the op
  whose fresh output it is, so allocations need nothing). With the observer, the trace's
  interpreter is the observer's own (its ``TraceShim``): each event goes from C++ to its
  handler here, an allocation costs no Python at all, and PyTorch's Python registries
  still serve any other listener; PyTorch's Python implementation calls its registries
  for every allocation and free, listened to or not, which cost a ResNet-18 step 1.2x by
  itself. Without the observer (or on a torch whose interface the shim was not checked
  against) the handlers are PyTorch's registries' callbacks. ``record_stream`` is an op,
  seen here. A trace event cannot raise into the program: in raise mode an error found
  there is raised by the next op.
- Collectives (``torch.distributed`` on NCCL: ``c10d`` ops and the functional
  collectives) are bracketed: the front end hears of the op's start and end, and
  the event records and waits PyTorch's trace reports in between tell where the
  communication ran: ProcessGroupNCCL makes its own stream wait for an event on
  the issuing stream, launches, and records its end event there; a synchronous
  call runs on the issuing stream itself. At the end the op's buffers are read
  and written on that stream (roles from ``_ops``'s table), ordered after the
  issuing stream's work before the call, and the end events recorded inside the
  op are taken again so that they cover the access: ``Work.wait()`` (an event
  wait on the caller's stream) orders what follows it. The buffers count as
  ``record_stream``'d on the communication stream: PyTorch keeps them alive until
  the collective is done (stashed or record_stream'd), so their frees wait for it.
- Pinned host memory: the host side of a ``non_blocking`` copy is an access on
  the copy's stream; afterwards, a CPU op on those bytes is an access by the
  host, checked like any other until a synchronization retires the copy.
- Cost: nothing until enabled. Enabled, the user's frames are captured once per
  checked op by Ignis's walker (``ignis.safety.frames``: interned, formatted only for a
  report). This module and the sanitizer's checking (``ignis.safety.sanitizer``, its records typed by
  ``sanitizer.pxd``) are compiled by Cython from this source (setup.py's
  ``PURE_PYTHON_MODULES``). What remains per op is the observer's one call into
  Python (or the dispatch mode's Python handler) and PyTorch's trace callbacks.

- CUDA graphs (``_graphs``): what is queued on a capturing stream is recorded into
  the graph and applied at each replay, on the replay stream; a replay that
  touches a block freed or reallocated since the capture is reported.
- ``Event.query()`` and ``Stream.query()`` (``_queries``; ``torch.cuda``'s and the
  device-generic ``torch.Event`` / ``torch.Stream``) answering True are the host
  synchronizations they are (a program polling them is ordered).
- ``torch.distributed``'s ``Work.is_completed()`` (``_works``) answering True joins the
  host to the collective's end, as a synchronization does.
- ``UntypedStorage.resize_`` (``_storage``), which frees or moves a storage below the
  dispatcher, takes the memory from under a collective that still uses it: the
  collective's accesses then race the free.
- ``torch.ctc_loss`` with lengths on the CPU (``_ctc``): under the dispatch mode it goes to
  the list overload PyTorch takes without a mode (any mode sends it down a path that refuses
  host lengths next to device inputs).
- Triton kernels (``_triton``: Inductor's and a user's ``@triton.jit``) are seen at
  launch: the tensors they take are read and written as the kernel does, on the
  launch stream.

Not seen (nothing goes through the dispatcher): raw extension kernels called
without an op schema, library-internal workspaces, and CPU reads of pinned memory
through ``numpy()`` or the buffer protocol. Declare such uses with
``ignis.torch.use(tensor, access, stream=...)``. With the dispatch mode, ops of
other threads are seen on the threads started after checking began (the front end
enters the mode there) and on the autograd engine's (which inherit it), not on
threads already running then; the observer sees every thread's.
"""

from __future__ import annotations

import getpass
import importlib
import itertools
import os
import sys
import tempfile
import threading
import weakref
from operator import attrgetter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..errors import IgnisError
from .._types import Access
from ..safety.frames import add_library_dir, last_from_library
from ..safety.sanitizer import HOST, NO_INIT_CHECK, OUTPUT, PINNED, READ, WRITE, Sanitizer, unpack_items
from ..safety.sanitizer import user_frames as _san_frames
from . import _ctc, _graphs, _hook, _queries, _storage, _triton, _works
from ._ops import BROADCAST, P2P, REDUCE, SPECS, OpSpec, classify, flatten

__all__ = ["TorchFrontEnd"]

_set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
Tensor = torch.Tensor


# The user's frames at the current op: the sanitizer's own capture (Ignis's walker, interned:
# a loop's ops cost a walk and a lookup). On the autograd engine's threads, which run no frame
# of the user's, the main thread's frames: where ``backward()`` was called.
capture_stack = _san_frames


_exit_hooked: set = set()
_backward_wrappers: weakref.WeakSet = weakref.WeakSet()  # the front ends' _engine_run_backward wrappers


def _at_exit_stop_checker(lib: Any) -> None:
    """At the interpreter's exit, stop the observer's checker thread (where it runs) while the
    interpreter still runs: a program may exit without stopping the checks."""
    if id(lib) not in _exit_hooked:
        _exit_hooked.add(id(lib))
        import atexit
        atexit.register(lib.ignis_obs_checker_stop)


# The observer library's measure of tensors (``_observer.cpp``: ``measure``), bound by
# ``_bind_native`` when a front end starts: ``item(tensor, mode)`` -> one tensor's access, a
# tuple (storage base, storage size, span lo, span hi, period, chunk, mode), or None for a tensor
# of no bytes; ``op_items(native spec, args, kwargs, out, host)`` -> a whole op's, packed;
# ``op_spec(inputs, outputs, multi, cuda)`` -> an OpSpec's native spec. Both engines measure with
# it: the rule (views, strides, lists, out= arguments, aliases) is written once, in C++.
_ITEM: Callable[[Any, int], tuple | None] | None = None
_OP_ITEMS: Callable[..., tuple | None] | None = None
_OP_SPEC: Callable[..., Any] | None = None


def _bind_native() -> None:
    """Bind the observer library's measure (built against this torch at first use);
    RuntimeError where it cannot be built."""
    global _ITEM, _OP_ITEMS, _OP_SPEC
    if _ITEM is not None:
        return
    from ._native import observer, observer_error
    lib = observer()
    if lib is None:
        raise RuntimeError(f"ignis.torch: the op observer cannot be built here ({observer_error()}); both ways of "
                           "checking PyTorch's ops measure tensors with it: install a C++ compiler (or set CXX to "
                           "one) and try again")
    fns = lib.ignis_obs_py_functions()
    _OP_ITEMS, _OP_SPEC, _ITEM = fns["op_items"], fns["op_spec"], fns["item"]


def _item(t: torch.Tensor, mode: int) -> tuple | None:
    """One tensor's access: (storage base, storage size, span lo, span hi, period, chunk,
    mode), or None for a tensor of no bytes (the observer library's ``item``)."""
    return _ITEM(t, mode)


def _after(first: Callable[[], Any], fn: Callable) -> Callable:
    """``fn``, calling ``first()`` before it."""
    def cb(*args: Any) -> None:
        first()
        fn(*args)
    return cb


_FAKE_EVENTS = itertools.count(-1, -1)  # the front end's own event keys (no real handle is negative)


class _Bracket:
    """A collective in flight on one thread: its spec, its issuing stream, the user's frames at
    the call, and the event records and waits seen inside it (``(kind, event, stream)``)."""

    __slots__ = ("spec", "stream", "frames", "lib", "log")

    def __init__(self, spec: OpSpec, stream: int, frames: Any) -> None:
        self.spec, self.stream, self.frames = spec, stream, frames
        self.lib = int(last_from_library())  # (read right after ``frames`` were captured)
        self.log: list[tuple[str, int, int]] = []


def _arg(spec: OpSpec, args: tuple, kwargs: dict | None, name: str) -> Any:
    """The argument ``name`` of one call of ``spec``'s op (None when it has none)."""
    schema = getattr(spec.op, "_schema", None)
    if schema is None:
        return None
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            if i < len(args):
                return args[i]
            return kwargs.get(name) if kwargs else None
    return None


class _Mode(TorchDispatchMode):
    """Runs each op, then reports its accesses to the front end."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # __torch_dispatch__ keeps dynamo out itself, at a fraction of the wrapper's cost

    def __init__(self, fe: "TorchFrontEnd") -> None:
        super().__init__()
        self.fe = fe
        self.on = True  # False once checking stopped (a thread's mode, its thread still running)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not self.on:
            return func(*args, **kwargs) if kwargs else func(*args)
        prior = _set_eval_frame(None)
        try:
            fe = self.fe
            if fe.pending:
                raise fe.pending.pop(0)
            spec = SPECS.get(func)
            if spec is None:
                spec = classify(func)
            hv = fe.san.syncs  # an op that synchronizes inside (.item(), .cpu()) moves it on
            if spec.special is not None:
                return fe.special(spec, args, kwargs, hv)
            out = spec.call(*args, **kwargs) if kwargs else spec.call(*args)
            if spec.active:
                fe.on_op(spec, args, kwargs, out, hv)
            return out
        finally:
            if prior is not None:
                _set_eval_frame(prior)


class TorchFrontEnd:
    """Feeds PyTorch's ops and trace events into a ``Sanitizer``.

    ``device_type="cpu"`` (tests) treats CPU tensors as the device's and takes
    streams from ``stream_of(tensor) -> handle``; nothing CUDA is touched then."""

    def __init__(self, san: Sanitizer, *, device_type: str = "cuda",
                 stream_of: Callable[[torch.Tensor | None], int] | None = None, engine: str | None = None) -> None:
        source = "engine"
        if engine is None and os.environ.get("IGNIS_TORCH_ENGINE"):
            engine, source = os.environ["IGNIS_TORCH_ENGINE"], "IGNIS_TORCH_ENGINE"
        if engine not in (None, "observer", "mode"):
            raise ValueError(f"ignis.torch: {source} must be 'observer' or 'mode' (or unset: the observer where "
                             f"it can be built, in collect mode), not {engine!r}")
        batch = os.environ.get("IGNIS_OBSERVER_BATCH")  # (read by the observer when it starts)
        if batch is not None and not (batch.strip().isdigit() and 1 <= int(batch) <= 4096):
            raise ValueError(f"ignis.torch: IGNIS_OBSERVER_BATCH must be a whole number from 1 to 4096 (the calls "
                             f"the op observer holds before it makes them; unset: 256), not {batch!r}")
        checker = os.environ.get("IGNIS_OBSERVER_CHECKER")  # (read by the observer when it starts)
        if checker is not None and checker not in ("0", "1"):
            raise ValueError(f"ignis.torch: IGNIS_OBSERVER_CHECKER must be 0 (the default: the checks of a "
                             f"backward pass's ops are made on the backward pass's thread) or 1 (on a thread "
                             f"of their own), not {checker!r}")
        self.san = san
        self.engine_asked = engine
        self.engine: str | None = None  # which one runs, once enabled
        self._obs: Any = None           # the loaded observer library, while it runs
        self._obs_specs: list[OpSpec] = []
        self._obs_nb: dict[int, int] = {}
        self._cuda = device_type == "cuda"
        self._dev_type = device_type
        self._is_dev = attrgetter("is_cuda" if self._cuda else "is_cpu")
        if stream_of is None:  # a PyTorch without CUDA has no CUDA tensors: the stream is never asked for
            stream_of = self._current_stream if _raw_stream is not None else (lambda t: 0)
        self.stream_of = stream_of
        self._ops = 0         # ops that touched device tensors (see ``ops``)
        self.cpu_ops = 0      # ops that touched only host tensors (not checked)
        self.pending: list[IgnisError] = []
        self._mode: _Mode | None = None
        self._thread_modes: set[_Mode] = set()  # the dispatch mode entered on the threads started since
        self._thread_start: tuple | None = None  # (threading.Thread.start, the wrapper put in its place)
        self._callbacks: list[tuple[Any, Callable]] = []
        self._trace_shim = False  # the observer took PyTorch's GPU trace below Python (_install_trace)
        self._backward_windows: tuple | None = None  # (PyTorch's _engine_run_backward, the wrapper)
        self.trace_hooked = False  # it did, at the last enable (stays so after disable, for the summary)
        self._storages: dict[int, weakref.ref] = {}
        self._handles: dict[tuple, int] = {}
        # Collectives in flight on each thread (its id -> a stack of brackets), and the
        # communication streams already named in reports.
        self._brackets: dict[int, list[_Bracket]] = {}
        self._comm_streams: set[int] = set()
        # An asynchronous collective's Work -> (a weak reference to it, an event key of the front
        # end's own recorded after the collective): ``is_completed()`` answering True joins it.
        self._work_ends: dict[int, tuple[weakref.ref, int]] = {}
        self._fresh_works: dict[int, list] = {}  # per thread: held until the call returns them (_note_works)
        self._dead_work_keys: list[int] = []

    @property
    def ops(self) -> int:
        """Ops that touched device tensors (checked), by either engine."""
        if self._obs is not None:  # those the observer handed to the sanitizer itself
            self._ops += self._obs.ignis_obs_take_ops()
        return self._ops

    @ops.setter
    def ops(self, n: int) -> None:
        if self._obs is not None:  # what the observer counted so far is part of what is replaced
            self._obs.ignis_obs_take_ops()
        self._ops = n

    # -- per op ------------------------------------------------------------------
    @staticmethod
    def _current_stream(t: torch.Tensor) -> int:
        return _raw_stream(t.get_device())

    def on_op(self, spec: OpSpec, args: tuple, kwargs: dict | None, out: Any, hv: int = -1) -> None:
        """Report one op's accesses (called after it ran; ``hv``: the sanitizer's count of host
        synchronizations before it ran, so that a synchronization inside the op covers the op
        itself, even one that ordered nothing new for the host). The
        op's tensors are measured in one call into the observer library (``op_items``)."""
        san = self.san
        native = spec.native
        if native is None or native[0] is not self._cuda:  # (made once per op and kind of front end)
            native = spec.native = (self._cuda, _OP_SPEC(spec.inputs, spec.outputs, spec.multi, self._cuda))
        r = _OP_ITEMS(native[1], args, kwargs, out, bool(san.pinned))
        host = None
        if r is not None:
            items, host, dev = r
            if host is not None:
                pinned = san.pinned
                host = [it for it in unpack_items(host) if it[0] in pinned]
            if items is None and not host:
                r = None
        if r is None:
            self.cpu_ops += 1
            return
        frames = capture_stack()
        if items is not None:
            self._ops += 1
            san.foreign_access(self.stream_of(dev), spec.name, frames, items, san.syncs != hv)
        if host:
            san.foreign_access(HOST, spec.name, frames, host)

    def special(self, spec: OpSpec, args: tuple, kwargs: dict | None, hv: int = -1) -> Any:
        """Ops with more to them than their schema: record_stream, copies, resize_."""
        kw = kwargs or {}
        kind = spec.special
        if kind == "collective":
            return self.collective(spec, args, kw)
        pre = None
        if kind == "resize" and self._is_dev(args[0]):
            t = args[0]
            pre = (t.data_ptr() - t.storage_offset() * t.element_size(), t.untyped_storage().nbytes())
        out = spec.call(*args, **kw)
        if kind == "copy":
            nb = args[2] if len(args) > 2 else kw.get("non_blocking", False)
        else:
            nb = kw.get("non_blocking", False)
        self._special_done(spec, args, nb, out, pre, self.san.syncs != hv, None)
        return out

    def _special_done(self, spec: OpSpec, args: tuple, non_blocking: Any, out: Any, pre: tuple | None,
                      synced: bool, stream: int | None) -> None:
        """A special op's accesses, after it ran (``pre``: resize_'s storage base and size
        before; ``stream``: the op's stream handle, None: the tensors' current one)."""
        kind = spec.special
        if kind == "record_stream":
            t = args[0]
            if self._is_dev(t):
                it = _ITEM(t, READ)
                if it is not None:
                    self.san.extent_record_stream(it[0], self._handle(args[1]))
            return
        if kind == "resize":
            t = args[0]
            if pre is None or not self._is_dev(t):
                return
            old_base, old_n = pre
            after = _ITEM(t, OUTPUT)
            if after is not None and after[0] != old_base:  # reallocated: the old bytes were copied over
                kept = min(old_n, after[1])
                items = [after]
                if kept:
                    items.append((after[0], after[1], after[0], after[0] + kept, 0, 0, WRITE | NO_INIT_CHECK))
                self._ops += 1
                self.san.foreign_access(self.stream_of(t) if stream is None else stream, spec.name,
                                        capture_stack(), items)
            return
        if kind == "copy":
            dst, src = args[0], args[1]
            wmode = WRITE
        else:  # _to_copy
            src, dst = args[0], out
            wmode = WRITE | OUTPUT
        sd, dd = self._is_dev(src), self._is_dev(dst)
        if not (sd or dd):
            self.on_op(spec, args, None, out)  # a host copy: checked only on tracked pinned memory
            return
        items = []
        for t, mode, on_dev in ((src, READ, sd), (dst, wmode, dd)):
            if on_dev:
                it = _ITEM(t, mode)
            else:  # the host side: a stream access when pinned (an async copy may still be using it)
                it = self._pinned_item(t, mode, bool(non_blocking))
            if it is not None:
                items.append(it)
        if items:
            self._ops += 1
            if stream is None:
                stream = self.stream_of(dst if dd else src)
            self.san.foreign_access(stream, spec.name, capture_stack(), items, synced)  # a blocking copy synchronizes
        if self._obs is not None and self.san.pinned:
            self._obs.ignis_obs_host_check(1)

    def _pinned_item(self, t: torch.Tensor, mode: int, non_blocking: bool) -> tuple | None:
        it = _ITEM(t, mode | PINNED)
        if it is None:
            return None
        base = it[0]
        if base not in self.san.pinned and not (non_blocking and self._cuda and t.is_pinned()):
            return None
        st = t.untyped_storage()
        ref = self._storages.get(base)
        if ref is None or ref() is not st:
            if ref is not None:
                self.san.extent_dropped(base)  # a new pinned storage at an old address
            self._storages[base] = weakref.ref(st, lambda r, b=base: self._storage_died(b, r))
        return it

    def _storage_died(self, base: int, ref: weakref.ref) -> None:
        if self._storages.get(base) is ref:
            del self._storages[base]
            self.san.extent_dropped(base)

    def _handle(self, s: Any) -> int:
        """The raw stream handle of a ``torch.Stream`` (what ``record_stream`` passes)."""
        if isinstance(s, int):
            return s
        if not isinstance(s, torch.Stream):  # (torch.cuda.Stream is one) a stream-like object
            h = getattr(s, "cuda_stream", None)
            if h is not None:
                return h
        return self._raw_handle(s.stream_id, s.device_index, s.device_type)

    def _raw_handle(self, stream_id: int, device_index: int, device_type: int) -> int:
        """The raw handle of the stream PyTorch packs as (id, device index, device type)."""
        key = (stream_id, device_index, device_type)
        h = self._handles.get(key)
        if h is None:
            h = self._handles[key] = torch.cuda.Stream(stream_id=stream_id, device_index=device_index,
                                                       device_type=device_type).cuda_stream
        return h

    # -- collectives -------------------------------------------------------------------
    def collective(self, spec: OpSpec, args: tuple, kwargs: dict | None) -> Any:
        """Run a collective (the dispatch mode's way) between its bracket's start and end."""
        b = self._coll_begin(spec, flatten(args, []))
        try:
            out = spec.call(*args, **kwargs) if kwargs else spec.call(*args)
        except BaseException:
            self._coll_end(b, None, None, None)
            raise
        self._coll_end(b, args, kwargs, out)
        return out

    def _coll_begin(self, spec: OpSpec, tensors: list, stream: int | None = None) -> "_Bracket | None":
        """Open a collective's bracket on this thread (None when it has no tensor of the device)."""
        dev = next((t for t in tensors if self._is_dev(t)), None)
        if dev is None:
            return None
        b = _Bracket(spec, self.stream_of(dev) if stream is None else stream, capture_stack())
        self._brackets.setdefault(threading.get_ident(), []).append(b)
        return b

    def _coll_note(self, kind: str, event: int, stream: int) -> None:
        """An event record ("r") or wait ("w") seen inside an open bracket of this thread."""
        stack = self._brackets.get(threading.get_ident())
        if stack:
            stack[-1].log.append((kind, event, stream))

    def _on_event_record(self, event: int, stream: int) -> None:
        if self._brackets:
            self._coll_note("r", event, stream)
        self.san.on_event_record(event, stream)

    def _on_event_wait(self, event: int, stream: int) -> None:
        if self._brackets:
            self._coll_note("w", event, stream)
        self.san.on_event_wait(event, stream)

    def _coll_end(self, b: "_Bracket | None", args: tuple | None, kwargs: dict | None, out: Any) -> None:
        """Close a bracket; with ``args`` (the op returned), apply the collective's accesses."""
        if b is None:
            return
        tid = threading.get_ident()
        stack = self._brackets.get(tid)
        if stack and b in stack:
            stack.remove(b)
        if not stack:
            self._brackets.pop(tid, None)
        if args is None:
            return  # it failed: nothing was launched that Ignis could account for
        spec, issue, san = b.spec, b.stream, self.san
        # The communication stream: one that waited inside the op for an event recorded on the
        # issuing stream inside it (ProcessGroupNCCL's syncStream); none: the issuing stream.
        marks = {ev for k, ev, st in b.log if k == "r" and st == issue}
        comm = next((st for k, ev, st in b.log if k == "w" and ev in marks and st != issue), issue)
        before = self._coll_items(spec, spec.issue, args, kwargs, out)
        during = self._coll_items(spec, spec.comm, args, kwargs, out)
        self._ops += 1
        if before:
            san.foreign_access(issue, spec.name, b.frames, before, False, b.lib)
        if comm != issue:
            if comm not in self._comm_streams:
                self._comm_streams.add(comm)
                san.set_stream_label(comm, f"the communication stream {comm:#x}")
            key = next(_FAKE_EVENTS)  # the communication stream is after all the op queued on the issuing one
            san.on_event_record(key, issue)
            san.on_event_wait(key, comm)
            san.on_event_destroyed(key)
        if during:
            if comm != issue:  # what the op touches first was allocated on the issuing stream
                san.begin_lifetimes(issue, spec.name, b.frames, during, b.lib)
            san.foreign_access(comm, spec.name, b.frames, during, False, b.lib)
            if comm != issue:
                for it in during:  # kept alive on the Work until it is done (PyTorch's stash)
                    san.extent_record_stream(it[0], comm, True)
        for k, ev, st in b.log:  # the op's end events: taken again, so that a wait on them covers it
            if k == "r" and st == comm:
                san.on_event_record(ev, comm)
        self._note_works(out, comm)

    def _note_works(self, out: Any, comm: int) -> None:
        """The ``Work`` a collective returned (a ``torch.ScriptObject`` in the dispatcher's
        values): an event of the front end's own, recorded on the communication stream after
        the collective's accesses, that ``Work.is_completed()`` answering True joins the host
        to (``_on_work_completed``). The Work is reached through ``Work.unbox``, whose Python
        object PyTorch then hands to the program as well, as long as it lives: so it is held
        until the next collective (the call that made it has returned it by then), then only
        weakly (per thread: another thread's collective must not drop it early)."""
        fresh = self._fresh_works.get(threading.get_ident())
        if fresh:
            fresh.clear()
        dead = self._dead_work_keys
        while dead:
            self.san.on_event_destroyed(dead.pop())
        boxed = flatten(out, [], torch.ScriptObject)
        if not boxed:
            return
        cls = _works.work_class()
        if cls is None:
            return
        for obj in boxed:
            try:
                w = cls.unbox(obj)
                if w is None:  # no Work (an op of a coalesced group: the group's Work comes at its end)
                    continue
                ref = weakref.ref(w, self._work_gone(id(w), key := next(_FAKE_EVENTS)))
            except Exception:  # another class of object: not a Work
                continue
            self.san.on_event_record(key, comm)
            self._work_ends[id(w)] = (ref, key)
            self._fresh_works.setdefault(threading.get_ident(), []).append(w)

    def _work_gone(self, wid: int, key: int) -> Callable:
        """The callback of a Work's weak reference: forget it (its event is destroyed at the
        next collective, not from inside the garbage collector)."""
        ends, dead = self._work_ends, self._dead_work_keys

        def gone(ref: weakref.ref) -> None:
            entry = ends.get(wid)
            if entry is not None and entry[0] is ref:
                del ends[wid]
            dead.append(key)
        return gone

    def _on_work_completed(self, work: Any) -> None:
        """``work.is_completed()`` answered True: the host has seen the collective finish."""
        entry = self._work_ends.get(id(work))
        if entry is None or entry[0]() is not work:
            return
        self._host_saw(self.san.on_event_synchronize, entry[1])

    def _on_event_done(self, event: Any) -> None:
        """``event.query()`` answered True: the host has seen the work its record covers finish
        (as ``event.synchronize()`` tells PyTorch's trace)."""
        handle = getattr(event, "cuda_event", None)
        if handle is None:  # a device-generic torch.Event: its event_id is the same driver handle
            handle = event.event_id if event.device.type == self._dev_type else 0
        if handle:  # (0: never recorded, or another device's: nothing to order)
            self._host_saw(self.san.on_event_synchronize, handle)

    def _on_stream_done(self, stream: Any) -> None:
        """``stream.query()`` answered True: the host has seen all the stream's queued work finish
        (as ``stream.synchronize()`` tells PyTorch's trace)."""
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:  # a device-generic torch.Stream
            if stream.device.type != self._dev_type:
                return  # another device's: nothing to order here
            try:
                handle = stream.native_handle
            except (AttributeError, RuntimeError):  # (a PyTorch without it; a device without raw handles)
                try:
                    handle = self._handle(stream)
                except Exception:  # noqa: BLE001 - no handle to name: nothing this front end can order
                    return
        self._host_saw(self.san.on_stream_synchronize, handle)

    def _host_saw(self, synchronize: Callable[[int], None], handle: int) -> None:
        """A synchronization PyTorch's trace does not report (an answer of True), told as the
        trace's are: the observer's epoch moves on first (an op in flight across it is covered),
        then the sanitizer's ``synchronize(handle)``."""
        if self._obs is not None:
            self._obs.ignis_obs_synced()
        synchronize(handle)

    def _on_storage_resize(self, storage: Any, nbytes: Any) -> None:
        """``UntypedStorage.resize_(nbytes)`` is about to free or move a storage of the device:
        a collective's hold on it (its Work keeps the tensor, not the memory) no longer delays
        the free, so a collective still using it races the free."""
        try:
            if storage.device.type != self._dev_type or nbytes == storage.nbytes():
                return
            base = storage.data_ptr()
        except Exception:  # not a storage this front end can read: PyTorch's resize_ says what is wrong
            return
        if base:
            self.san.extent_release(base)

    def _coll_items(self, spec: OpSpec, roles: tuple, args: tuple, kwargs: dict | None, out: Any) -> list:
        items: list = []
        if not roles:
            return items
        is_dev = self._is_dev
        for role in roles:
            mode = role.mode
            tensors = flatten(role.value(args, kwargs, out, spec.multi), [])
            if mode == P2P:
                ops = _arg(spec, args, kwargs, "op_list") or ()
                modes = [READ if "send" in str(o) else WRITE for o in ops]
            elif mode < 0:
                modes = [self._rooted(spec, args, kwargs, mode)] * len(tensors)
            else:
                modes = [mode] * len(tensors)
            for t, m in zip(tensors, modes):
                if isinstance(t, Tensor) and is_dev(t):
                    it = _ITEM(t, m)
                    if it is not None:
                        items.append(it)
        return items

    @staticmethod
    def _rooted(spec: OpSpec, args: tuple, kwargs: dict | None, mode: int) -> int:
        """A rooted collective's mode for this rank (``BROADCAST``, ``REDUCE``); both ways, without
        the uninitialized-read check, where the rank or root cannot be told."""
        root = _arg(spec, args, kwargs, "root_rank")
        if root is None:
            root = _arg(spec, args, kwargs, "src")
        rank = None
        try:
            group = _arg(spec, args, kwargs, "process_group")
            if group is not None:
                if not hasattr(group, "rank"):  # the dispatcher's boxed form of a ProcessGroup
                    group = torch._C._distributed_c10d.ProcessGroup.unbox(group)
                rank = group.rank()
            else:
                name = _arg(spec, args, kwargs, "group_name")
                if name is not None:
                    from torch.distributed.distributed_c10d import _resolve_process_group
                    rank = _resolve_process_group(name).rank()
        except Exception:  # a group Python cannot ask: both ways
            rank = None
        if rank is None or root is None:
            return READ | WRITE | NO_INIT_CHECK
        if mode == BROADCAST:
            return READ if rank == root else WRITE
        return READ | WRITE if rank == root else READ  # REDUCE

    def _observed_collective(self, index: int, phase: int, args: tuple | None, outs: tuple | None, device: int,
                             sid: int) -> None:
        """The observer's collective: its start (phase 0), its end (1), or its failure (2)."""
        try:
            spec = self._obs_specs[index]
            if phase == 0:
                b = _Bracket(spec, self._obs_stream(device, sid), capture_stack())
                self._brackets.setdefault(threading.get_ident(), []).append(b)
                return
            stack = self._brackets.get(threading.get_ident())
            b = next((x for x in reversed(stack) if x.spec is spec), None) if stack else None
            if phase == 1 and outs is not None:
                out = outs[0] if len(outs) == 1 and not spec.multi else tuple(outs)
                self._coll_end(b, tuple(args or ()), None, out)
            else:
                self._coll_end(b, None, None, None)
        except IgnisError as e:
            self.pending.append(e)

    # -- CUDA graphs (``_graphs`` tells the front end of their capture and replays) ---------
    def graph_begin(self, graph: Any, stream: int) -> None:
        # CUDA graph trees (torch.compile's mode="reduce-overhead") keep their graphs' inputs
        # in place themselves, and check it: their replays are not checked for freed inputs.
        f, managed = sys._getframe(1), False
        while f is not None and not managed:
            managed = f.f_code.co_filename.endswith(("cudagraph_trees.py", "cudagraph_utils.py"))
            f = f.f_back
        graph.__dict__["_ignis_graph"] = self.san.capture_begin(stream, capture_stack(), managed)

    def graph_end(self, graph: Any, stream: int) -> None:
        if self.san.capture_end(stream) is None:
            graph.__dict__.pop("_ignis_graph", None)

    def graph_replay(self, graph: Any, stream: int) -> None:
        cap = graph.__dict__.get("_ignis_graph")
        if cap is not None:
            try:
                self.san.replay(cap, stream, capture_stack())
            except IgnisError as e:  # raise mode: found in PyTorch's call; the next op raises it
                self.pending.append(e)

    def graph_reset(self, graph: Any) -> None:
        graph.__dict__.pop("_ignis_graph", None)

    def pool_begin(self, device: Any, pool: Any) -> None:
        self.san.pool_begin()

    def pool_end(self, device: Any, pool: Any) -> None:
        self.san.pool_end()

    # -- Triton kernels ---------------------------------------------------------------
    def _triton_launch(self, kernel: Any, stream: Any, args: tuple) -> None:
        """A Triton kernel's launch (``_triton``): its tensor arguments' accesses on ``stream``."""
        roles = kernel.__dict__.get("_ignis_roles")
        if roles is None:  # (index, mode) of each argument that may be a buffer, found once per kernel
            src = getattr(kernel, "src", None)
            fn = getattr(src, "fn", None)
            names = list(getattr(fn, "arg_names", None) or [f"arg{i}" for i in range(len(args))])
            asm = getattr(kernel, "asm", None) or {}
            try:
                ttir = asm.get("ttir") if hasattr(asm, "get") else None
            except Exception:  # an IR Triton cannot give back here: every argument as unknown
                ttir = None
            roles = kernel.__dict__["_ignis_roles"] = tuple(
                (i, m) for i, m in enumerate(_triton.kernel_roles(names, ttir)) if m)
        items: list = []
        dev = None
        n = len(args)
        for i, mode in roles:
            a = args[i] if i < n else None
            if isinstance(a, Tensor) and self._is_dev(a):
                it = _ITEM(a, mode)
                if it is not None:
                    items.append(it)
                    dev = a
        if dev is None:
            return
        if stream is None or not isinstance(stream, int):
            stream = self.stream_of(dev)
        self._ops += 1
        try:
            self.san.foreign_access(stream, f"triton kernel {getattr(kernel, 'name', '?')}", capture_stack(), items)
        except IgnisError as e:  # (raise mode: Triton's launcher must not be unwound; the next op raises it)
            self.pending.append(e)

    def _install_triton(self, module: Any = None) -> None:
        _triton.install(self._triton_launch)
        # Inductor's generated modules run the kernels: a library's code, not the user's.
        for where in ("torch._inductor.runtime.cache_dir_utils", "torch._inductor.runtime.runtime_utils"):
            try:
                add_library_dir(importlib.import_module(where).cache_dir())
                break
            except Exception:  # (another Inductor: its default folder below)
                continue
        try:
            user = getpass.getuser()
        except Exception:  # (no user name here: Inductor's own folder then has another name)
            user = str(os.getuid())
        add_library_dir(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                        or os.path.join(tempfile.gettempdir(), "torchinductor_" + user))

    def declare(self, t: torch.Tensor, access: Access, stream: Any, op: str) -> None:
        """An access the dispatcher cannot see (``ignis.torch.use``)."""
        mode = (READ if access.reads else 0) | (WRITE if access.writes else 0)
        it = _ITEM(t, mode)
        if it is None:
            return
        h = self.stream_of(t) if stream is None else self._handle(stream)
        self._ops += 1
        self.san.foreign_access(h, op, capture_stack(), [it])

    # -- the observer's callbacks (called from C++, with the GIL, after each op) ------------
    def _obs_classify(self, name: str, overload: str) -> tuple:
        """(kind, index, inputs, outputs, returns, name) of an op the observer meets for the
        first time: kind 0 inactive, 1 passed through (a CompositeImplicitAutograd op without a
        kernel of this backend: its own ops are seen), 2 regular, 3 special, 4 record_stream;
        ``returns``: how many values its schema returns (none coming back means the op
        failed); ``name``: the op as reports name it."""
        ns, _, base = name.partition("::")
        try:
            op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
        except (AttributeError, RuntimeError):
            return (1, -1, (), (), 0, name)  # unknown here: what it runs is seen on its own
        if (op.has_kernel_for_dispatch_key("CompositeImplicitAutograd")
                and not op.has_kernel_for_dispatch_key("CUDA" if self._cuda else "CPU")):
            return (1, -1, (), (), 0, name)
        spec = classify(op)
        schema = getattr(op, "_schema", None)
        returns = len(schema.returns) if schema is not None else 0
        index = len(self._obs_specs)
        self._obs_specs.append(spec)
        if spec.special == "record_stream":
            return (4, index, (), (), returns, spec.name)  # handed over as integers
        if spec.special == "collective":
            return (5, index, (), (), returns, spec.name)
        if spec.special is not None:
            if spec.special == "to_copy":
                names = [a.name for a in op._schema.arguments]
                if "non_blocking" in names:
                    self._obs_nb[index] = names.index("non_blocking")
            if spec.special in ("copy", "to_copy"):  # between device tensors: a regular op's roles (C++)
                return (3, index, tuple((pos, mode, many) for pos, _, mode, many in spec.inputs), spec.outputs,
                        returns, spec.name)
            return (3, index, (), (), returns, spec.name)
        if not spec.active:
            return (0, index, (), (), returns, spec.name)
        return (2, index, tuple((pos, mode, many) for pos, _, mode, many in spec.inputs), spec.outputs, returns,
                spec.name)

    def _direct(self) -> tuple | None:
        """What the observer calls itself for a regular op (and record_stream), in place of
        ``_observed`` (``ignis_obs_start``'s ``direct``): None where ``_observed`` or
        ``_observed_special`` is replaced (a test or a benchmark watching each op)."""
        cls = TorchFrontEnd
        if (type(self)._observed is not cls._observed or type(self)._observed_special is not cls._observed_special
                or "_observed" in self.__dict__ or "_observed_special" in self.__dict__):
            return None
        return (self.san, capture_stack, self._obs_stream, self._raw_handle, self.pending, IgnisError,
                last_from_library)

    def _obs_stream(self, device: int, sid: int) -> int:
        """The raw handle of the stream the observer named (a CUDA stream's id on ``device``)."""
        return self._raw_handle(sid, device, 1) if self._cuda else self.stream_of(None)

    def _observed(self, index: int, items: bytes, host: bytes | None, device: int, sid: int, synced: bool) -> None:
        """A regular op's accesses, as the observer found them (``items`` on the device,
        ``host``: its host tensors' while pinned memory is tracked; both packed, as
        ``ignis.safety.sanitizer.pack_items`` packs them). An error cannot be raised into
        the op from here: in raise mode it waits in ``pending`` (``disable`` raises it)."""
        san = self.san
        try:
            spec = self._obs_specs[index]
            if host:
                pinned = san.pinned
                host = [it for it in unpack_items(host) if it[0] in pinned]
                if not items and not host:
                    self.cpu_ops += 1
                    return
            frames = capture_stack()
            if items:
                self._ops += 1
                san.foreign_access(self._obs_stream(device, sid), spec.name, frames, items, synced)
            if host:
                san.foreign_access(HOST, spec.name, frames, host)
        except IgnisError as e:
            self.pending.append(e)

    def _observed_special(self, index: int, args: tuple, out: Any, device: int, sid: int, synced: bool,
                          pre: tuple | None) -> None:
        """A special op, after it ran (``pre``: its first tensor's storage base and size
        before, for resize_). record_stream's ``args`` are integers: (the tensor's storage
        base, the stream's id, device index and device type)."""
        try:
            spec = self._obs_specs[index]
            if spec.special == "record_stream":
                base, stream_id, device_index, device_type = args
                self.san.extent_record_stream(base, self._raw_handle(stream_id, device_index, device_type))
                return
            if spec.special == "copy":
                nb = args[2] if len(args) > 2 else False
            else:
                pos = self._obs_nb.get(index)
                nb = args[pos] if pos is not None and pos < len(args) else False
            self._special_done(spec, args, nb, out, pre, bool(synced),
                               self._obs_stream(device, sid) if device >= 0 else None)
        except IgnisError as e:
            self.pending.append(e)

    # -- trace callbacks -------------------------------------------------------------
    def _guarded(self, fn: Callable) -> Callable:
        pending = self.pending

        def cb(*args: Any) -> None:
            try:
                fn(*args)
            except IgnisError as e:  # raise mode: PyTorch would swallow it; the next op raises it
                pending.append(e)
        return cb

    def _on_free(self, ptr: int) -> None:
        """The caching allocator's free: checked with the stream current here (see
        ``Sanitizer.extent_freed``)."""
        self.san.extent_freed(ptr, _raw_stream(torch._C._cuda_getDevice()))

    def _on_alloc(self, ptr: int) -> None:
        self.san.extent_allocated(ptr, _raw_stream(torch._C._cuda_getDevice()))

    # PyTorch's GPU trace registries, in the order of the observer's trace kinds.
    _TRACE_KINDS = ("EventCreationCallbacks", "EventDeletionCallbacks", "EventRecordCallbacks", "EventWaitCallbacks",
                    "MemoryAllocationCallbacks", "MemoryDeallocationCallbacks", "StreamCreationCallbacks",
                    "DeviceSynchronizationCallbacks", "StreamSynchronizationCallbacks",
                    "EventSynchronizationCallbacks")

    def _install_trace(self) -> None:
        import torch.cuda._gpu_trace as gt
        san = self.san
        self.trace_hooked = False
        table = [(gt.EventDeletionCallbacks, san.on_event_destroyed),
                 (gt.EventRecordCallbacks, self._on_event_record),  # (a collective's bracket notes them)
                 (gt.EventWaitCallbacks, self._on_event_wait),
                 (gt.MemoryAllocationCallbacks, self._on_alloc),
                 (gt.MemoryDeallocationCallbacks, self._on_free),
                 (gt.DeviceSynchronizationCallbacks, san.on_device_synchronize),
                 (gt.StreamSynchronizationCallbacks, san.on_stream_synchronize),
                 (gt.EventSynchronizationCallbacks, san.on_event_synchronize)]
        torch._C._activate_gpu_trace()  # process-wide, and it cannot be turned off again
        if self._obs is not None:
            # The observer reports each op's fresh outputs, and a caching-allocator block is
            # first touched as one: its lifetime starts there (the sanitizer's outputs_fresh),
            # so allocations need no handler. Frees keep theirs: a free is checked, with its
            # stack, where it happens.
            san.drain()  # (ops held since the observer started were seen with it as it was)
            san.outputs_fresh = True
            # Where the observer can take the trace below Python (its TraceShim), each event
            # goes straight to its handler here, and the events nothing here needs cost no
            # Python at all; the registries stay PyTorch's, for other listeners.
            mine = {r: fn for r, fn in table if r is not gt.MemoryAllocationCallbacks}
            mine[gt.MemoryDeallocationCallbacks] = san.extent_freed  # (pointer, current stream's handle)
            regs = [getattr(gt, n) for n in self._TRACE_KINDS]
            if self._obs.ignis_obs_trace_start(tuple(mine.get(r) for r in regs),
                                               tuple(r.callback_list for r in regs)) == 0:
                self._trace_shim = self.trace_hooked = True
                return
            # Else PyTorch's Python registries. An op in flight across a synchronization is
            # covered by it: each synchronization also moves the observer's epoch on.
            syncs = (gt.DeviceSynchronizationCallbacks, gt.StreamSynchronizationCallbacks,
                     gt.EventSynchronizationCallbacks)
            bump = self._obs.ignis_obs_synced
            table = [(r, _after(bump, fn) if r in syncs else fn) for r, fn in table
                     if r is not gt.MemoryAllocationCallbacks]
        for registry, fn in table:
            cb = self._guarded(fn) if san.mode == "raise" else fn  # collect mode never raises
            registry.add_callback(cb)
            self._callbacks.append((registry, cb))

    def _remove_trace(self) -> None:
        if self._trace_shim:
            self._trace_shim = False
            if self._obs is not None:
                self._obs.ignis_obs_trace_stop()
        for registry, cb in self._callbacks:
            try:
                registry.callback_list.remove(cb)
            except ValueError:
                pass
        self._callbacks.clear()
        self.san.outputs_fresh = False

    # -- control -------------------------------------------------------------------------
    def enable(self) -> None:
        """Start checking: the op observer (every thread) where it is asked for or, by
        default, in collect mode; else the dispatch mode (this thread, and the autograd
        engine's), which raises at the op. Both measure tensors with the observer library,
        built against this torch at first use: RuntimeError, saying why, where it cannot be
        built. Then subscribe to PyTorch's GPU trace."""
        if self._mode is not None or self._obs is not None:
            return
        _bind_native()
        add_library_dir(os.path.dirname(torch.__file__))
        engine = self.engine_asked or ("observer" if self.san.mode == "collect" else "mode")
        if engine == "observer":
            from ._native import observer
            lib = observer()  # (built: _bind_native)
            direct = self._direct()
            before = self.san._drainer
            if direct is not None:  # its calls into the sanitizer are made in batches: drained
                self.san.set_drainer(lib.ignis_obs_drainer())  # from its first (before it starts)
            rc = lib.ignis_obs_start(self._obs_classify, self._observed, self._observed_special, direct,
                                     1 if self._cuda else 0)
            if rc != 0:
                if direct is not None:
                    self.san.set_drainer(before)
                if rc == -1:
                    raise RuntimeError("ignis.torch: another front end observes PyTorch's ops already; disable it "
                                       "first")
                # (the direct path's callables were refused: a bug of this package)
                raise RuntimeError(f"ignis.torch: the op observer refused to start (status {rc})")
            lib.ignis_obs_set_collective(self._observed_collective)
            self._obs = lib
            if direct is not None:
                self._open_backward_windows()
        self.engine = engine
        if self._cuda and _raw_stream is not None:
            try:
                self._install_trace()
            except BaseException:  # nothing of it stays on
                self._remove_trace()
                if self._obs is not None:
                    self._close_backward_windows()
                    self._obs.ignis_obs_stop()
                    self.san.set_drainer(None)
                    self._obs = None
                raise
        if self._cuda and _raw_stream is not None:
            _graphs.add_listener(self)
            _hook.when_imported("triton", self._install_triton)
        _works.add_listener(self._on_work_completed)
        _queries.add_listeners(self._on_event_done, self._on_stream_done)
        _storage.add_listener(self._on_storage_resize)
        if engine == "mode":
            self._mode = _Mode(self)
            self._mode.__enter__()
            self._follow_threads()
            _ctc.install()
        self.san.notes.append(self.note)

    def _open_backward_windows(self) -> None:
        """Tell the op observer of each ``backward()`` call, with the user's stack there: the
        stack of every op and free the autograd engine's own threads run for it, which the
        observer then holds without the GIL (``_observer.cpp``: the backlog's C form). Through
        PyTorch's ``_engine_run_backward``, which ``torch.autograd.backward`` and ``grad`` call
        (by the name in both modules, as ``torch.compiler`` patches it); where it is not there,
        every call is the Python form, as before. A wrapper left over from an earlier session
        (something wrapped it after this front end, and put it back later) is passed over."""
        import torch.autograd as autograd
        import torch.autograd.graph as graph

        orig = getattr(graph, "_engine_run_backward", None)
        if orig is None or self._obs is None:
            return
        lib = self._obs
        win_open, win_close = lib.ignis_obs_window_open, lib.ignis_obs_window_close
        _at_exit_stop_checker(lib)
        stream_of = None if self._cuda else self.stream_of
        fe_ref = weakref.ref(self)  # (a wrapper left installed keeps no front end alive)
        real = orig
        while real in _backward_wrappers:  # (an earlier session's, still there: by identity, as a
            real = real.__wrapped__        # functools.wraps of it carries its attributes too)

        def run_backward(*args: Any, **kwargs: Any) -> Any:
            fe = fe_ref()
            mine = None if fe is None else fe._backward_windows
            if mine is None or mine[1] is not run_backward:  # (its session ended: a plain call)
                return real(*args, **kwargs)
            opened = 0
            try:
                try:
                    opened = win_open(capture_stack(), 1 if last_from_library() else 0,
                                      None if stream_of is None else stream_of(None))
                except Exception:  # (no window: the Python form, as before; the backward runs)
                    opened = 0
                return real(*args, **kwargs)
            finally:
                if opened:
                    win_close()

        run_backward.__wrapped__ = real  # type: ignore[attr-defined]
        run_backward.__doc__ = real.__doc__
        _backward_wrappers.add(run_backward)
        self._backward_windows = (orig, run_backward)
        graph._engine_run_backward = run_backward
        if getattr(autograd, "_engine_run_backward", None) is orig:
            autograd._engine_run_backward = run_backward

    def _close_backward_windows(self) -> None:
        """Put PyTorch's ``_engine_run_backward`` back (where it is still this front end's; a
        wrapper something else left installed makes plain calls from now on)."""
        if self._backward_windows is None:
            return
        import torch.autograd as autograd
        import torch.autograd.graph as graph

        orig, mine = self._backward_windows
        self._backward_windows = None
        for mod in (graph, autograd):
            if getattr(mod, "_engine_run_backward", None) is mine:
                mod._engine_run_backward = orig

    def _follow_threads(self) -> None:
        """The dispatch mode is entered per thread: enter it on every thread started from now on
        too, for as long as the thread runs (``threading.Thread.start`` wraps the thread's ``run``;
        ``ThreadPoolExecutor``'s and the DataLoader's threads are such threads), so their ops are
        checked as the observer checks every thread's. Threads already running are not seen."""
        fe = self
        real_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            run = thread.run

            def run_checked() -> None:
                if fe._mode is None:  # checking stopped before the thread began
                    return run()
                mode = _Mode(fe)
                mode.__enter__()
                fe._thread_modes.add(mode)
                try:
                    return run()
                finally:
                    fe._thread_modes.discard(mode)
                    mode.__exit__(None, None, None)

            thread.run = run_checked  # type: ignore[method-assign]
            return real_start(thread)

        start.__doc__ = real_start.__doc__
        threading.Thread.start = start  # type: ignore[method-assign]
        self._thread_start = (real_start, start)

    def _stop_following_threads(self) -> None:
        if self._thread_start is not None:
            real_start, start = self._thread_start
            if threading.Thread.start is start:  # (left alone if something wrapped it since)
                threading.Thread.start = real_start  # type: ignore[method-assign]
            self._thread_start = None
        for mode in list(self._thread_modes):  # threads still running go on unchecked
            mode.on = False

    def disable(self) -> None:
        """Stop the observer, or leave the dispatch mode (on the thread that entered it), and
        unsubscribe from the trace. With the observer in raise mode, the first problem it
        found is raised here."""
        mode = self._mode
        if mode is None and self._obs is None:
            return
        if mode is not None:
            if _get_current_dispatch_mode() is not mode:
                raise RuntimeError("ignis.torch: another TorchDispatchMode entered after the sanitizer is still "
                                   "active; leave it first")
            mode.__exit__(None, None, None)
            self._mode = None
            self._stop_following_threads()
            _ctc.uninstall()
        else:
            self._close_backward_windows()
            self._obs.ignis_obs_stop()  # (the calls it held are made first)
            self.san.set_drainer(None)
            self.cpu_ops += self._obs.ignis_obs_take_cpu_ops()
            self._ops += self._obs.ignis_obs_take_ops()
            self._obs = None
        self._remove_trace()
        _works.remove_listener(self._on_work_completed)
        _queries.remove_listeners(self._on_event_done, self._on_stream_done)
        _storage.remove_listener(self._on_storage_resize)
        self._fresh_works.clear()
        for key in [k for _, k in self._work_ends.values()] + self._dead_work_keys:
            self.san.on_event_destroyed(key)
        self._work_ends.clear()
        self._dead_work_keys.clear()
        _graphs.remove_listener(self)
        _hook.forget("triton")
        _triton.uninstall()
        if self.note in self.san.notes:
            self.san.notes.remove(self.note)
        if self.engine == "observer" and self.pending:
            raise self.pending.pop(0)  # found inside an op, where the observer cannot raise it

    def note(self) -> str:
        """The front end's line in the sanitizer's summary."""
        if self._obs is not None:  # the observer counts host-only ops itself
            self.cpu_ops += self._obs.ignis_obs_take_cpu_ops()
        if self.ops:
            how = {"observer": "the op observer", "mode": "the dispatch mode"}.get(self.engine or "", "")
            if how and self.trace_hooked:
                how += " and its GPU trace hook"
            line = f"PyTorch: {self.ops} op(s) on CUDA tensors checked" + (f" (seen by {how})" if how else "")
            if self.cpu_ops:
                line += f"; {self.cpu_ops} op(s) on CPU tensors only, which are not checked"
            return line
        if self.cpu_ops:
            return (f"PyTorch: no CUDA work seen: {self.cpu_ops} op(s) ran on the CPU, and nothing on the CPU "
                    "is checked")
        return "PyTorch: no ops seen"
