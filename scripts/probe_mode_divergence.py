"""Ops that run plainly but fail, or answer otherwise, under a TorchDispatchMode (one GPU):

    python3 scripts/probe_mode_divergence.py

The dispatch-mode engine of ``ignis.torch`` is a TorchDispatchMode, and PyTorch takes other
paths for some composite ops while any mode is active (their tensor-subclass paths). Each
case below mixes what real programs mix (CPU lengths, indices or scalars next to CUDA
tensors), runs plainly and under a mode that only passes each op on, and prints the cases
whose outcome differs: an error under the mode only, or another value.
"""
import os

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
D = os.environ.get("PROBE_DEVICE", "cuda")  # (cpu: a smoke test of the script itself)


class PassOn(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def cases():
    x = torch.randn(8, 16, device=D)
    idx = torch.tensor([0, 3, 5])
    lengths = torch.tensor([5, 4, 2])
    seq = torch.randn(3, 5, 4, device=D)
    yield "index with CPU indices", lambda: x[idx]
    yield "index_put_ with CPU indices", lambda: x.clone().index_put_((idx,), torch.zeros(3, 16, device=D))
    yield "setitem with CPU index tensor", lambda: _setitem(x.clone(), idx)
    yield "pack_padded_sequence (CPU lengths)", lambda: torch.nn.utils.rnn.pack_padded_sequence(
        seq, lengths, batch_first=True).data
    yield "pad_packed_sequence", lambda: torch.nn.utils.rnn.pad_packed_sequence(
        torch.nn.utils.rnn.pack_padded_sequence(seq, lengths, batch_first=True), batch_first=True)[0]
    yield "ctc_loss (CPU lengths)", lambda: F.ctc_loss(torch.randn(6, 2, 5, device=D).log_softmax(-1),
                                                      torch.tensor([[1, 2], [3, 1]], device=D),
                                                      torch.tensor([6, 5]), torch.tensor([2, 2]))
    yield "where with a 0-dim CPU tensor", lambda: torch.where(x > 0, x, torch.tensor(0.0))
    yield "add a 0-dim CPU tensor", lambda: x + torch.tensor(2.0)
    yield "tensor_split by a CPU tensor", lambda: torch.cat([t.sum(0, keepdim=True) for t in
                                                            torch.tensor_split(x, torch.tensor([2, 5]))])
    yield "repeat_interleave (CUDA repeats)", lambda: torch.repeat_interleave(
        x[:3], torch.tensor([1, 2, 3], device=D), dim=0)
    yield "nll_loss with class weights", lambda: F.nll_loss(x.log_softmax(-1), torch.tensor(
        [1, 2, 3, 4, 5, 6, 7, 8], device=D), weight=torch.rand(16, device=D))
    yield "cross_entropy, label smoothing", lambda: F.cross_entropy(x, torch.arange(8, device=D),
                                                                     label_smoothing=0.1)
    yield "embedding_bag with offsets", lambda: F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3], device=D),
                                                                torch.randn(10, 3, device=D),
                                                                torch.tensor([0, 3], device=D))
    yield "multi-head attention with a padding mask", lambda: _mha(seq)
    yield "interpolate bilinear", lambda: F.interpolate(x.view(1, 1, 8, 16), scale_factor=1.5, mode="bilinear")
    yield "grid_sample", lambda: F.grid_sample(x.view(1, 1, 8, 16), torch.rand(1, 4, 4, 2, device=D) * 2 - 1,
                                               align_corners=False)
    yield "stft with a window", lambda: torch.stft(torch.randn(400, device=D), 64,
                                                   window=torch.hann_window(64, device=D),
                                                   return_complex=True).abs()
    yield "bincount with weights", lambda: torch.bincount(torch.tensor([1, 1, 3], device=D),
                                                          torch.tensor([0.5, 1.0, 2.0], device=D))
    yield "searchsorted", lambda: torch.searchsorted(torch.arange(10.0, device=D), x[0])
    yield "quantile", lambda: torch.quantile(x, torch.tensor([0.25, 0.75], device=D), dim=1)
    yield "masked_select", lambda: torch.masked_select(x, x > 0)
    yield "nonzero", lambda: torch.nonzero(x > 0)
    yield "unique with counts", lambda: torch.unique(torch.tensor([3, 1, 3, 2], device=D), return_counts=True)[1]
    yield "one_hot", lambda: F.one_hot(torch.tensor([0, 2, 1], device=D), 4)
    yield "cdist", lambda: torch.cdist(x, x)
    yield "clip_grad_norm_", lambda: _clip()
    yield "sparse_coo_tensor from CPU indices", lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2)).to(D).to_dense()
    yield "sparse mm", lambda: torch.sparse.mm(torch.eye(8, device=D).to_sparse(), x)
    yield "linalg.lstsq", lambda: torch.linalg.lstsq(x[:, :4], x[:, 4:5]).solution
    yield "torch.tensor from a list on the device", lambda: torch.tensor([1.0, 2.0], device=D) * x[0, :2]
    yield "item of a CUDA tensor", lambda: torch.tensor(x.sum().item())
    yield "scaled_dot_product_attention with a bool mask", lambda: F.scaled_dot_product_attention(
        seq.unsqueeze(1), seq.unsqueeze(1), seq.unsqueeze(1), attn_mask=torch.ones(5, 5, device=D).bool().tril())
    yield "layer_norm / group_norm", lambda: F.group_norm(F.layer_norm(seq, (4,)), 1)
    yield "max_pool with indices and unpool", lambda: _pool(x)
    yield "adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(x.view(1, 1, 8, 16), (3, 5))
    yield "topk / sort", lambda: torch.topk(x, 3).values + torch.sort(x, 1).values[:, :3]
    yield "cumsum / logcumsumexp", lambda: x.cumsum(1) + x.logcumsumexp(1)
    yield "einsum", lambda: torch.einsum("ij,kj->ik", x, x)
    yield "polar / complex", lambda: torch.view_as_real(torch.polar(x.abs(), x))
    yield "dropout (seeded)", lambda: _dropout(x)


def _setitem(t, idx):
    t[idx] = 1.0
    return t


def _mha(seq):
    torch.manual_seed(1)
    m = torch.nn.MultiheadAttention(4, 2, batch_first=True).to(D)
    mask = torch.tensor([[False] * 5, [False] * 4 + [True], [False] * 2 + [True] * 3], device=D)
    return m(seq, seq, seq, key_padding_mask=mask)[0]


def _clip():
    torch.manual_seed(2)
    ps = [torch.nn.Parameter(torch.randn(5, device=D)) for _ in range(3)]
    for p in ps:
        p.grad = torch.randn(5, device=D)
    return torch.nn.utils.clip_grad_norm_(ps, 0.5)


def _pool(x):
    out, ind = F.max_pool2d(x.view(1, 1, 8, 16), 2, return_indices=True)
    return F.max_unpool2d(out, ind, 2)


def _dropout(x):
    torch.manual_seed(3)
    return F.dropout(x, 0.5)


def run(fn):
    torch.manual_seed(0)  # (the same inputs for both runs)
    try:
        out = fn()
        if D == "cuda":
            torch.cuda.synchronize()
        return "ok", out
    except Exception as e:  # noqa: BLE001 (the outcome is what is compared)
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(
            a.float().cpu(), b.float().cpu(), rtol=1e-4, atol=1e-5, equal_nan=True)
    return type(a) is type(b)


names = []
for name, fn in cases():
    plain = run(fn)
    with PassOn():
        moded = run(fn)
    ok = plain[0] == moded[0] and (plain[0] == "error" or same(plain[1], moded[1]))
    names.append(name)
    if not ok:
        print(f"DIFFERS {name}: plain {plain[0]} {plain[1] if plain[0] == 'error' else ''}| "
              f"mode {moded[0]} {moded[1] if moded[0] == 'error' else ''}")
    elif plain[0] == "error":
        print(f"both fail {name}: {plain[1]}")
print(f"{len(names)} cases checked")
