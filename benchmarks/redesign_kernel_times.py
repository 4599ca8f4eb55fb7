"""Produces benchmarks/results/redesign-kernel-times-<gpu>.jsonl (one line per run, appended by the caller); on a GPU.

GPU kernel time (torch.profiler, summed over kernels) of one forward+backward per neuron
case, for the tree on PYTHONPATH: issue 33's before/after check. Prints one JSON line.
Issue 33 ran it three times per tree, alternating, each tree on PYTHONPATH in its own process:
    for r in 1 2 3; do PYTHONPATH=OLD/src python3 benchmarks/redesign_kernel_times.py before >> F; PYTHONPATH=src python3 benchmarks/redesign_kernel_times.py after >> F; done
"""
import json, sys
import torch
import spikefuse.functional as F
from torch.profiler import profile, ProfilerActivity

torch.manual_seed(0)
dev = "cuda"
def case(name, fn, shape, dtype=torch.float32, weight=False):
    x = (torch.randn(*shape, device=dev) * 0.6 + 0.4).to(dtype).requires_grad_()
    w = (torch.randn(shape[-1], shape[-1], device=dev) / shape[-1] ** 0.5).requires_grad_() if weight else None
    g = torch.randn(*shape, device=dev).to(dtype)
    def step():
        s = fn(x, w) if weight else fn(x)
        s.backward(g)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    n = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    total = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    return name, total / n / 1000.0  # ms per forward+backward

decay = lambda: torch.full((64,), 0.8, device=dev, requires_grad=True)
cases = [
    case("lif fp32 100x64x4096", lambda x: F.lif(x, 0.5), (100, 64, 4096)),
    case("lif fp32 500x16x4096", lambda x: F.lif(x, 0.5), (500, 16, 4096)),
    case("lif fp32 1000x8x8192", lambda x: F.lif(x, 0.5), (1000, 8, 8192)),
    case("lif bf16 100x64x4096", lambda x: F.lif(x, 0.5), (100, 64, 4096), torch.bfloat16),
    case("lif bf16 500x16x4096", lambda x: F.lif(x, 0.5), (500, 16, 4096), torch.bfloat16),
    case("alif 100x32x1024", lambda x: F.alif(x), (100, 32, 1024)),
    case("cuba 100x32x1024", lambda x: F.cuba(x), (100, 32, 1024)),
    case("plif 100x32x64x16", lambda x, d=decay(): F.plif(x, d), (100, 32, 64, 16)),
    case("rlif 100x32x1024", lambda x, w: F.rlif(x, w), (100, 32, 1024), weight=True),
    case("ralif 100x32x1024", lambda x, w: F.ralif(x, w), (100, 32, 1024), weight=True),
]
print(json.dumps({"tree": sys.argv[1], "ms": dict(cases)}))
