"""Produces benchmarks/results/bf16-bisect-2026-11-28/regress-*.json: CIFAR-medium's 1-GPU step
(T=10, B=64, SGD, TF32 on) of the spikefuse tree on PYTHONPATH: the captured step's median ms
(15 x 10 replays) in fp32 and bf16, and the eager step's kernels by GPU time (profiler, 5 steps).
Old trees come from `git archive COMMIT src`; every tree runs in a process of its own.
    PYTHONPATH=TREE/src python benchmarks/bf16_step_profile.py LABEL OUT.json"""
import json, sys, statistics
import torch
from torch import nn
from spikefuse.models import build_model
from spikefuse.train.capture import CapturedStep, prepare_optimizer

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
label, out = sys.argv[1], sys.argv[2]
dev = torch.device("cuda")
res = {"label": label}


def make(prec):
    torch.manual_seed(0)
    model = build_model("cifar-medium", (3, 32, 32), 10, 10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    prepare_optimizer(opt)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16", cache_enabled=False):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


g = torch.Generator(device=dev).manual_seed(1)
x = torch.randn(64, 3, 32, 32, device=dev, generator=g)
y = torch.randint(0, 10, (64,), device=dev, generator=g)
for prec in ("fp32", "bf16"):
    raw = make(prec)
    cap = CapturedStep(raw)
    for _ in range(8):
        cap(x, y)
    torch.cuda.synchronize()
    meds = []
    for r in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            cap(x, y)
        b.record()
        b.synchronize()
        meds.append(a.elapsed_time(b) / 10)
    res[prec + "_captured_ms"] = statistics.median(meds)
    for _ in range(3):
        raw(x, y)
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            raw(x, y)
        torch.cuda.synchronize()
    kern = {}
    for e in p.events():
        if e.device_type.name == "CUDA":
            k = kern.setdefault(e.name[:90], [0.0, 0])
            k[0] += e.device_time / 5 / 1000
            k[1] += 1
    res[prec + "_kernels_ms"] = sorted(([n, round(t, 4), c // 5] for n, (t, c) in kern.items()), key=lambda r: -r[1])[:40]
    res[prec + "_kernel_total_ms"] = sum(t for t, _ in kern.values()) / 1
    print(label, prec, res[prec + "_captured_ms"], res[prec + "_kernel_total_ms"], flush=True)
json.dump(res, open(out, "w"), indent=1)
