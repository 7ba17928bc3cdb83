"""The debug guard as PyTorch's CUDA allocator: the PyTorch adapter of the guard's front.

The guard and its front are the lower layers' (``ignis.memory.guard``: canaries, poison,
quarantine, the checks run on the device in batches, one report path;
``ignis.memory.guard_front``: one guard per device, the options, the reports, the checks at
synchronize points; ``ignis.memory.guard_alloc``: the compiled allocate and free). This
module only installs them as PyTorch's allocator and tells them what PyTorch alone knows:

- ``torch.cuda.memory.CUDAPluggableAllocator`` loads the C entry points
  ``ignis_torch_alloc`` / ``ignis_torch_free`` of ``ignis.torch._guard_fast``; they take
  the GIL and run the front's compiled allocate / free (a free of a guarded block first
  queues its poison from C, through the driver's ``cuMemsetD32Async`` /
  ``cuMemsetD8Async``, through the C entry points of ``ignis.backends._cudriver``, unless
  ``record_stream`` waits must come first).
- Synchronize points (PyTorch's GPU trace: device / stream / event synchronize) call the
  front's ``on_sync``.
- ``record_stream``: PyTorch's pluggable allocator ignores it, so the aten op
  ``record_stream`` gets a CUDA kernel here (``torch.library``; no cost for any other op),
  which tells the front (``note_record_stream``). The op front end may tell it as well.
- CUDA graphs: while a stream captures, what it allocates is its graph pool's memory,
  unguarded (``_GraphListener``); torch.compile's CUDA graph trees are off under the guard.
- ``torch.cuda.memory_stats`` and its friends answer with Ignis's statistics of the guard
  (telemetry's answers, which it leaves in ``ignis.torch.memory_views``).
- ``install_on_import`` (``ignis run --guard``): PyTorch's and CuPy's adapters installed as
  soon as the program imports either framework.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from ..memory.guard import DeferredGuardResource
from ..memory import guard_alloc, guard_front as _front
from ..safety.frames import add_library_dir
from ..memory.guard_alloc import alloc as _alloc, free as _free, state as _s
from ..memory.guard_front import (DEFAULTS, GuardError, check, clear_reports, finish, guard_resource, guard_stats,
                                  guards, is_installed, note_record_stream, reports, summary)
from . import _guard_fast as _fast

__all__ = ["DeferredGuardResource", "GuardError", "use_guard", "install_on_import", "check",
           "reports", "clear_reports", "summary", "finish", "is_installed", "guard_resource", "guards",
           "note_record_stream", "guard_stats", "DEFAULTS"]

# The front's names by the names this module's callers (tests, diagnostics) know them by.
_configure = _front.configure
_stream = _front.stream_for
_on_sync = _front.on_sync


# -- PyTorch ---------------------------------------------------------------------------------------
def use_guard(**options: Any) -> None:
    """Install Ignis's debug guard as PyTorch's CUDA allocator (and nothing else).

    Call before PyTorch initializes CUDA (its first CUDA tensor). Options (all keyword):
    ``canary_bytes``, ``poison``, ``canary``, ``quarantine_count``, ``quarantine_bytes``,
    ``capture_stacks``, ``stack_depth``, ``batch``, ``ready_limit``, ``sync_check_interval``,
    ``record_stream``, ``patch_memory_stats``, ``tag``. Idempotent with the same options."""
    import torch

    opts = _front.configure(options)
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
        _s.use_framework("torch")
        _s.bind(current_stream=torch._C._cuda_getCurrentRawStream)
        _bind_poison(mod, opts, entry_points)
        add_library_dir(os.path.dirname(torch.__file__))
        if opts["record_stream"]:
            _hook_record_stream(torch)
        _hook_syncs(torch)
        _hook_graphs(torch)
        from . import _hook
        _hook.when_imported("torch.backends.cudnn", _no_cudnn_benchmark)
        if opts["patch_memory_stats"]:
            _patch_memory_views(torch)
        _front.print_at_exit()


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
    _s.bind(lib=lib)


# -- CUDA graphs ----------------------------------------------------------------------------------
_graph_new = [0, 0]  # graph memory the guard made: allocations, bytes (none of it is guarded)


def _graph_memory(device: int, size: int) -> int:
    """New device memory for a CUDA graph's pool (``guard_alloc.State.graph_alloc``), taken while its stream
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
    allocates is its graph pool's memory, unguarded (see ``ignis.memory.guard_alloc.State``)."""

    def graph_begin(self, graph: Any, stream: int) -> None:
        import torch
        dev = torch.cuda.current_device()
        graph.__dict__["_ignis_guard_device"] = dev
        from ._graphs import pool_of
        guard_alloc.graph_begin(dev, stream, pool_of(graph))

    def graph_end(self, graph: Any, stream: int) -> None:
        dev = graph.__dict__.pop("_ignis_guard_device", None)
        if dev is not None:
            guard_alloc.graph_end(dev, stream)

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
    """The summary's line on what CUDA graphs left unguarded, and what the guard changed in
    PyTorch's settings ("" when neither: no graph captured, no autotuner asked for)."""
    parts = []
    if _graph_new[0]:
        parts.append(f"{_graph_new[0]} allocation(s) ({_graph_new[1] / 2**20:.1f} MiB) of CUDA graphs' pools were "
                     "not guarded (a graph's memory is written by its replays: no canaries, no poison)")
    if _graph_trees_off[0] and _graph_new[0]:  # (the setting alone, with no graph captured, changed nothing)
        parts.append("torch.compile's CUDA graph trees were off (mode='reduce-overhead' captured each graph with "
                     "a pool of its own)")
    if _cudnn_asked[0]:
        parts.append("cuDNN's autotuner (torch.backends.cudnn.benchmark = True) was off: it asks the allocator "
                     "for its largest free block, which an allocator PyTorch lets Ignis install cannot answer; "
                     "cuDNN's heuristics chose the convolution algorithms (the same results, perhaps slower)")
    return "ignis guard: " + "; ".join(parts) if parts else ""


# -- cuDNN's autotuner ------------------------------------------------------------------------------
_cudnn_asked = [False]  # the program turned the autotuner on (the guard kept it off)


def _no_cudnn_benchmark(cudnn: Any) -> None:
    """Under the guard cuDNN's autotuner stays off. With it on, PyTorch's convolutions ask the
    allocator how large a workspace they may try (``cacheInfo``), which a pluggable allocator
    refuses: the program's first convolution would fail (RuntimeError "CUDAPluggableAllocator
    does not yet support cacheInfo"). The autotuner only picks among algorithms that compute
    the same convolution, so the guard keeps it off, notes that the program asked for it, and
    says so in its summary. Every way to turn it on is covered: the module's property
    (``torch.backends.cudnn.benchmark = True``) and ``torch.backends.cudnn.flags(benchmark=True)``,
    which calls ``torch._C._set_cudnn_benchmark``."""
    import torch
    real_set = _s.saved.setdefault("torch._C._set_cudnn_benchmark", torch._C._set_cudnn_benchmark)

    def set_benchmark(on: Any) -> None:
        if on:
            _cudnn_asked[0] = True
        real_set(False)

    torch._C._set_cudnn_benchmark = set_benchmark
    prop = type(cudnn).__dict__.get("benchmark")
    if prop is not None:  # (a ContextProp: the getter and setter it was made with)
        type(cudnn).benchmark = type(prop)(torch._C._get_cudnn_benchmark, set_benchmark)
    if torch._C._get_cudnn_benchmark():  # turned on before the guard came
        set_benchmark(True)


def _hook_graphs(torch: Any) -> None:
    from . import _graphs, _hook
    _s.bind(graph_alloc=_graph_memory)
    _graphs.add_listener(_GRAPHS)
    _hook.when_imported("torch._inductor.config", _no_graph_trees)


def _hook_syncs(torch: Any) -> None:
    from torch.cuda import _gpu_trace as gt
    torch._C._activate_gpu_trace()
    for reg in (gt.register_callback_for_device_synchronization, gt.register_callback_for_stream_synchronization,
                gt.register_callback_for_event_synchronization):
        reg(_front.on_sync)


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


# -- install when the program imports the framework (``ignis run --guard``) ------------------------
def _reset() -> None:
    """Forget every guard, hook and report (for tests; PyTorch's allocator cannot be
    swapped back, so this is for processes that never installed it). Blocks still
    live stay valid; their frees are dropped."""
    with _s.lock:
        if not _s.torch:
            _fast.torch_guard_bind(None, None)
            _fast.torch_guard_poison(0, 0, -1, None, None)
    _front.reset()


def install_on_import(*, torch: bool = True, cupy: bool = True, **options: Any) -> list[str]:
    """For ``ignis run --guard``: install the guard into PyTorch and CuPy now if they are
    imported already, else as soon as the program imports them (a program that imports
    neither pays nothing). Returns what was installed now. Problems installing later
    (CUDA already initialized, no CUDA build) are printed, never raised into the import."""
    _front.configure(options)
    installers: dict[str, Callable[[Any], None]] = {}

    def torch_then(_m: Any) -> None:
        try:
            # A CPU build, or no GPU: the program cannot allocate CUDA memory, nothing to guard.
            if hasattr(_m._C, "_cuda_customAllocator") and _m.cuda.is_available():
                use_guard()
        except GuardError as e:
            print(f"ignis guard: not installed into PyTorch: {e}", file=sys.stderr)

    def cupy_then(_m: Any) -> None:
        from ..cupy import use_guard as use_cupy_guard
        try:
            use_cupy_guard()
        except (GuardError, ImportError) as e:
            print(f"ignis guard: not installed into CuPy: {e}", file=sys.stderr)

    if torch:
        installers["torch"] = torch_then
    if cupy:
        installers["cupy"] = cupy_then
    return _front.install_when_imported(installers)


_front.add_summary_note(_graph_note)
