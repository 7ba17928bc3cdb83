"""Facts about PyTorch's CUDA graphs, torch.compile and Triton that the front end's capture and
kernel support relies on, read off the installed versions on the GPU machine (no Ignis needed).
Prints one line per fact."""
import inspect
import sys
import traceback

import torch
import torch.cuda._gpu_trace as gt

print("torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__)
except Exception as e:
    print("triton import failed", e)

events = []
def cb(name):
    return lambda *a: events.append((name, a))
torch._C._activate_gpu_trace()
for reg, name in [(gt.EventRecordCallbacks, "record"), (gt.EventWaitCallbacks, "wait"),
                  (gt.MemoryAllocationCallbacks, "alloc"), (gt.MemoryDeallocationCallbacks, "free"),
                  (gt.StreamSynchronizationCallbacks, "ssync"), (gt.DeviceSynchronizationCallbacks, "dsync"),
                  (gt.EventCreationCallbacks, "ecreate")]:
    reg.add_callback(cb(name))

from torch.utils._python_dispatch import TorchDispatchMode
class Seen(TorchDispatchMode):
    def __init__(self): super().__init__(); self.ops = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), torch.cuda.is_current_stream_capturing(), torch.cuda.current_stream().cuda_stream))
        return func(*args, **(kwargs or {}))

# 1. the documented capture pattern
x = torch.zeros(1024, device="cuda"); w = torch.ones(1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(2):
        y = x * w + 1
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
events.clear()
mode = Seen()
with mode:
    with torch.cuda.graph(g):
        y = x * w + 1
print("capture: ops", mode.ops)
print("capture: trace events", [(n, tuple(hex(v) if isinstance(v, int) else v for v in a)) for n, a in events])
print("graph attrs", [a for a in dir(g) if not a.startswith("__")])
print("graph pool", g.pool())
print("CUDAGraph mro", torch.cuda.CUDAGraph.__mro__)
print("torch.cuda.graph.__enter__ src has capture_begin:", "capture_begin" in inspect.getsource(torch.cuda.graph))
events.clear()
with Seen() as m2:
    x.copy_(torch.full((1024,), 2.0, device="cuda"))
    g.replay()
    print("replay: ops", m2.ops)
print("replay: trace events", events)
torch.cuda.synchronize()
print("y ok", bool((y == 3).all()))

# 2. make_graphed_callables: does it go through torch.cuda.graph / CUDAGraph.capture_begin?
src = inspect.getsource(torch.cuda.graphs.make_graphed_callables)
print("make_graphed_callables uses torch.cuda.graph:", "torch.cuda.graph(" in src, "capture_begin" in src)

# 3. Triton: hooks, launch metadata, Inductor's launcher
try:
    import triton
    import triton.language as tl
    from triton import knobs
    print("knobs.runtime attrs", [a for a in dir(knobs.runtime) if "hook" in a])
    from triton.compiler.compiler import CompiledKernel
    print("CompiledKernel.launch_metadata sig", inspect.signature(CompiledKernel.launch_metadata))
    print(inspect.getsource(CompiledKernel.launch_metadata)[:1500])
    from triton.runtime.jit import JITFunction
    src = inspect.getsource(JITFunction.run)
    print("JITFunction.run mentions launch_metadata:", "launch_metadata" in src)

    @triton.jit
    def add_one(X, Y, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < N
        tl.store(Y + i, tl.load(X + i, mask=m) + 1, mask=m)

    hooked = []
    def enter(meta):
        d = meta.get() if hasattr(meta, "get") else meta
        hooked.append(sorted(d.keys()) if isinstance(d, dict) else repr(d))
    calls = []
    orig_lm = CompiledKernel.launch_metadata
    def lm(self, grid, stream, *args):
        calls.append((self.name, [type(a).__name__ for a in args][:6]))
        return orig_lm(self, grid, stream, *args)
    CompiledKernel.launch_metadata = lm
    knobs.runtime.launch_enter_hook = enter
    a = torch.arange(1000, device="cuda", dtype=torch.float32); b = torch.empty_like(a)
    add_one[(4,)](a, b, 1000, BLOCK=256)
    torch.cuda.synchronize()
    print("user kernel: hook", hooked[-1:], "launch_metadata calls", calls[-1:])
    k = add_one.cache[0] if hasattr(add_one, "cache") else None
    try:
        ck = next(iter(next(iter(add_one.device_caches.values()))[0].values()))
        print("compiled kernel asm keys", list(ck.asm.keys()))
        ttir = ck.asm["ttir"]
        print("ttir stores:", [ln.strip()[:160] for ln in ttir.splitlines() if "tt.store" in ln][:4])
        print("ttir func sig:", [ln.strip()[:300] for ln in ttir.splitlines() if "tt.func" in ln][:2])
        print("kernel src arg names", ck.src.fn.arg_names if hasattr(ck.src, "fn") else None)
        print("kernel signature", getattr(ck.src, "signature", None))
    except Exception as e:
        print("device_caches probe failed", type(e).__name__, e)

    # Inductor
    hooked.clear(); calls.clear()
    from torch._inductor.runtime import triton_heuristics as th
    runs = []
    orig_run = th.CachingAutotuner.run
    def run(self, *args, stream, **kw):
        runs.append((self.fn.__name__, list(self.mutated_arg_names), [type(a).__name__ for a in args][:6], stream))
        return orig_run(self, *args, stream=stream, **kw)
    th.CachingAutotuner.run = run
    print("CachingAutotuner.run sig", inspect.signature(orig_run))
    print("CachingAutotuner has _plugins:", hasattr(th.CachingAutotuner, "_plugins") or "_plugins" in inspect.getsource(th.CachingAutotuner.__init__))
    print("triton_meta keys sample later")
    @torch.compile
    def f(u, v):
        return (u * 2 + v).relu().sum(0), u.sin()
    u = torch.randn(64, 64, device="cuda"); v = torch.randn(64, 64, device="cuda")
    for _ in range(3):
        f(u, v)
    torch.cuda.synchronize()
    print("inductor: CachingAutotuner.run calls", len(runs), runs[:3])
    print("inductor: enter hook calls", len(hooked), hooked[:2], "launch_metadata calls", len(calls), calls[:2])
    @torch.compile
    def h(u):
        u.add_(1)
        return u
    h(u); h(u); torch.cuda.synchronize()
    print("inductor in-place: runs", runs[-2:])
    knobs.runtime.launch_enter_hook = None
except Exception:
    traceback.print_exc()

# 4. reduce-overhead: what trace events and ops appear
try:
    events.clear()
    @torch.compile(mode="reduce-overhead")
    def inf(a):
        return (a @ a).relu() + 1
    a = torch.randn(128, 128, device="cuda")
    with Seen() as m3:
        for _ in range(4):
            out = inf(a)
            out = out.clone()
    torch.cuda.synchronize()
    from collections import Counter
    print("reduce-overhead ops:", Counter(o for o, _, _ in m3.ops).most_common(12))
    print("reduce-overhead capturing ops:", sum(1 for _, c, _ in m3.ops if c))
    print("reduce-overhead trace:", Counter(n for n, _ in events))
except Exception:
    traceback.print_exc()
