"""Ops with library temporaries and host synchronizations inside: sort, topk, unique with
counts, bincount, histc, cumsum, searchsorted, nonzero, multinomial, randperm, masked_select;
sparse COO and CSR products (cuSPARSE)."""
import torch

torch.manual_seed(0)
v = torch.randn(10000, device="cuda")
s, i = v.sort()
top = v.topk(10).values
u, counts = torch.randint(0, 50, (5000,), device="cuda").unique(return_counts=True)
bc = torch.bincount(torch.randint(0, 20, (1000,), device="cuda"))
h = torch.histc(v, bins=30, min=-3, max=3)
cs = v.cumsum(0)
pos = torch.searchsorted(s, torch.linspace(-2, 2, 9, device="cuda"))
nz = (v > 1).nonzero()
m = torch.multinomial(torch.softmax(v[:100], 0), 20, replacement=True)
perm = torch.randperm(1000, device="cuda")
sel = v.masked_select(v > 2)
idx = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]], device="cuda")
coo = torch.sparse_coo_tensor(idx, torch.ones(4, device="cuda"), (4, 4))
dense = torch.randn(4, 3, device="cuda")
sp = torch.sparse.mm(coo, dense)
csr = coo.to_sparse_csr()
mv = csr @ torch.ones(4, device="cuda")
vals = [s[0], top.sum(), counts.sum(), bc.sum(), h.sum(), cs[-1], pos.sum(), nz.shape[0], m.shape[0],
        perm.sum(), sel.shape[0], sp.sum(), mv.sum(), i.sum()]
print("ZOO result", " ".join(f"{float(t):.6g}" for t in vals))
