"""CUDA graphs' capture and replays, which PyTorch's trace does not report, for the sanitizer's
front end and the guard.

While a listener is registered (``add_listener``), ``torch.cuda.CUDAGraph``'s ``capture_begin``,
``capture_end``, ``replay`` and ``reset`` are wrapped (every way to capture goes through them:
``torch.cuda.graph``, ``make_graphed_callables``, the CUDA graphs of ``torch.compile``): each
calls PyTorch's own method, then tells every listener, in the order they were added (a
capture's end is told even when PyTorch's capture_end fails). The wrappers are taken out
again when the last listener goes (``remove_listener``).

A listener has ``graph_begin(graph, stream)``, ``graph_end(graph, stream)``,
``graph_replay(graph, stream)`` and ``graph_reset(graph)``: ``stream`` is the raw handle of
the stream that captured (its current stream at ``capture_begin``) or replays; the pool the
capture allocates into is ``pool_of(graph)``. Also ``pool_begin(device, pool)`` and
``pool_end(device, pool)``: this thread (or its current stream) allocates into a graph pool
outside a capture (PyTorch's ``_cuda_beginAllocate*ToPool``, as CUDA graph trees do for their
warm-up runs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_listener", "remove_listener", "listeners", "pool_of"]

_NAMES = ("capture_begin", "capture_end", "replay", "reset")
_POOL_BEGINS = ("_cuda_beginAllocateToPool", "_cuda_beginAllocateCurrentThreadToPool",
                "_cuda_beginAllocateCurrentStreamToPool")
_saved: dict[str, Any] = {}
_saved_c: dict[str, Any] = {}


def pool_of(graph: Any) -> Any:
    """The pool a graph's capture allocates into: the ``pool`` it was given, else its own."""
    pool = graph.__dict__.get("_ignis_pool")
    return tuple(pool) if pool is not None else ("graph", id(graph))
_listeners: list[Any] = []


def listeners() -> list[Any]:
    """The listeners registered now."""
    return list(_listeners)


def add_listener(listener: Any) -> None:
    """Tell ``listener`` of every capture and replay from now on (the graph class's methods are
    wrapped while any listener is registered)."""
    if listener in _listeners:
        return
    _listeners.append(listener)
    if len(_listeners) == 1:
        _wrap()


def remove_listener(listener: Any) -> None:
    """Stop telling ``listener``; the last one to go puts the graph class's methods back."""
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners:
        _unwrap()


def _stream_now() -> int:
    import torch
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())


def _wrap() -> None:
    import torch
    G = torch.cuda.graphs.CUDAGraph
    if _saved:
        return
    base = torch._C._CUDAGraph
    own = {n: G.__dict__.get(n) for n in _NAMES}
    orig = {n: (own[n] if own[n] is not None else getattr(base, n)) for n in _NAMES}

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["capture_begin"](self, *args, **kwargs)
        self.__dict__["_ignis_pool"] = kwargs.get("pool", args[0] if args else None)
        h = _stream_now()
        self.__dict__["_ignis_stream"] = h
        for li in list(_listeners):
            li.graph_begin(self, h)

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            orig["capture_end"](self, *args, **kwargs)
        finally:
            h = self.__dict__.pop("_ignis_stream", None)
            if h is not None:
                for li in list(_listeners):
                    li.graph_end(self, h)

    def replay(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["replay"](self, *args, **kwargs)
        if _listeners:
            h = _stream_now()
            for li in list(_listeners):
                li.graph_replay(self, h)

    def reset(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["reset"](self, *args, **kwargs)
        for li in list(_listeners):
            li.graph_reset(self)

    C = torch._C
    for name in _POOL_BEGINS:
        fn = getattr(C, name, None)
        if fn is not None:
            _saved_c[name] = fn
            setattr(C, name, _pool_begin(fn))
    end = getattr(C, "_cuda_endAllocateToPool", None)
    if end is not None:
        _saved_c["_cuda_endAllocateToPool"] = end

        def end_allocate_to_pool(device: Any, pool: Any) -> None:
            end(device, pool)
            for li in list(_listeners):
                li.pool_end(device, pool)
        C._cuda_endAllocateToPool = end_allocate_to_pool
    _saved.update(own)
    _saved["_wrapped"] = True
    for n, fn in (("capture_begin", capture_begin), ("capture_end", capture_end), ("replay", replay),
                  ("reset", reset)):
        fn.__name__ = fn.__qualname__ = n
        setattr(G, n, fn)


def _pool_begin(fn: Any) -> Any:
    def begin_allocate_to_pool(device: Any, pool: Any, *args: Any, **kwargs: Any) -> None:
        fn(device, pool, *args, **kwargs)
        for li in list(_listeners):
            li.pool_begin(device, pool)
    return begin_allocate_to_pool


def _unwrap() -> None:
    if not _saved:
        return
    import torch
    for name, fn in _saved_c.items():
        setattr(torch._C, name, fn)
    _saved_c.clear()
    G = torch.cuda.graphs.CUDAGraph
    for n in _NAMES:
        own = _saved.pop(n, None)
        if own is not None:
            setattr(G, n, own)
        elif n in G.__dict__:
            delattr(G, n)
    _saved.clear()
