"""nn.TransformerEncoder in eval with a padding mask (PyTorch's fast path: nested tensors
inside), nn.MultiheadAttention returning its weights, and nested tensors made directly."""
import torch
import torch.nn as nn

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True, dropout=0.0)
enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).cuda().eval()
x = torch.randn(4, 10, 64, device="cuda")
pad = torch.zeros(4, 10, dtype=torch.bool, device="cuda")
pad[1, 7:] = True
pad[3, 4:] = True
with torch.inference_mode():
    y = enc(x, src_key_padding_mask=pad)
mha = nn.MultiheadAttention(64, 4, batch_first=True).cuda()
out, w = mha(x, x, x, need_weights=True, key_padding_mask=pad)
out.sum().backward()
nt = torch.nested.nested_tensor([torch.randn(3, 8, device="cuda"), torch.randn(5, 8, device="cuda")])
nt2 = nt * 2 + 1
padded = torch.nested.to_padded_tensor(nt2, 0.0)
print("ZOO result", f"{y[~pad].sum().item():.6g}", f"{w.sum().item():.6g}",
      f"{mha.in_proj_weight.grad.abs().sum().item():.6g}", f"{padded.sum().item():.6g}")
