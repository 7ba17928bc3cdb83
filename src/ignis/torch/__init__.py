"""``ignis.torch``: Ignis's sanitizer under unmodified PyTorch programs (extra ``ignis[torch]``).

Every op on CUDA tensors becomes checked reads and writes of byte ranges on
its stream; PyTorch's events, stream waits, synchronizations and caching
allocator feed the clocks and the allocation lifetimes. Found: races between
streams, frees while another stream still uses the memory (a missing
``record_stream``), reuse races (the new owner's first touch before the old
owner's last use finished), reads of bytes nothing wrote since ``torch.empty``,
host writes of pinned memory an async copy may still read, and the same for
tensors shared with Ignis through DLPack. Reports come through
``ignis.sanitizer.reports()`` with both Python stacks::

    with ignis.torch.sanitize():          # raise at the second access
        train()
    # or: ignis run --sanitize train.py   (collect, and report at exit)

Importing this package costs nothing and imports no PyTorch: the op observer (or
the dispatch mode) and the trace callbacks run only between ``enable()`` and
``disable()``; see ``enable`` for the two engines.
Work the dispatcher never sees (regions compiled with ``torch.compile``, Triton
and raw extension kernels, CUDA graphs) is declared with ``use()``; see
``ignis.torch._frontend`` for what is and is not seen.

The debug guard as PyTorch's CUDA allocator (canaries, poison, quarantine) is
here too: ``use_guard()`` before the first CUDA tensor, then ``check()``,
``reports()`` and ``summary()`` (``ignis run --guard`` installs it in an
unmodified program).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from ..safety.sanitizer import Sanitizer
    from ._frontend import TorchFrontEnd

__all__ = ["sanitize", "enable", "disable", "is_enabled", "use", "front_end",
           # the debug guard as PyTorch's allocator (``_guard``, imported when one is asked for)
           "use_guard", "check", "reports", "summary", "guard_stats", "GuardError",
           # the op observer's build (``_native``): where it is cached, with which compiler
           "observer_build"]

_fe: "TorchFrontEnd | None" = None

# The guard's ``patch_memory_stats`` answers torch.cuda.memory_stats and its friends with
# Ignis's statistics and snapshots: telemetry's work, a layer above this front end.
# ``ignis.telemetry`` (imported by ``import ignis``) puts its function here:
# ``memory_views(torch) -> {name: replacement}``; the guard installs what it returns.
memory_views: "Callable[[Any], dict[str, Callable[..., Any]]] | None" = None


def enable(mode: str = "raise", *, engine: str | None = None) -> "Sanitizer":
    """Check PyTorch's ops from now on (``mode`` "raise" or "collect"; the sanitizer is
    turned on too if it is off). Returns the sanitizer.

    ``engine``: how ops are seen. ``"observer"``: a C++ observer of every dispatcher call,
    on every thread, built against the installed torch at first use (a C++ compiler is
    needed once); it cannot raise inside an op, so in raise mode an error waits until
    checking stops. ``"mode"``: a TorchDispatchMode on this thread (and the autograd
    engine's), which raises at the op; slower per op. None (default, or
    ``IGNIS_TORCH_ENGINE``): the observer in collect mode, else the dispatch mode. Both
    measure tensors with the observer's library: RuntimeError, saying why, where it
    cannot be built."""
    global _fe
    from ..safety.sanitizer import sanitizer
    was, prev_mode = sanitizer.active, sanitizer.mode
    if not sanitizer.active or sanitizer.mode != mode:
        sanitizer.enable(mode)
    if _fe is None:
        from ._frontend import TorchFrontEnd
        try:
            fe = TorchFrontEnd(sanitizer, engine=engine)
            fe.enable()
        except BaseException:  # nothing of it stays on
            if not was:
                sanitizer.disable()
            else:
                sanitizer.mode = prev_mode
            raise
        _fe = fe
    return sanitizer


def disable() -> None:
    """Stop checking PyTorch's ops (the sanitizer itself stays as it is)."""
    global _fe
    fe, _fe = _fe, None
    if fe is not None:
        fe.disable()


def is_enabled() -> bool:
    """True while PyTorch's ops are checked (between ``enable()`` / ``sanitize()`` and ``disable()``)."""
    return _fe is not None


def front_end() -> "TorchFrontEnd | None":
    """The active front end (its counters: ``ops``, ``cpu_ops``), or None."""
    return _fe


@contextmanager
def sanitize(mode: str = "raise", *, engine: str | None = None) -> Iterator["Sanitizer"]:
    """Check the PyTorch ops inside the ``with`` block; put everything back after
    (``engine``: see ``enable``)."""
    from ..safety.sanitizer import sanitizer
    was, prev_mode = sanitizer.active, sanitizer.mode
    had = _fe is not None
    san = enable(mode, engine=engine)
    try:
        yield san
    finally:
        if not had:
            disable()
        if not was:
            sanitizer.disable()
        else:
            sanitizer.mode = prev_mode


def use(tensor: Any, access: Any = "read_write", *, stream: Any = None, op: str = "declared use") -> Any:
    """Declare that work the dispatcher cannot see touches ``tensor``: a Triton or raw
    extension kernel, a ``torch.compile``d region, a CUDA graph replay. The access
    (``"read"``, ``"write"`` or ``"read_write"``) is checked and recorded on ``stream``
    (a ``torch.cuda.Stream`` or raw handle; default: the tensor's device's current
    stream) when the block is entered; launch the work inside it.

        with ignis.torch.use(out, "write", stream=s):
            my_triton_kernel[grid](out, ...)

    Raises:
        ValueError: ``access`` names no access (at the call, whether or not the sanitizer is on).
    """
    from .._types import Access
    return _declared_use(tensor, Access.parse(access), stream, op)


@contextmanager
def _declared_use(tensor: Any, access: Any, stream: Any, op: str) -> Iterator[Any]:
    if _fe is not None:
        _fe.declare(tensor, access, stream, op)
    yield tensor


def __dir__() -> list[str]:
    # the package's API (the guard's names included), not the names it imports
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    # The debug guard as PyTorch's allocator lives in ``_guard`` (its own module, imported
    # only when one of its names is asked for, so importing this package stays free).
    if not name.startswith("_"):
        import importlib
        guard = importlib.import_module(f"{__name__}._guard")
        if name in guard.__all__:
            return getattr(guard, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def observer_build() -> "tuple[str, list[str]]":
    """Where the op observer built for the installed torch is (or would be) cached, and the
    C++ compiler command it is built with (for ``ignis doctor``). Imports torch."""
    from ._native import compiler, observer_path
    return observer_path(), compiler()
