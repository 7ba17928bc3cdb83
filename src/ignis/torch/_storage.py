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

__all__ = ["add_listener", "remove_listener", "installed"]

_listeners: list[Callable[[Any, int], None]] = []
_original: Any = None


def _storage_class() -> Any:
    import torch
    return torch.UntypedStorage


def _resize_(self: Any, size: int) -> Any:
    for fn in list(_listeners):
        fn(self, size)
    return _original(self, size)


def add_listener(fn: Callable[[Any, int], None]) -> bool:
    """Call ``fn(storage, nbytes)`` before every ``UntypedStorage.resize_``; returns whether
    the wrapper is installed."""
    global _original
    if _original is None:
        cls = _storage_class()
        original = getattr(cls, "resize_", None)
        if original is None:
            return False
        try:
            cls.resize_ = _resize_
        except (TypeError, AttributeError):
            return False
        _original = original
    if fn not in _listeners:
        _listeners.append(fn)
    return True


def remove_listener(fn: Callable[[Any, int], None]) -> None:
    """Forget ``fn``; the last listener gone, ``UntypedStorage.resize_`` is PyTorch's again."""
    global _original
    if fn in _listeners:
        _listeners.remove(fn)
    if not _listeners and _original is not None:
        cls = _storage_class()
        if cls.__dict__.get("resize_") is _resize_:
            del cls.resize_  # the inherited method (torch._C.StorageBase's) shows through again
            if getattr(cls, "resize_", None) is not _original:
                cls.resize_ = _original
        _original = None


def installed() -> bool:
    """Whether ``UntypedStorage.resize_`` is wrapped now."""
    return _original is not None
