"""A small training loop that is correct: a prefetch stream with record_stream,
autocast, SGD. Under the guard it must give the same loss and no report."""

import os
import pickle
import tempfile

import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = [(torch.randn(128, 256).pin_memory(), torch.randint(0, 10, (128,)).pin_memory()) for _ in range(8)]
prefetch = torch.cuda.Stream()
STEPS = int(os.environ.get("ZOO_STEPS", "60"))


def load(i):
    with torch.cuda.stream(prefetch):
        x, y = data[i % len(data)]
        return x.cuda(non_blocking=True), y.cuda(non_blocking=True)


nxt = load(0)
for step in range(STEPS):
    torch.cuda.current_stream().wait_stream(prefetch)
    x, y = nxt
    x.record_stream(torch.cuda.current_stream())
    y.record_stream(torch.cuda.current_stream())
    if step + 1 < STEPS:
        nxt = load(step + 1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    del x, y
print(f"ZOO loss {loss.item():.8f}")

from ignis.torch import _guard  # noqa: E402

print("ZOO guarded", _guard.is_installed()["torch"])
if _guard.is_installed()["torch"]:
    print("ZOO memory_allocated", torch.cuda.memory_allocated())
    import ignis as ig
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    ig.dump_snapshot(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    print("ZOO snapshot blocks", sum(1 for s in snap["segments"] for b in s["blocks"]
                                     if b["state"] == "active_allocated"))
