"""Correct: double-buffered pinned staging; a buffer is refilled only after the event
recorded behind its last copy has completed."""
import torch

bufs = [torch.empty(1 << 20, pin_memory=True) for _ in range(2)]
done = [None, None]
outs = []
for i in range(6):
    k = i % 2
    if done[k] is not None:
        done[k].synchronize()                       # the copy that read this buffer finished
    bufs[k].fill_(float(i))
    outs.append(bufs[k].to("cuda", non_blocking=True))
    done[k] = torch.cuda.Event()
    done[k].record()
back = torch.empty(1 << 20, pin_memory=True)
back.copy_(outs[-1], non_blocking=True)             # device to host, async
torch.cuda.current_stream().synchronize()           # before the host looks at it
assert float(back[0]) == 5.0
assert [float(o.mean()) for o in outs] == [float(i) for i in range(6)]
print("ok")
