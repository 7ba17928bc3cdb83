"""Bug: a reduction over a tensor nothing wrote (torch.empty): the result is garbage."""
import torch


def make_scores(n):
    scores = torch.empty(n, device="cuda")     # uninitialized
    scores[: n // 2] = 1.0                      # only half of it is filled
    return scores


scores = make_scores(4096)
print("mean", float(scores.mean()))
