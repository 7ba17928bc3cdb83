"""cuDNN's recurrent kernels (their workspace and reserve buffers, kept from forward to
backward): an LSTM over packed variable-length sequences and a bidirectional GRU trained with
CTC loss."""
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

torch.manual_seed(0)
lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True).cuda()
gru = nn.GRU(64, 48, bidirectional=True).cuda()
head = nn.Linear(96, 11).cuda()
opt = torch.optim.Adam([*lstm.parameters(), *gru.parameters(), *head.parameters()], lr=1e-3)
x = torch.randn(6, 20, 32, device="cuda")
lengths = torch.tensor([20, 18, 15, 12, 9, 5])  # (a CPU tensor, as pack_padded_sequence wants)
targets = torch.randint(1, 11, (6, 4), device="cuda")
target_lengths = torch.full((6,), 4, dtype=torch.long)
for _ in range(3):
    packed, _ = lstm(pack_padded_sequence(x, lengths, batch_first=True))
    h, _ = pad_packed_sequence(packed, batch_first=True, total_length=20)
    g, _ = gru(h.transpose(0, 1))
    logp = head(g).log_softmax(-1)
    loss = nn.functional.ctc_loss(logp, targets, lengths, target_lengths)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("ZOO result", f"{loss.item():.6g}")
