"""Correct: two streams write disjoint halves of one tensor (rows, then columns), each
phase joined by the default stream before the next, which then reads it all."""
import torch

s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
main = torch.cuda.current_stream()
x = torch.empty(1024, 1024, device="cuda")


def fork():
    s1.wait_stream(main)
    s2.wait_stream(main)


def join():
    main.wait_stream(s1)
    main.wait_stream(s2)


fork()
with torch.cuda.stream(s1):
    x[:512].fill_(1.0)            # top rows
with torch.cuda.stream(s2):
    x[512:].fill_(2.0)            # bottom rows
join()
fork()
with torch.cuda.stream(s1):
    x[:, :512].mul_(3.0)          # left columns: strided, disjoint from the right ones
with torch.cuda.stream(s2):
    x[:, 512:].mul_(5.0)
join()
total = float(x.sum())
assert total == 512 * 512 * (3 + 5 + 6 + 10), total
print("ok", total)
