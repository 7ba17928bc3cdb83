"""``UntypedStorage.resize_`` as the free (or move) it can be.

``tensor.untyped_storage().resize_(n)`` gives a storage's memory back to the caching
allocator (``n == 0``) or moves it (any other new size) without going through PyTorch's
dispatcher, so no op reports it: only the allocator's free is traced. FSDP frees its
unsharded parameters this way, and a program that does it while a collective still uses
the storage frees memory that NCCL is reading or writing (PyTorch keeps a collective's
tensors alive on its ``Work``, but a resize takes the memory from under the tensor).

``add_listener(fn)`` wraps ``torch.UntypedStorage.resize_`` (once, for every listener) so
that each call first calls ``fn(storage, nbytes)``, then resizes; ``remove_listener(fn)``
puts PyTorch's method back when the last listener leaves. Where the method cannot be
replaced nothing is installed and ``installed()`` is False.
"""

from __future__ import annotations

from typing import Any, Callable

from ._tap import MethodTap

__all__ = ["add_listener", "remove_listener", "installed"]


def _storage_class() -> Any:
    import torch
    return torch.UntypedStorage


def _resizing(original: Any, listeners: list, storage: Any, *args: Any) -> Any:
    if len(args) == 1:  # (any other call is PyTorch's to refuse, with its own message)
        for fn in list(listeners):
            fn(storage, args[0])
    return original(storage, *args)


_tap = MethodTap(_storage_class, "resize_", _resizing)
_resize_ = _tap.wrapper


def add_listener(fn: Callable[[Any, int], None]) -> bool:
    """Call ``fn(storage, nbytes)`` before every ``UntypedStorage.resize_``; returns whether
    the wrapper is installed."""
    return _tap.add(fn)


def remove_listener(fn: Callable[[Any, int], None]) -> None:
    """Forget ``fn``; the last listener gone, ``UntypedStorage.resize_`` is PyTorch's again."""
    _tap.remove(fn)


def installed() -> bool:
    """Whether ``UntypedStorage.resize_`` is wrapped now."""
    return _tap.installed()
