"""Correct: a small training loop whose next batch is copied on a prefetch stream from
pinned memory, handed over with wait_stream and record_stream."""
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
prefetch = torch.cuda.Stream()
cpu_batches = [(torch.randn(64, 256).pin_memory(), torch.randint(0, 10, (64,)).pin_memory()) for _ in range(4)]


def load(i):
    xb, yb = cpu_batches[i % len(cpu_batches)]
    with torch.cuda.stream(prefetch):
        return xb.to("cuda", non_blocking=True), yb.to("cuda", non_blocking=True)


nxt = load(0)
for step in range(20):
    torch.cuda.current_stream().wait_stream(prefetch)
    xb, yb = nxt
    xb.record_stream(torch.cuda.current_stream())
    yb.record_stream(torch.cuda.current_stream())
    nxt = load(step + 1)
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print("step", step, "loss", round(loss.item(), 4))
print("ok")
