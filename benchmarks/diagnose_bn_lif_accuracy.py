"""Produces the last table of benchmarks/results/fuzz-long-2026-11-26.md (stdout).

Where the fused BN+LIF dL/dx loses float32 accuracy (issue 36, the fuzz cases): per quantity of
the forward and the backward, the relative norm distance from float64 of the fused kernels'
value and of torch's float32 reference (nn.BNLIF's reference backend). On the CPU, the kernels
through Triton's interpreter: PYTHONPATH=src python benchmarks/diagnose_bn_lif_accuracy.py
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU tensors

import torch  # noqa: E402

import spikefuse.functional as F  # noqa: E402
from spikefuse.nn import BNLIF  # noqa: E402
from spikefuse.ops import bn_lif as ops  # noqa: E402
from spikefuse.surrogates import DEFAULT_ALPHA  # noqa: E402

# (x seed, parameter seed, threshold, decay); x [8, 2, 2, 3], affine, hard reset, fast_sigmoid:
# SPIKEFUSE_FUZZ_SEED=2's example, and the first open case's threshold and decay on its x
CASES = {"threshold 0, decay 0.2": (52902, 19146, 0.0, 0.2),
         "threshold 1, decay 0.5": (52902, 19146, 1.0, 0.5)}
SHAPE, ALPHA = (8, 2, 2, 3), DEFAULT_ALPHA["fast_sigmoid"]


def module(threshold, decay, stats_seed, dtype):
    m = BNLIF(SHAPE[2], decay=decay, threshold=threshold, surrogate="fast_sigmoid",
              backend="reference").to(dtype)
    g = torch.Generator().manual_seed(stats_seed)
    with torch.no_grad():  # as tests/test_fuzz_properties.py
        m.weight.copy_(torch.rand(SHAPE[2], generator=g) + 0.5)
        m.bias.copy_(torch.rand(SHAPE[2], generator=g) * 0.6 - 0.3)
    return m


def reference(x, w, threshold, decay, stats_seed, dtype):
    """Every intermediate of the reference (nn.BNLIF's: torch batch norm, then reference.lif) in `dtype`."""
    m = module(threshold, decay, stats_seed, dtype)
    x = x.to(dtype).requires_grad_()
    # what F.batch_norm runs, with its saved statistics
    y, mean, invstd = torch.native_batch_norm(x.flatten(0, 1), m.weight, m.bias, None, None, True, 0.1,
                                              m.eps)
    mean, invstd = mean.view(-1, 1), invstd.view(-1, 1)
    y = y.unflatten(0, SHAPE[:2])
    y.retain_grad()
    s, h = F.lif(y, decay=decay, threshold=threshold, reset="hard", surrogate="fast_sigmoid",
                 backend="reference", return_potential=True)
    (s * w.to(dtype)).sum().backward()
    xhat = (x - mean) * invstd
    dims = (0, 1, 3)
    return dict(mean=mean, invstd=invstd, xhat=xhat, y=y, h=h, gy=y.grad, sum_gy=y.grad.sum(dims).view(-1, 1),
                sum_gyx=(y.grad * xhat).sum(dims).view(-1, 1), gx=x.grad)


def fused(x, w, threshold, decay, stats_seed):
    """The fused kernels' intermediates: stats, h recomputed as the kernels do (no FMA), and the
    backward's dL/dy (returned as dL/dresidual of a zero residual: y + 0 rounds alike), sums, dL/dx."""
    m = module(threshold, decay, stats_seed, torch.float32)
    stats = ops._statistics(x, m.weight, m.bias, None, None, True, 0.1, m.eps)
    mean, invstd, a, b = (s.view(-1, 1) for s in stats)
    y = x * a + b
    h, v = torch.empty_like(y), torch.zeros_like(y[0])
    for t in range(SHAPE[0]):
        h[t] = decay * v + y[t]
        v = torch.where(h[t] >= threshold, 0.0, h[t])
    rest = (torch.empty(0, x[0].numel()), stats, decay, None, threshold, "hard", 0.0, False,
            "fast_sigmoid", ALPHA, True, False, SHAPE[0])  # ckpt: none for T = 8
    gx, _, sums, _ = ops._backward(w, x, None, *rest)
    gy = ops._backward(w, x, torch.zeros_like(x), *rest)[1]
    xhat = (x - mean) * invstd
    return dict(mean=mean, invstd=invstd, xhat=xhat, y=y, h=h, gy=gy, sum_gy=sums[0].view(-1, 1),
                sum_gyx=sums[1].view(-1, 1), gx=gx)


def distance(a, e):
    a, e = a.double().reshape(-1), e.double().reshape(-1)
    return ((a - e).norm() / e.norm().clamp_min(1e-300)).item()


def main():
    for name, (x_seed, stats_seed, threshold, decay) in CASES.items():
        x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(x_seed)) + 0.3
        w = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1000)).bfloat16().float()
        r64, r32 = (reference(x, w, threshold, decay, stats_seed, d) for d in (torch.float64, torch.float32))
        f32 = fused(x, w, threshold, decay, stats_seed)
        print(f"{name}: relative distance from float64, fused / float32 reference")
        for key, exact in r64.items():
            exact = exact.detach()
            print(f"  {key:8s} {distance(f32[key], exact):.2e} / {distance(r32[key].detach(), exact):.2e}")
        ulps = (f32["mean"] - r64["mean"].detach()) / (torch.finfo(torch.float32).eps * r64["mean"].detach().abs())
        print("  fused batch mean off by", [f"{e:.1f}" for e in ulps.flatten().tolist()], "float32 ulps")


if __name__ == "__main__":
    main()
