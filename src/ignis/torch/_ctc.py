"""``torch.ctc_loss`` with host lengths, under the dispatch-mode engine, as PyTorch runs it
without a mode.

Without a ``TorchDispatchMode``, ``aten::ctc_loss.Tensor`` copies the two length tensors to the
host and runs the list overload (``ctc_loss.IntList``). While any dispatch mode is active (the
sanitizer's dispatch-mode engine, or any other mode a program enters) PyTorch takes the path it
keeps for tensor subclasses instead: ``_ctc_loss.Tensor`` with the host lengths next to device
inputs, which the dispatcher refuses ("Expected all tensors to be on the same device"), and,
for ``reduction="mean"``, a device loss divided by host lengths. A correct program that trains
on the GPU with CTC loss and CPU lengths (as ``pack_padded_sequence`` wants them) would fail at
its first loss.

While the dispatch-mode engine runs, ``torch.ctc_loss`` (which ``torch.nn.functional.ctc_loss``
and ``nn.CTCLoss`` call) is wrapped: when both lengths are plain integer tensors on the CPU,
they go as lists, to the list overload, which is the path PyTorch takes without a mode, with
the same kernels and the same result. Anything else (lengths on the device, lists, tensor
subclasses, bad input) goes through as it came, for PyTorch to run or refuse.

``install()`` / ``uninstall()`` are counted: the wrapper stays while any engine needs it, and
``torch.ctc_loss`` is PyTorch's again after the last ``uninstall()`` (left alone if something
replaced it since).
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "uninstall", "installed"]

_users = 0
_original: Any = None
_wrapper: Any = None


def _host_lengths(lengths: Any) -> Any:
    """``lengths`` as a list when it is a plain integer tensor on the CPU, else None."""
    import torch
    if type(lengths) is not torch.Tensor or lengths.device.type != "cpu":
        return None
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        return None  # (PyTorch refuses these with its own message)
    return lengths.reshape(-1).tolist()


def install() -> None:
    """Wrap ``torch.ctc_loss`` (once, for every caller of ``install``)."""
    global _users, _original, _wrapper
    import torch
    _users += 1
    if _users > 1:
        return
    original = torch.ctc_loss

    def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, *args: Any,
                 **kwargs: Any) -> Any:
        il = _host_lengths(input_lengths)
        tl = _host_lengths(target_lengths) if il is not None else None
        if tl is not None:
            input_lengths, target_lengths = il, tl
        return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

    ctc_loss.__doc__ = original.__doc__
    _original, _wrapper = original, ctc_loss
    torch.ctc_loss = ctc_loss


def uninstall() -> None:
    """Undo one ``install()``; the last one gives PyTorch its function back."""
    global _users, _original, _wrapper
    import torch
    if _users == 0:
        return
    _users -= 1
    if _users:
        return
    if torch.ctc_loss is _wrapper:
        torch.ctc_loss = _original
    _original = _wrapper = None


def installed() -> bool:
    """Whether ``torch.ctc_loss`` is the wrapper now."""
    import torch
    return _wrapper is not None and torch.ctc_loss is _wrapper
