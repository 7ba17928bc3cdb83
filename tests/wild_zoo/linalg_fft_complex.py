"""cuSOLVER, cuBLAS and cuFFT through torch.linalg and torch.fft, complex tensors included,
with their library workspaces: solve, QR, SVD, eigh, Cholesky, lstsq, rfft/irfft, fft2, and
a gradient through SVD."""
import torch

torch.manual_seed(0)
a = torch.randn(64, 64, device="cuda", dtype=torch.float64)
spd = a @ a.T + 64 * torch.eye(64, device="cuda", dtype=torch.float64)
b = torch.randn(64, 3, device="cuda", dtype=torch.float64)
x = torch.linalg.solve(spd, b)
q, r = torch.linalg.qr(a)
u, s, vh = torch.linalg.svd(a)
w, v = torch.linalg.eigh(spd)
c = torch.linalg.cholesky(spd)
ls = torch.linalg.lstsq(a[:, :32], b).solution
sig = torch.randn(8, 1024, device="cuda")
back = torch.fft.irfft(torch.fft.rfft(sig), n=1024)
z = torch.complex(torch.randn(32, 32, device="cuda"), torch.randn(32, 32, device="cuda"))
zf = torch.fft.fft2(z)
zz = (z @ z.conj().T).real.trace()
m = torch.randn(16, 16, device="cuda", requires_grad=True)
torch.linalg.svdvals(m).sum().backward()
vals = [x.sum(), (q @ r - a).abs().max(), s.sum(), w.sum(), c.diagonal().sum(), ls.sum(),
        (back - sig).abs().max(), zf.abs().sum(), zz, m.grad.abs().sum()]
print("ZOO result", " ".join(f"{float(t):.6g}" for t in vals))
