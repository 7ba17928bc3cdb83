"""The debug guard as a framework's allocator: one front, shared by PyTorch and CuPy.

Every tensor PyTorch (or array CuPy) allocates on a GPU, once a framework's adapter
installed the guard (``ignis.torch.use_guard``, ``ignis.cupy.use_guard``, or
``ignis run --guard`` for both), comes from a ``DeferredGuardResource``
(``ignis.memory.guard``: the debug guard with its checks run on the device in batches;
canaries before and after, poison on allocation and on free, a quarantine before reuse)
over Ignis's ``PoolResource`` on that device, ordered on the framework's stream. Writes
past either end, writes into a freed block and reads of never-written memory (the poison
pattern) become reports with the block's size, tag, allocation site (Python frames) and
the bytes found.

This module is what the frameworks share, once per process:

- the options (``DEFAULTS``; one set per process: ``configure``);
- one guard per device (``guard_resource``; also the device's current Ignis resource, so
  Ignis's statistics, snapshots and arrays share it), and the frameworks' stream handles
  adopted as Ignis streams (``stream_for``; handle 0 is the legacy default stream);
- the compiled allocate and free (``guard_alloc``: ``alloc`` / ``free``, which an adapter
  hands its framework's allocations and frees);
- synchronize points (``on_sync``: queue the pending check batches, read finished ones and,
  at most every ``sync_check_interval`` seconds, check the canaries of every live block);
  ``check()`` checks everything now and waits;
- ``record_stream`` (``note_record_stream``): the streams a block is also used on; its free
  waits for each of them first (PyTorch's rule);
- the reports: to the sanitizer's list when it collects (``ignis run --guard --sanitize``
  prints one list), else to this module's, grouped by kind, side and allocation site with
  a count. A report found inside a free cannot be raised there: ``check()`` raises the first
  problem found since the previous ``check()``; ``finish()`` is a run's final check;
- ``install_when_imported``: run an adapter's installation as soon as the program imports
  its framework (a program that imports none pays nothing).

The adapters (``ignis.torch._guard``, ``ignis.cupy``) only install this as their framework's
allocator and hook what the framework alone can tell (PyTorch's ``record_stream``, its
synchronize trace, CUDA graph captures).

Limits (documented, not hidden): a write through a stale pointer after the block left the
quarantine and was reused is the new owner's (no tool at this level can tell); a batch's
results arrive after the batch ran, so a report "on free" comes at the next poll,
synchronize point or ``check()``.
"""

from __future__ import annotations

import atexit
import sys
import time
from typing import Any, Callable

from ..errors import IgnisError
from ..runtime import Device, Stream
from . import guard_alloc
from .guard import MAX_BATCH, DeferredGuardResource
from .guard_alloc import state as _s
from .hooks import HOOKS, format_stack
from .pool import PoolResource

__all__ = ["GuardError", "DEFAULTS", "configure", "guard_resource", "guards", "stream_for", "on_sync",
           "reports", "clear_reports", "summary", "check", "finish", "is_installed", "guard_stats",
           "note_record_stream", "add_summary_note", "print_at_exit", "install_when_imported", "reset"]


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

_LEGACY = 1  # CU_STREAM_LEGACY: what PyTorch's and CuPy's default stream handle 0 means


def _options(opts: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(opts) - set(DEFAULTS))
    if unknown:
        raise GuardError(f"unknown guard option(s) {', '.join(unknown)}; the options are {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **opts}
    b = out["batch"]
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH:
        raise GuardError(f"batch must be an int from 1 to {MAX_BATCH}, got {b!r}")
    d = out["stack_depth"]
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 64:
        raise GuardError(f"stack_depth must be an int from 1 to 64, got {d!r}")
    iv = out["sync_check_interval"]
    if iv is not None and (isinstance(iv, bool) or not isinstance(iv, (int, float)) or iv < 0):
        raise GuardError(f"sync_check_interval must be a number of seconds >= 0, or None, got {iv!r}")
    if out["tag"] is not None and not isinstance(out["tag"], str):
        raise GuardError(f"tag must be a str, got {out['tag']!r}")
    for name in ("poison", "canary"):
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0xFF:
            raise GuardError(f"{name} must be a byte value 0..255, got {v!r}")
    for name in ("canary_bytes", "quarantine_count", "quarantine_bytes", "ready_limit"):
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise GuardError(f"{name} must be a non-negative int, got {v!r}")
    if out["poison"] == out["canary"] and out["canary_bytes"]:
        raise GuardError(f"poison and canary must differ (both {out['poison']:#04x}), or a write of one would "
                         "pass for the other")
    return out


def configure(opts: dict[str, Any]) -> dict[str, Any]:
    """The process's guard options: ``opts`` over ``DEFAULTS`` the first time (validated:
    GuardError for an unknown name or a bad value); later, the same options again or none.
    Returns the options in force."""
    with _s.lock:
        if _s.opts is None:
            _s.configure(_options(opts))
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
            from . import set_current_resource
            from .current import default_upstream
            o = _s.opts if _s.opts is not None else configure({})
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


def stream_for(device: int, handle: int, owner: Any = None) -> Stream:
    """The Ignis stream for a framework's stream handle (adopted once). ``owner``: the
    framework's stream object, kept alive as long as the Ignis stream is (CuPy destroys
    a stream's handle when its object goes; the guard's poison and checks still run on
    it after the array's free)."""
    key = (device, handle)
    s = _s.streams.get(key)
    if s is not None and not s.stale:
        return s
    dev = Device(device)
    if handle == 0:
        s = Stream.from_handle(_LEGACY, dev) if dev.backend.cuda_driver else dev.default_stream
    else:
        s = Stream.from_handle(handle, dev, owner=owner)
    _s.streams[key] = s
    return s


def on_sync(*_args: Any) -> None:
    """A synchronize point of the framework (PyTorch's GPU trace calls it): queue the
    pending check batches, read finished ones, and check every live block's canaries
    if ``sync_check_interval`` seconds passed since the last such check."""
    if _s.tls.busy or not _s.guards:
        return
    iv = _s.opts["sync_check_interval"] if _s.opts else None
    now = time.monotonic()
    live = iv is not None and now - _s.last_live >= iv
    if live:
        _s.note_live_check(now)
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
            guard_alloc.drain_deferred()


# -- reports ---------------------------------------------------------------------------------------
def _key(err: IgnisError) -> tuple:
    return ("guard", type(err).__name__, getattr(err, "side", None), getattr(err, "nbytes", None),
            getattr(err, "tag", None), format_stack(getattr(err, "frames", None)))


def _emit(err: IgnisError) -> None:
    """Where every problem the guards find goes: the sanitizer's list when it collects
    (one list for ``--guard --sanitize``), else this module's, grouped the same way. The
    sanitizer is the memory layer's checker slot while it is enabled."""
    key = _key(err)
    chk = HOOKS.checker
    if chk is not None and chk.mode == "collect":
        chk.add_report(err, key)
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
    """The problems found so far, and forget them."""
    with _s.lock:
        return _s.take_problems()


_notes: list[Callable[[], str]] = []  # the adapters' lines for the summary ("" for none)


def add_summary_note(note: Callable[[], str]) -> None:
    """Have ``summary()`` show ``note()``'s line after its first one (when not "")."""
    if note not in _notes:
        _notes.append(note)


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
    for note in _notes:
        line = note()
        if line:
            lines.insert(1, line)
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
    global _printed
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


def print_at_exit() -> None:
    """Check everything at the interpreter's exit and print what ``finish`` did not (once)."""
    if not _s.atexit:
        atexit.register(_print_at_exit)
        _s.mark_atexit()


def is_installed() -> dict[str, bool]:
    """Which frameworks allocate through the guard."""
    return {"torch": bool(_s.torch), "cupy": bool(_s.cupy)}


def guard_stats(device: "Device | int" = 0) -> dict[str, int] | None:
    """The guard's own numbers for ``device`` (live user bytes, quarantine, the ready cache,
    checks), under ``guard.*`` keys; None while the device has no guard. ``ignis.telemetry``
    adds them to its statistics of the guard when it answers ``torch.cuda.memory_stats``."""
    g = _s.guards.get(device.ordinal if isinstance(device, Device) else int(device))
    if g is None:
        return None
    return {"guard.live_bytes": g.bytes_outstanding, "guard.quarantined_bytes": g.quarantined_bytes,
            "guard.ready_bytes": g._ready_bytes, "guard.checks": g._checker.jobs, "guard.batches": g._checker.batches,
            "guard.allocs_reusing_checked_blocks": g.reused, "guard.allocs_resizing_checked_blocks": g.resized}


def note_record_stream(ptr: int, handle: int, device: int | None = None) -> bool:
    """``Tensor.record_stream``: the block holding ``ptr`` (its allocation's base) is used
    on the stream ``handle``; its free will wait for that stream. For the op front end
    and PyTorch's adapter. False when ``ptr`` is not a live guarded block."""
    blk = _s.blocks.get(ptr)
    if blk is None:
        return False
    dev = blk.alloc_stream.device.ordinal if device is None else device
    g = _s.guards.get(dev)
    if g is None:
        return False
    g.note_record_stream(blk, stream_for(dev, handle))
    _s.rs_ptrs.add(ptr)
    return True


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
        finder = self

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
                if not names:  # this finder's work is done (another's may still wait)
                    sys.meta_path[:] = [f for f in sys.meta_path if f is not finder]

        spec.loader = _Loader()
        return spec


def _remove_finders() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def install_when_imported(installers: dict[str, Callable[[Any], None]]) -> list[str]:
    """For each top-level module name in ``installers``: call its installer with the module
    now if the program imported it already, else as soon as it does. Returns the names
    installed now."""
    now: list[str] = []
    wanted: dict[str, Callable[[Any], None]] = {}
    for name, then in installers.items():
        if name in sys.modules:
            then(sys.modules[name])
            now.append(name)
        else:
            wanted[name] = then
    if wanted:
        sys.meta_path.insert(0, _AfterImport(wanted))
    return now


def reset() -> None:
    """Forget every guard, hook and report (for tests; a framework's allocator cannot
    always be swapped back, so this is for processes that never installed one). Blocks
    still live stay valid; their frees are dropped."""
    from . import get_current_resource, set_current_resource
    _remove_finders()
    with _s.lock:
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
        _s.reset()  # (the PyTorch adapter's poison path keeps its two maps: see State.reset)
    global _printed
    _printed = 0


guard_alloc.setup(guard_resource, stream_for)  # the compiled allocate's slow paths
