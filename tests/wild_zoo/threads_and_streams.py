"""Two Python threads, each with its own CUDA stream, training its own model; the main thread
waits for both streams, then averages the two models' weights on the default stream."""
import threading

import torch
import torch.nn as nn

torch.manual_seed(0)
models = [nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)).cuda() for _ in range(2)]
streams = [torch.cuda.Stream() for _ in range(2)]
data = [(torch.randn(256, 64, device="cuda"), torch.randn(256, 1, device="cuda")) for _ in range(2)]
torch.cuda.synchronize()
losses = [0.0, 0.0]


def train(i: int) -> None:
    m, s = models[i], streams[i]
    opt = torch.optim.SGD(m.parameters(), lr=1e-2)
    with torch.cuda.stream(s):
        x, y = data[i]
        for _ in range(5):
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[i] = loss.detach()


threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
cur = torch.cuda.current_stream()
for s in streams:
    cur.wait_stream(s)
with torch.no_grad():
    avg = [(a + b) / 2 for a, b in zip(models[0].parameters(), models[1].parameters())]
print("ZOO result", f"{losses[0].item():.6g}", f"{losses[1].item():.6g}", f"{sum(p.sum() for p in avg).item():.6g}")
