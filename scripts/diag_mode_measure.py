"""The PyTorch front end's added host time per op, on CPU tensors (the front end's test mode):
    PYTHONPATH=src python3 scripts/diag_mode_measure.py mode|observer
600 small ops (in-place add, matmul, a strided column's mul_) and 200 ``_foreach_add_`` over
64 + 64 tensors, timed plain and then under the front end (raise mode for ``mode``, collect
mode for ``observer``), medians of 7 turns, µs per op. For comparing two trees' host work in
turns (run with each tree's ``src`` on PYTHONPATH); no GPU needed, so no target is judged here.
"""
import sys, time, statistics, torch
import ignis  # noqa
from ignis.safety.sanitizer import Sanitizer
from ignis.torch._frontend import TorchFrontEnd
engine = sys.argv[1]
san = Sanitizer().enable("raise" if engine == "mode" else "collect")
fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine=engine)
x = torch.zeros(64, 64); y = torch.ones(64, 64)
ps = [torch.ones(16) for _ in range(64)]; gs = [torch.ones(16) for _ in range(64)]
def small():
    for _ in range(200):
        x.add_(y); torch.mm(x, y); x[:, 3].mul_(2)
def foreach():
    for _ in range(200):
        torch._foreach_add_(ps, gs)
def run(fn, n_ops):
    out = []
    for _ in range(7):
        t = time.perf_counter(); fn(); out.append((time.perf_counter() - t) / n_ops * 1e6)
    return statistics.median(out)
base_small, base_fe = run(small, 600), run(foreach, 200)
fe.enable()
try:
    s, f = run(small, 600), run(foreach, 200)
finally:
    fe.disable()
print(f"{engine}: small ops {base_small:.2f} -> {s:.2f} us/op (+{s-base_small:.2f}); foreach of 64+64 {base_fe:.2f} -> {f:.2f} us/op (+{f-base_fe:.2f}); reports {len(san.reports)}")
