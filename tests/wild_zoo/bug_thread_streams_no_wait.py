"""Bug: two threads train on their own streams; the main thread averages the weights on the
default stream without waiting for the threads' streams (joining the threads is not enough:
their work is queued, not done)."""
import threading

import torch
import torch.nn as nn

torch.manual_seed(0)
models = [nn.Linear(256, 256).cuda() for _ in range(2)]
streams = [torch.cuda.Stream() for _ in range(2)]
x = torch.randn(1024, 256, device="cuda")
torch.cuda.synchronize()


def train(i: int) -> None:
    opt = torch.optim.SGD(models[i].parameters(), lr=1e-3)
    with torch.cuda.stream(streams[i]):
        for _ in range(5):
            loss = models[i](x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with torch.no_grad():
    avg = (models[0].weight + models[1].weight) / 2   # no wait_stream: races the optimizers' writes
print("ZOO result", float(avg.sum()))
