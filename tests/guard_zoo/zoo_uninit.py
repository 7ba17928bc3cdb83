"""A read of torch.empty memory that nothing wrote: under the guard it reads the
poison pattern; with the sanitizer's op front end on, it is reported."""

import torch

x = torch.empty(1024, device="cuda")  # SITE:x
y = x * 2  # reads never-written memory
raw = x.view(torch.uint8)
print("ZOO poison seen:", bool((raw == 0xA5).all()))
print("ZOO value", float(y[0]))
