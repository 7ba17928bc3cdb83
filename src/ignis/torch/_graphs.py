"""CUDA graphs under the PyTorch front end: their capture and replays, which PyTorch's trace
does not report.

While the front end runs, ``torch.cuda.CUDAGraph``'s ``capture_begin``, ``capture_end``,
``replay`` and ``reset`` are wrapped (every way to capture goes through them:
``torch.cuda.graph``, ``make_graphed_callables``, the CUDA graph trees of
``torch.compile(mode="reduce-overhead")``): the sanitizer records what is queued on the
capturing stream into the graph (``Sanitizer.capture_begin`` / ``capture_end``) and applies
it at each replay, on the replay stream (``Sanitizer.replay``). The wrappers call PyTorch's
own methods first and are taken out again when the front end stops.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["install", "uninstall"]

_NAMES = ("capture_begin", "capture_end", "replay", "reset")
_saved: dict[str, Any] = {}


def install(san: Any, stream_now: Callable[[], int], frames: Callable[[], Any]) -> None:
    """Wrap the graph class's methods (``stream_now()``: the raw handle of the current CUDA
    stream; ``frames()``: the user's stack)."""
    import torch
    G = torch.cuda.graphs.CUDAGraph
    if _saved:
        return
    base = torch._C._CUDAGraph
    own = {n: G.__dict__.get(n) for n in _NAMES}
    orig = {n: (own[n] if own[n] is not None else getattr(base, n)) for n in _NAMES}

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["capture_begin"](self, *args, **kwargs)
        h = stream_now()
        self.__dict__["_ignis_stream"] = h
        self.__dict__["_ignis_graph"] = san.capture_begin(h, frames())

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            orig["capture_end"](self, *args, **kwargs)
        finally:
            h = self.__dict__.pop("_ignis_stream", None)
            if h is not None:
                cap = san.capture_end(h)
                if cap is None:
                    self.__dict__.pop("_ignis_graph", None)

    def replay(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["replay"](self, *args, **kwargs)
        cap = self.__dict__.get("_ignis_graph")
        if cap is not None:
            san.replay(cap, stream_now(), frames())

    def reset(self: Any, *args: Any, **kwargs: Any) -> None:
        orig["reset"](self, *args, **kwargs)
        self.__dict__.pop("_ignis_graph", None)

    _saved.update(own)
    for n, fn in (("capture_begin", capture_begin), ("capture_end", capture_end), ("replay", replay),
                  ("reset", reset)):
        fn.__name__ = fn.__qualname__ = n
        setattr(G, n, fn)


def uninstall() -> None:
    """Put the graph class's methods back."""
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
