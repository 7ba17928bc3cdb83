"""A PyTorch program that never touches CUDA: it must run unchanged under --guard."""

import torch

x = torch.arange(100, dtype=torch.float32)
print("ZOO cpu", float((x * 2).sum()))
