"""Which programs PyTorch's ctc_loss fails under a TorchDispatchMode (one GPU):

    python3 scripts/probe_ctc_modes.py

The zoo's CTC step (tests/wild_zoo/rnn_ctc.py: CUDA log-probabilities and targets, CPU lengths)
plain, under a dispatch mode that only passes each op on, and under that mode with
``ignis.torch._ctc`` installed; prints each one's loss or its error.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class PassOn(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step():
    torch.manual_seed(0)
    logp = torch.randn(20, 6, 11, device="cuda").log_softmax(-1).requires_grad_()
    targets = torch.randint(1, 11, (6, 4), device="cuda")
    lengths = torch.tensor([20, 18, 15, 12, 9, 5])
    loss = torch.nn.functional.ctc_loss(logp, targets, lengths, torch.full((6,), 4, dtype=torch.long))
    loss.backward()
    return f"{loss.item():.6g} (grad sum {logp.grad.sum().item():.6g})"


def attempt(name, fn):
    try:
        print(f"{name}: {fn()}")
    except Exception as e:  # noqa: BLE001 (the point is to see it)
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


attempt("plain", step)
with PassOn():
    attempt("a pass-on dispatch mode", step)
from ignis.torch import _ctc  # noqa: E402
_ctc.install()
try:
    with PassOn():
        attempt("a pass-on dispatch mode, ignis.torch._ctc installed", step)
finally:
    _ctc.uninstall()
