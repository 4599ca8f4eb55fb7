"""Produces benchmarks/results/profile-dense-wide-<gpu>.json (argv[1]) and .txt (stdout); on a GPU.

Where the captured dense step of the IPU SHD network spends its GPU time at width x1/x4/x16,
batch 1/8 (the regime issue 16 targets), and how sparse its layers are at initialisation:
per (t, b) row, the share of neurons that spike and that sit at or above 0.9 of the
threshold (the sparse backward's gradient-carrying set). Eager steps under the profiler,
kernels grouped by name; prints one block per case.

    python3 benchmarks/profile_dense_wide.py [OUT.json]
"""
import json
import sys
from collections import defaultdict

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from spikefuse.models.ipu import IPUNet
from spikefuse.nn import LIF

torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"
results = []
for width in (1, 4, 16):
    for B in (1, 8):
        torch.manual_seed(0)
        model = IPUNet((700,), 20, width=width).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
        x = (torch.rand(100, B, 700, device=dev) < 0.05).float()
        y = torch.randint(0, 20, (B,), device=dev)
        stats = []

        def hook(mod, inp, out):
            h_in = inp[0].detach()
            # membrane before firing, from the reference (same equations)
            v = torch.zeros_like(h_in[0]); hs = []
            for t in range(h_in.shape[0]):
                h = 0.95 * v + h_in[t]; hs.append(h); v = torch.where(h >= 1.0, torch.zeros_like(h), h)
            h = torch.stack(hs)
            spk = (out.detach() > 0).float().flatten(0, 1)
            near = (h >= 0.9).float().flatten(0, 1)
            stats.append({"n": out.shape[-1], "mean_rate": spk.mean().item(), "max_row_rate": spk.mean(1).max().item(),
                          "carry_mean": near.mean().item(), "carry_max_row": near.mean(1).max().item(),
                          "ever_carry": near.amax(0).mean().item(), "ever_spike": spk.amax(0).mean().item()})
        hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, LIF)]
        model(x); [h.remove() for h in hooks]

        def step():
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        for _ in range(3): step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): step()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                per[e.name[:90]] += e.device_time / 1e3 / 5
        total = sum(per.values())
        top = sorted(per.items(), key=lambda kv: -kv[1])[:14]
        print(f"\n== width x{width} B={B}: kernel time {total:.3f} ms/step; activity {stats}")
        for name, ms in top:
            print(f"  {ms:8.4f} ms  {name}")
        results.append({"width": width, "B": B, "kernel_ms": total, "top": top, "activity": stats})
        model = opt = None  # freed before the next width
        torch.cuda.empty_cache()
if len(sys.argv) > 1:
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": results},
              open(sys.argv[1], "w"), indent=1)
