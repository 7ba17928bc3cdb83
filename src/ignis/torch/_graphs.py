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
the stream that captured (its current stream at ``capture_begin``) or replays.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_listener", "remove_listener", "listeners"]

_NAMES = ("capture_begin", "capture_end", "replay", "reset")
_saved: dict[str, Any] = {}
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

    _saved.update(own)
    _saved["_wrapped"] = True
    for n, fn in (("capture_begin", capture_begin), ("capture_end", capture_end), ("replay", replay),
                  ("reset", reset)):
        fn.__name__ = fn.__qualname__ = n
        setattr(G, n, fn)


def _unwrap() -> None:
    if not _saved:
        return
    import torch
    G = torch.cuda.graphs.CUDAGraph
    for n in _NAMES:
        own = _saved.pop(n, None)
        if own is not None:
            setattr(G, n, own)
        elif n in G.__dict__:
            delattr(G, n)
    _saved.clear()
