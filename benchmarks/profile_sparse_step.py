"""Produces benchmarks/results/profile-sparse-step[-b<B>]-<gpu>.txt (stdout; on a GPU).

Where the GPU time of a training step goes (torch.profiler, kernel totals per name): the
IPU-SHD network at width x4, batch 1, dense and sparse (natural activity, lr 0), and the
recurrent LIF alone at T=100, B=32, N=1024. Eager steps (the same kernels a captured step
replays).    python3 benchmarks/profile_sparse_step.py [BATCH ...] [--no-rlif]"""
import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import spikefuse.functional as F
from spikefuse.models.ipu import IPUNet
from spikefuse.optim import LazyAdam

torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"


def top(prof, title, steps, n=14):
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = e.name[:90]
            t, c = rows.get(k, (0.0, 0))
            rows[k] = (t + e.device_time, c + 1)
    total = sum(t for t, _ in rows.values())
    print(f"\n== {title}: GPU kernel time {total / steps / 1e3:.3f} ms per step, {sum(c for _, c in rows.values()) // steps} kernels")
    for k, (t, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"  {t / steps / 1e3:8.4f} ms  {c // steps:5d}x  {k}")


batches = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1]
for batch, mode in [(b, m) for b in batches for m in ("dense", "sparse")]:
    torch.manual_seed(0)
    with torch.device(dev):
        model = IPUNet((700,), 20, width=4, sparse=mode == "sparse", **({"grad_threshold": 0.9} if mode == "sparse" else {}))
    opt = (LazyAdam(model.parameters(), lr=0.0) if mode == "sparse"
           else torch.optim.Adam(model.parameters(), lr=0.0, fused=True))
    x = (torch.rand(100, batch, 700, device=dev) < 0.05).float()
    y = torch.randint(0, 20, (batch,), device=dev)

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    top(prof, f"ipu-shd x4 B={batch} {mode}", 5)

if "--no-rlif" in sys.argv:
    raise SystemExit(0)

x = torch.randn(100, 32, 1024, device=dev) * 0.5 + 0.3
w = (torch.randn(1024, 1024, device=dev) / 32 * 0.5).requires_grad_(True)
g = torch.randn(100, 32, 1024, device=dev)
for sparse in (False, True):
    def rstep():
        xi = x.clone().requires_grad_(True)
        (F.rlif(xi, w, backend="fused", sparse=sparse, grad_threshold=0.9) * g).sum().backward()
    for _ in range(2):
        rstep()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            rstep()
        torch.cuda.synchronize()
    top(prof, f"rlif T=100 B=32 N=1024 {'sparse' if sparse else 'dense'}", 3)
