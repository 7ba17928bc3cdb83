"""A PyTorch front end on the op observer with its direct path (as ``ignis run`` has it), in the
front end's test mode: CPU tensors stand for a device's, and ``Front.stream`` names the stream
its ops are queued on. Shared by the tests of the observer's backlog and its checker thread."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

A, B = 0x5A00, 0x5B00  # two streams' handles


def observer():
    """The observer library, or the test skipped (saying why) where it cannot be built."""
    from ignis.torch._native import observer as load, observer_error
    lib = load()
    if lib is None:
        pytest.skip(f"the op observer cannot be built here: {observer_error()}")
    return lib


class Front:
    """A front end on the observer with its direct path, whose ops are queued on ``self.stream``
    (a context manager: enabled inside)."""

    def __init__(self, mode: str = "collect", san=None) -> None:
        from ignis.safety.sanitizer import Sanitizer
        from ignis.torch._frontend import TorchFrontEnd
        self.lib = observer()
        self.stream = A
        self.san = Sanitizer() if san is None else san
        self.san.mode = mode
        self.san.outputs_fresh = True  # as with the GPU trace: an op's fresh output starts a lifetime
        self.fe = TorchFrontEnd(self.san, device_type="cpu", stream_of=lambda t: self.stream, engine="observer")

    def __enter__(self) -> "Front":
        self.fe.enable()
        assert self.fe._direct() is not None
        return self

    def __exit__(self, *exc: object) -> None:
        self.fe.disable()

    def held(self) -> int:
        """The calls held in the observer's backlog now."""
        return self.lib.ignis_obs_held()


@contextmanager
def frees_held(monkeypatch, front=Front):
    """A front end (of class ``front``) whose caching-allocator frees come through the observer's
    trace interpreter to the sanitizer's own handler (held like ops); a test fires them with
    ``ignis_obs_trace_fire`` (device type 0: the test mode's)."""
    import torch
    import torch.cuda._gpu_trace as gt
    from ignis.torch._frontend import TorchFrontEnd
    lib = observer()
    torch._C._activate_gpu_trace()
    monkeypatch.setattr(torch.cpu, "_gpu_trace", gt, raising=False)  # (CPU events: the CUDA registries)
    kinds = TorchFrontEnd._TRACE_KINDS
    with front() as f:
        handlers = tuple(f.san.extent_freed if k == "MemoryDeallocationCallbacks" else None for k in kinds)
        assert lib.ignis_obs_trace_start(handlers, tuple(getattr(gt, k).callback_list for k in kinds)) == 0
        try:
            yield f
        finally:
            lib.ignis_obs_trace_stop()
