"""Shared by the zoo's Triton programs: a kernel writing Y = X + 1 under a mask (n), and one
whose mask is wrong (writes `extra` elements past n)."""
import triton
import triton.language as tl


@triton.jit
def add_one(X, Y, N, EXTRA, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < N, other=0.0) + 1.0, mask=i < N + EXTRA)


def launch(x, y, extra=0):
    n = x.numel()
    add_one[(triton.cdiv(n + extra, 256),)](x, y, n, extra, BLOCK=256)
