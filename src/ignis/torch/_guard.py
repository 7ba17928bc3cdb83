"""The debug guard under PyTorch and CuPy: Ignis as the framework's CUDA allocator.

What it does: every tensor PyTorch (or array CuPy) allocates on a GPU comes
from a ``DeferredGuardResource`` (``ignis.memory.guard``: the debug guard with
its checks run on the device in batches; canaries before and after, poison on
allocation and on free, a quarantine before reuse) over Ignis's
``PoolResource`` on that device, ordered on the framework's stream. Writes
past either end of a tensor, writes into a freed tensor and reads of
never-written memory (the poison pattern) become reports with the tensor's
size, tag, allocation site (Python frames) and the bytes found.

This module is the framework side; the guard itself (its records, checks,
batches, ready cache and reports) is the memory layer's, described there.

Design:
- PyTorch: ``torch.cuda.memory.CUDAPluggableAllocator`` loads the C entry
  points ``ignis_torch_alloc`` / ``ignis_torch_free`` of ``ignis.torch._guard_fast``;
  they take the GIL and run ``_alloc`` / ``_free`` there (a free of a guarded
  block first queues its poison from C, through the driver's
  ``cuMemsetD32Async`` / ``cuMemsetD8Async``, through the C entry points of
  ``ignis.backends._cudriver``, unless
  ``record_stream`` waits must come first). CuPy:
  ``cupy.cuda.set_allocator`` with a Python function over the same two.
  A stream handle is adopted once (``Stream.from_handle``; 0 is the legacy
  default stream). Pointer -> block is one dict.
- The hot path is compiled, once: the entry points and ``_alloc`` / ``_free``
  (``_guard_fast.pyx``) call the guard's compiled ``allocate_c`` / ``free_fast_c``
  (``ignis.memory.guard_base``). This module has the rest (options, installation,
  the reports list, PyTorch's hooks).
- Synchronize points (PyTorch's GPU trace: device / stream / event
  synchronize) queue the pending batches, read finished ones, and at most
  every ``sync_check_interval`` seconds check the guards of every live block.
  ``check()`` checks everything now and waits.
- ``record_stream``: PyTorch's pluggable allocator ignores it, so the aten op
  ``record_stream`` gets a CUDA kernel here (``torch.library``; no cost for
  any other op). The streams it names are kept with the block; at the free,
  an event recorded on each and waited on by the allocation stream orders the
  poison, the checks and any reuse after the work queued there (PyTorch's
  rule). The op front end may call ``note_record_stream`` as well.
- Reports go to the sanitizer's list when it collects (``ignis run --guard
  --sanitize`` prints one list), else to this module's list, grouped the same
  way (kind, side and allocation site, with a count). A report found inside
  a free cannot be raised there: ``check()`` raises the first problem found
  since the previous ``check()``.

Limits (documented, not hidden): a write through a stale pointer after the
block left the quarantine and was reused is the new owner's (no tool at this
level can tell); a batch's results arrive after the batch ran, so a report
"on free" comes at the next poll, synchronize point or ``check()``; CuPy has
no per-kernel launch hook, so races in CuPy kernels are seen by the sanitizer
only where the program declares its accesses (``ig.launch`` or the tracked
``use()`` API); out-of-bounds writes and writes after free in them are found
all the same (they damage canaries and poison).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, Callable

from ..errors import IgnisError
from ..memory.guard import MAX_BATCH as _CAP, DeferredGuardResource
from ..memory.pool import PoolResource
from ..runtime import Device, Stream
from ..safety.frames import add_library_dir, sites
from . import _guard_fast as _fast
from ._guard_fast import _alloc, _drain_deferred, _free, _s

__all__ = ["DeferredGuardResource", "GuardError", "use_guard", "use_cupy_guard", "install_on_import", "check",
           "reports", "clear_reports", "summary", "finish", "is_installed", "guard_resource", "guards",
           "note_record_stream", "guard_stats", "DEFAULTS"]


class GuardError(IgnisError):
    """The guard cannot be installed as asked (too late, no extension, wrong backend, bad option)."""


DEFAULTS: dict[str, Any] = {
    "canary_bytes": 256,            # per side, rounded up to 256
    "poison": 0xA5,
    "canary": 0xFD,
    "quarantine_count": 256,        # freed blocks held before reuse
    "quarantine_bytes": 256 << 20,
    "capture_stacks": True,         # the allocation site of every tensor (cheap: code objects and lines)
    "stack_depth": 6,
    "batch": 128,                   # jobs per check batch on a stream
    "ready_limit": 64 << 20,        # bytes of checked blocks kept for reuse on their stream (0: none)
    "sync_check_interval": 0.05,    # seconds between live-guard checks at synchronize points (None: never)
    "record_stream": True,          # learn of Tensor.record_stream (PyTorch)
    "patch_memory_stats": True,     # torch.cuda.memory_stats & friends answer with Ignis's statistics
    "tag": None,                    # the blocks' tag (default: "torch" / "cupy")
}


def _options(opts: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(opts) - set(DEFAULTS))
    if unknown:
        raise GuardError(f"unknown guard option(s) {', '.join(unknown)}; the options are {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **opts}
    b = out["batch"]
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= _CAP:
        raise GuardError(f"batch must be an int from 1 to {_CAP}, got {b!r}")
    d = out["stack_depth"]
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 64:
        raise GuardError(f"stack_depth must be an int from 1 to 64, got {d!r}")
    iv = out["sync_check_interval"]
    if iv is not None and (isinstance(iv, bool) or not isinstance(iv, (int, float)) or iv < 0):
        raise GuardError(f"sync_check_interval must be a number of seconds >= 0, or None, got {iv!r}")
    if out["tag"] is not None and not isinstance(out["tag"], str):
        raise GuardError(f"tag must be a str, got {out['tag']!r}")
    try:  # the guard's own checks (byte values, counts), once, up front
        _validate_guard_args(out)
    except ValueError as e:
        raise GuardError(str(e)) from None
    return out


def _validate_guard_args(o: dict[str, Any]) -> None:
    for name in ("poison", "canary"):
        v = o[name]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFF:
            raise ValueError(f"{name} must be a byte value 0..255, got {v!r}")
    for name in ("canary_bytes", "quarantine_count", "quarantine_bytes", "ready_limit"):
        v = o[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    if o["poison"] == o["canary"] and o["canary_bytes"]:
        raise ValueError(f"poison and canary must differ (both {o['poison']:#04x}), or a write of one would "
                         "pass for the other")


# -- the resource -----------------------------------------------------------------------------------
# -- the front end's state ------------------------------------------------------------------------
_LEGACY = 1  # CU_STREAM_LEGACY: what PyTorch's and CuPy's default stream handle 0 means


def _configure(opts: dict[str, Any]) -> dict[str, Any]:
    with _s.lock:
        if _s.opts is None:
            _s.opts = _options(opts)
            _s.tag = _s.opts["tag"] or "torch"
        elif opts and _options(opts) != _s.opts:
            raise GuardError("the guard is installed already, with other options; one set of options per process "
                             f"(now: {_public(_s.opts)})")
        return _s.opts


def _public(o: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in o.items())


def guard_resource(device: "Device | int" = 0) -> DeferredGuardResource:
    """The guard of ``device`` (made on first use: a DeferredGuardResource over a new
    PoolResource there, also made the device's current Ignis resource, so Ignis's
    statistics, snapshots and Ignis arrays share it)."""
    dev = device if isinstance(device, Device) else Device(device)
    g = _s.guards.get(dev.ordinal)
    if g is not None and g._context_alive():
        return g
    with _s.lock:
        g = _s.guards.get(dev.ordinal)
        if g is None or not g._context_alive():
            from ..memory import set_current_resource
            from ..memory.current import default_upstream
            o = _s.opts if _s.opts is not None else _configure({})
            g = DeferredGuardResource(
                PoolResource(default_upstream(dev)), batch=o["batch"], stack_depth=o["stack_depth"],
                ready_limit=o["ready_limit"],
                canary_bytes=o["canary_bytes"], poison=o["poison"], canary=o["canary"],
                quarantine_count=o["quarantine_count"], quarantine_bytes=o["quarantine_bytes"],
                capture_stacks=o["capture_stacks"])
            g.on_problem = _emit
            _s.guards[dev.ordinal] = g
            set_current_resource(g, device=dev)
        return g


def guards() -> dict[int, DeferredGuardResource]:
    """The guards made so far, by device ordinal."""
    return dict(_s.guards)


def _stream(device: int, handle: int, owner: Any = None) -> Stream:
    """The Ignis stream for a framework's stream handle (adopted once). ``owner``: the
    framework's stream object, kept alive as long as the Ignis stream is (CuPy destroys
    a stream's handle when its object goes; the guard's poison and checks still run on
    it after the array's free)."""
    key = (device, handle)
    s = _s.streams.get(key)
    if s is not None and s._generation == s.device.state.generation:
        return s
    dev = Device(device)
    if handle == 0:
        s = Stream.from_handle(_LEGACY, dev) if dev.backend.cuda_driver else dev.default_stream
    else:
        s = Stream.from_handle(handle, dev, owner=owner)
    _s.streams[key] = s
    return s


def _on_sync(*_args: Any) -> None:
    """A synchronize point (PyTorch's GPU trace callback)."""
    if getattr(_s.tls, "busy", False) or not _s.guards:
        return
    iv = _s.opts["sync_check_interval"] if _s.opts else None
    now = time.monotonic()
    live = iv is not None and now - _s.last_live >= iv
    if live:
        _s.last_live = now
    _s.tls.busy = True
    try:
        for g in list(_s.guards.values()):
            try:
                g.on_sync(live)
            except Exception as e:  # never break the program's synchronize
                print(f"ignis guard: a check at a synchronize point failed: {type(e).__name__}: {e}",
                      file=sys.stderr)
    finally:
        _s.tls.busy = False
        if _s.deferred:
            _drain_deferred()


# -- reports ---------------------------------------------------------------------------------------
def _key(err: IgnisError) -> tuple:
    return ("guard", type(err).__name__, getattr(err, "side", None), getattr(err, "nbytes", None),
            getattr(err, "tag", None), sites(getattr(err, "frames", None)))


def _emit(err: IgnisError) -> None:
    """Where every problem the guards find goes: the sanitizer's list when it collects
    (one list for ``--guard --sanitize``), else this module's, grouped the same way."""
    from ..safety.sanitizer import sanitizer as san
    key = _key(err)
    if san.active and san.mode == "collect":
        san._report(err, key)
        return
    with _s.lock:
        g = _s.groups.get(key)
        if g is not None:
            g.count = getattr(g, "count", 1) + 1  # type: ignore[attr-defined]
            return
        err.count = 1  # type: ignore[attr-defined]
        _s.groups[key] = err
        _s.problems.append(err)


def reports() -> list[IgnisError]:
    """The problems found so far (those not sent to the sanitizer's list), grouped."""
    with _s.lock:
        return list(_s.problems)


def clear_reports() -> list[IgnisError]:
    with _s.lock:
        out, _s.problems, _s.groups = _s.problems, [], {}
        return out


def summary(failed_steps: int = 0) -> str:
    """What the guards checked and found (this module's list); ``failed_steps``: steps of a
    final check that failed (``finish``), which leave the run unable to say all is well."""
    jobs = sum(g._checker.jobs for g in _s.guards.values())
    probs = reports()
    lines = []
    if failed_steps:
        lines.append(f"ignis guard: {failed_steps} step(s) of the final check failed (above): what they were "
                     "to check is unchecked")
    if not probs:
        if not failed_steps:
            lines.append(f"ignis guard: no problems found ({jobs} checks of {_count_allocs()} allocations)")
    else:
        total = sum(getattr(e, "count", 1) for e in probs)
        lines.append(f"ignis guard: {len(probs)} problem(s) found ({total} report(s), grouped by kind and "
                     "allocation site)")
        for i, e in enumerate(probs, 1):
            n = getattr(e, "count", 1)
            lines.append(f"--- {i}: {type(e).__name__}{f' (seen {n} times)' if n > 1 else ''}: {e}")
    note = _graph_note()
    if note:
        lines.insert(1, note)
    return "\n".join(lines)


def _count_allocs() -> int:
    return sum(g.reused + g.resized + g.formatted_fresh for g in _s.guards.values())


def check(*, raise_: bool = True) -> list[IgnisError]:
    """Check every guard now (live blocks' canaries, quarantined blocks' poison), wait
    for every check queued so far, and return the problems found since the previous
    ``check()``; with ``raise_`` (the default) raise the first of them instead."""
    found: list[IgnisError] = []
    for g in list(_s.guards.values()):
        found += g.check(raise_=False)
    if found and raise_:
        err = found[0]
        err.others = found[1:]
        raise err
    return found


def finish(out: Any = None) -> int:
    """At the end of a run: flush every quarantine and check everything; print this
    module's reports (``out``, default stderr). Each step runs whatever the one before
    did: a step that fails is reported and counted as a problem (the run cannot say
    nothing was found), and the next one still runs. Returns the number of problems in
    this module's list (the sanitizer's are its own) plus the steps that failed."""
    out = out or sys.stderr
    failed = 0
    for g in list(_s.guards.values()):
        for step, run in (("flush of the quarantine", g.flush), ("check", g.check)):
            try:
                run(raise_=False)
            except Exception as e:
                failed += 1
                print(f"ignis guard: the final {step} on device {g.device.ordinal} failed (counted as a "
                      f"problem: what it was to check is unchecked): {type(e).__name__}: {e}", file=out)
    if _s.guards or _s.problems:
        print(summary(failed), file=out)
    global _printed
    _printed = len(reports())
    return _printed + failed


_printed = 0  # problems the report of ``finish`` showed (exit prints only newer ones)


def _print_at_exit() -> None:
    try:
        if _s.guards:
            for g in list(_s.guards.values()):
                g.check(raise_=False)
        if len(reports()) > _printed:  # (what finish() showed is not printed twice)
            print(summary(), file=sys.stderr)
    except Exception:
        pass


def is_installed() -> dict[str, bool]:
    return {"torch": _s.torch, "cupy": _s.cupy}


def guard_stats(device: "Device | int" = 0) -> dict[str, int] | None:
    """The guard's own numbers for ``device`` (live user bytes, quarantine, the ready cache,
    checks), under
    ``guard.*`` keys; None while the device has no guard. ``ignis.telemetry`` adds them to
    its statistics of the guard when it answers ``torch.cuda.memory_stats``."""
    g = _s.guards.get(device.ordinal if isinstance(device, Device) else int(device))
    if g is None:
        return None
    return {"guard.live_bytes": g.bytes_outstanding, "guard.quarantined_bytes": g.quarantined_bytes,
            "guard.ready_bytes": g._ready_bytes, "guard.checks": g._checker.jobs, "guard.batches": g._checker.batches,
            "guard.allocs_reusing_checked_blocks": g.reused, "guard.allocs_resizing_checked_blocks": g.resized}


def note_record_stream(ptr: int, handle: int, device: int | None = None) -> bool:
    """``Tensor.record_stream``: the block holding ``ptr`` (its allocation's base) is used
    on the stream ``handle``; its free will wait for that stream. For the op front end
    and the aten kernel below. False when ``ptr`` is not a live guarded block."""
    blk = _s.blocks.get(ptr)
    if blk is None:
        return False
    dev = blk.alloc_stream.device.ordinal if device is None else device
    g = _s.guards.get(dev)
    if g is None:
        return False
    g.note_record_stream(blk, _stream(dev, handle))
    _s.rs_ptrs.add(ptr)
    return True


# -- PyTorch ---------------------------------------------------------------------------------------
def use_guard(**options: Any) -> None:
    """Install Ignis's debug guard as PyTorch's CUDA allocator (and nothing else).

    Call before PyTorch initializes CUDA (its first CUDA tensor). Options (all keyword):
    ``canary_bytes``, ``poison``, ``canary``, ``quarantine_count``, ``quarantine_bytes``,
    ``capture_stacks``, ``stack_depth``, ``batch``, ``ready_limit``, ``sync_check_interval``,
    ``record_stream``, ``patch_memory_stats``, ``tag``. Idempotent with the same options."""
    import torch

    opts = _configure(options)
    with _s.lock:
        if _s.torch:
            return
        if not hasattr(torch._C, "_cuda_customAllocator"):
            raise GuardError(f"this PyTorch ({torch.__version__}) is built without CUDA: there is no CUDA "
                             "allocator to replace")
        if torch.cuda.is_initialized():
            raise GuardError(
                "ignis.torch.use_guard() came too late: PyTorch has initialized CUDA already (a CUDA tensor, "
                "torch.cuda.synchronize(), ...) and its caching allocator can no longer be replaced. Call it "
                "at the top of the program, before any CUDA work, or run the unmodified script with "
                "`ignis run --guard script.py`")
        if opts["patch_memory_stats"]:
            _memory_views()  # refused here, before anything is swapped
        from ..backends import get_backend
        if not get_backend().cuda_driver:
            raise GuardError(f"the guard under PyTorch needs Ignis's cuda backend (the active backend is "
                             f"{get_backend().name}); unset IGNIS_BACKEND or set it to cuda")
        entry_points = _driver_entry_points()  # before anything is swapped
        mod = _fast
        mod.torch_guard_bind(_alloc, _free)
        alloc = torch.cuda.memory.CUDAPluggableAllocator(mod.__file__, "ignis_torch_alloc", "ignis_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            mod.torch_guard_bind(None, None)
            raise GuardError(f"ignis.torch.use_guard() came too late: PyTorch refused to swap its allocator "
                             f"({e}). Call it before any CUDA work, or use `ignis run --guard`") from e
        _s.saved["allocator"] = alloc  # keeps the library's handle alive
        _s.torch = True
        _s.current_stream = torch._C._cuda_getCurrentRawStream
        _bind_poison(mod, opts, entry_points)
        add_library_dir(os.path.dirname(torch.__file__))
        if opts["record_stream"]:
            _hook_record_stream(torch)
        _hook_syncs(torch)
        _hook_graphs(torch)
        if opts["patch_memory_stats"]:
            _patch_memory_views(torch)
        _at_exit()


def _driver_entry_points() -> dict[str, int]:
    """The C entry points the C free's poison calls: the active backend's (the cuda backend's
    ``direct_calls().entry_points``: ``ignis.backends._cudriver``, over the driver's own
    functions, without which that backend does not start). GuardError where they are missing."""
    from ..backends import get_backend
    b = get_backend()
    try:
        dc = b.direct_calls()
        ep = dict(getattr(dc, "entry_points", None) or {})
    except Exception:  # noqa: BLE001 - a backend without them: said below
        ep = {}
    missing = [n for n in ("cuMemsetD8Async", "cuMemsetD32Async", "cuCtxGetDevice") if not ep.get(n)]
    if missing:
        raise GuardError(f"the guard under PyTorch needs the driver entry points {', '.join(missing)} from the "
                         f"active backend ({b.name}), which does not give them; Ignis's cuda backend gives them "
                         "(ignis.backends._cudriver): unset IGNIS_BACKEND or set it to cuda")
    return ep


def _bind_poison(mod: Any, opts: dict[str, Any], entry_points: dict[str, int]) -> None:
    """Let the C free queue the poison itself (cuMemsetD32Async over the aligned words,
    cuMemsetD8Async for an unaligned head or tail, on the device cuCtxGetDevice names: the C
    entry points of ``ignis.backends._cudriver``, which call the driver's functions; no
    Python call): the common case of a free then costs one driver call."""
    mod.torch_guard_poison(entry_points["cuMemsetD8Async"], entry_points["cuCtxGetDevice"], opts["poison"],
                           _s.blocks, _s.rs_ptrs, entry_points["cuMemsetD32Async"])


def _at_exit() -> None:
    if not _s.atexit:
        atexit.register(_print_at_exit)
        _s.atexit = True


def _hook_record_stream(torch: Any) -> None:
    import warnings

    def record_stream(self: Any, s: Any) -> None:
        handle = torch.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index,
                                   device_type=s.device_type).cuda_stream
        note_record_stream(self.untyped_storage().data_ptr(), handle, s.device_index)

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl("record_stream", record_stream, "CUDA")
    _s.lib = lib


# -- CUDA graphs ----------------------------------------------------------------------------------
_graph_new = [0, 0]  # graph memory the guard made: allocations, bytes (none of it is guarded)


def _graph_memory(device: int, size: int) -> int:
    """New device memory for a CUDA graph's pool (``_State.graph_alloc``), taken while its stream
    captures: the driver's allocation, in the relaxed capture mode (as PyTorch's own allocator
    does), so that a capture does not refuse it."""
    from cuda.bindings import driver as cu
    n = max(512, (int(size) + 511) // 512 * 512)
    err, old = cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        err, ptr = cu.cuMemAlloc(n)
    finally:
        cu.cuThreadExchangeStreamCaptureMode(old)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise GuardError(f"allocating {n} bytes for a CUDA graph's pool on device {device} failed: {err.name}")
    _graph_new[0] += 1
    _graph_new[1] += n
    return int(ptr)


class _GraphListener:
    """The guard's part in a CUDA graph's capture (``_graphs``): while a stream captures, what it
    allocates is its graph pool's memory, unguarded (see ``_guard_fast._State``)."""

    def graph_begin(self, graph: Any, stream: int) -> None:
        import torch
        dev = torch.cuda.current_device()
        graph.__dict__["_ignis_guard_device"] = dev
        from ._graphs import pool_of
        _fast.graph_begin(dev, stream, pool_of(graph))

    def graph_end(self, graph: Any, stream: int) -> None:
        dev = graph.__dict__.pop("_ignis_guard_device", None)
        if dev is not None:
            _fast.graph_end(dev, stream)

    def graph_replay(self, graph: Any, stream: int) -> None:
        pass

    def graph_reset(self, graph: Any) -> None:
        pass

    def pool_begin(self, device: Any, pool: Any) -> None:
        pass  # (graph trees, the user of these outside a capture, are off under the guard)

    def pool_end(self, device: Any, pool: Any) -> None:
        pass


_GRAPHS = _GraphListener()


def _no_graph_trees(config: Any) -> None:
    """Under the guard, torch.compile's CUDA graph trees are off: they ask the allocator about its
    pools (checkPoolLiveAllocations, checkpoint states), which an allocator PyTorch lets Ignis
    install cannot answer; ``mode="reduce-overhead"`` then captures each graph with a private pool
    of its own (that path the guard serves)."""
    if getattr(config.triton, "cudagraph_trees", False):
        config.triton.cudagraph_trees = False
        _graph_trees_off[0] = True


_graph_trees_off = [False]


def _graph_note() -> str:
    """The summary's line on what CUDA graphs left unguarded ("" when no graph was captured)."""
    if not _graph_new[0] and not _graph_trees_off[0]:
        return ""
    parts = []
    if _graph_new[0]:
        parts.append(f"{_graph_new[0]} allocation(s) ({_graph_new[1] / 2**20:.1f} MiB) of CUDA graphs' pools were "
                     "not guarded (a graph's memory is written by its replays: no canaries, no poison)")
    if _graph_trees_off[0]:
        parts.append("torch.compile's CUDA graph trees were off (mode='reduce-overhead' captured each graph with "
                     "a pool of its own)")
    return "ignis guard: " + "; ".join(parts)


def _hook_graphs(torch: Any) -> None:
    from . import _graphs, _hook
    _s.graph_alloc = _graph_memory
    _graphs.add_listener(_GRAPHS)
    _hook.when_imported("torch._inductor.config", _no_graph_trees)


def _hook_syncs(torch: Any) -> None:
    from torch.cuda import _gpu_trace as gt
    torch._C._activate_gpu_trace()
    for reg in (gt.register_callback_for_device_synchronization, gt.register_callback_for_stream_synchronization,
                gt.register_callback_for_event_synchronization):
        reg(_on_sync)


def _memory_views() -> Callable[[Any], dict[str, Callable[..., Any]]]:
    from . import memory_views
    if memory_views is None:
        raise GuardError("patch_memory_stats needs ignis.telemetry, which is not imported (import ignis first); "
                         "or pass patch_memory_stats=False")
    return memory_views


def _patch_memory_views(torch: Any) -> None:
    """``torch.cuda.memory_stats`` and the functions built on it (memory_allocated,
    max_memory_allocated, memory_reserved, memory_summary, ...) raise under a pluggable
    allocator; answer them with Ignis's statistics of the guard, and the snapshot
    functions with Ignis's snapshot (PyTorch's memory viewer format). The answers are
    telemetry's (a layer above this one), which left them in ``ignis.torch.memory_views``."""
    mem = torch.cuda.memory
    for name, fn in _memory_views()(torch).items():
        for owner in (mem, torch.cuda):
            if hasattr(owner, name):
                _s.saved[f"{owner.__name__}.{name}"] = getattr(owner, name)
                setattr(owner, name, fn)


# -- CuPy ------------------------------------------------------------------------------------------
class _CupyHold:
    """What CuPy keeps for one allocation; frees it through the guard when CuPy lets go."""

    __slots__ = ("ptr", "size", "device", "handle")

    def __init__(self, ptr: int, size: int, device: int, handle: int) -> None:
        self.ptr, self.size, self.device, self.handle = ptr, size, device, handle

    def __del__(self) -> None:
        try:
            _free(self.ptr, self.size, self.device, self.handle)
        except Exception:
            pass


def _cupy_allocator(cupy: Any) -> Callable[[int], Any]:
    def allocate(nbytes: int) -> Any:
        dev = cupy.cuda.runtime.getDevice()
        if nbytes <= 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev), 0)
        stream = cupy.cuda.get_current_stream()
        handle = stream.ptr
        ptr = _alloc(nbytes, dev, handle, "cupy", None if handle == 0 else stream)
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, _CupyHold(ptr, nbytes, dev, handle), dev)
        return cupy.cuda.MemoryPointer(mem, 0)

    return allocate


def use_cupy_guard(**options: Any) -> None:
    """Install Ignis's debug guard as CuPy's allocator (``cupy.cuda.set_allocator``).
    Arrays allocated before keep their old allocator. Options as ``use_guard``."""
    import cupy

    _configure(options)
    with _s.lock:
        if _s.cupy:
            return
        from ..backends import get_backend
        if not get_backend().cuda_driver:
            raise GuardError(f"the guard under CuPy needs Ignis's cuda backend (the active backend is "
                             f"{get_backend().name})")
        cupy.cuda.set_allocator(_cupy_allocator(cupy))
        _s.cupy = True
        add_library_dir(os.path.dirname(cupy.__file__))
        _at_exit()


# -- install when the program imports the framework (``ignis run --guard``) ------------------------
class _AfterImport:
    """A meta-path finder that runs ``then(module)`` once a named top-level module is imported."""

    def __init__(self, names: dict[str, Callable[[Any], None]]) -> None:
        self.names = names
        self.busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        then = self.names.get(fullname)
        if then is None or self.busy:
            return None
        self.busy = True  # other finders may look the name up again (another post-import hook)
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        names = self.names

        class _Loader:
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                module.__loader__ = loader
                if module.__spec__ is not None:
                    module.__spec__.loader = loader
                fn = names.pop(fullname, None)
                if fn is not None:
                    fn(module)
                if not names:
                    _remove_finders()

        spec.loader = _Loader()
        return spec


def _remove_finders() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def _reset() -> None:
    """Forget every guard, hook and report (for tests; PyTorch's allocator cannot be
    swapped back, so this is for processes that never installed it). Blocks still
    live stay valid; their frees are dropped."""
    from ..memory import get_current_resource, set_current_resource
    _remove_finders()
    with _s.lock:
        if not _s.torch:
            _fast.torch_guard_bind(None, None)
            _fast.torch_guard_poison(0, 0, -1, None, None)
        for ordinal, g in list(_s.guards.items()):
            try:
                g.close()
            except Exception:
                pass
            try:
                if get_current_resource(ordinal) is g:
                    set_current_resource(None, ordinal)
            except Exception:
                pass
        torch_on = _s.torch
        _s.__init__()
        _s.torch = torch_on


def install_on_import(*, torch: bool = True, cupy: bool = True, **options: Any) -> list[str]:
    """For ``ignis run --guard``: install the guard into PyTorch and CuPy now if they are
    imported already, else as soon as the program imports them (a program that imports
    neither pays nothing). Returns what was installed now. Problems installing later
    (CUDA already initialized, no CUDA build) are printed, never raised into the import."""
    _configure(options)
    now: list[str] = []
    wanted: dict[str, Callable[[Any], None]] = {}

    def torch_then(_m: Any) -> None:
        try:
            # A CPU build, or no GPU: the program cannot allocate CUDA memory, nothing to guard.
            if hasattr(_m._C, "_cuda_customAllocator") and _m.cuda.is_available():
                use_guard()
        except GuardError as e:
            print(f"ignis guard: not installed into PyTorch: {e}", file=sys.stderr)

    def cupy_then(_m: Any) -> None:
        try:
            use_cupy_guard()
        except (GuardError, ImportError) as e:
            print(f"ignis guard: not installed into CuPy: {e}", file=sys.stderr)

    for name, on, then in (("torch", torch, torch_then), ("cupy", cupy, cupy_then)):
        if not on:
            continue
        if name in sys.modules:
            then(sys.modules[name])
            now.append(name)
        else:
            wanted[name] = then
    if wanted:
        sys.meta_path.insert(0, _AfterImport(wanted))
    return now


_fast._setup(guard_resource, _stream)  # the compiled front end's slow paths
