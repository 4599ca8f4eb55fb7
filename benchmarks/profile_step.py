"""Produces benchmarks/results/profile-train-data-<gpu>.txt and profile-train-bits-<gpu>.txt (stdout; on a GPU).

Profile fused CIFAR-medium training steps (fp32 with TF32, bf16 autocast) and a few GPU-store data batches (H200)."""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from spikefuse.bench.train import build, make_step
from spikefuse.data import load

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
dev = torch.device("cuda")
model = build("spikefuse-fused", "medium", 1.0, 10, "auto").to(dev)
x = torch.randn(64, 3, 32, 32, device=dev)
y = torch.randint(0, 10, (64,), device=dev)
for precision in ("fp32", "bf16"):
    step = make_step(model, x, y, precision, "sgd")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    print(f"fused {precision} step: peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB, "
          f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MiB beyond model + optimizer + batch")
    # host time to issue a step (3 steps queue far fewer launches than CUDA's queue holds)
    # against the GPU's time per step: which one bounds the step
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(3):
        step()
    end.record()
    host_ms = (time.perf_counter() - t0) / 3 * 1e3
    torch.cuda.synchronize()
    print(f"fused {precision} step: host {host_ms:.2f} ms to issue, GPU {start.elapsed_time(end) / 3:.2f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70))

splits = load("shd-synthetic", time_steps=250, device="cuda")
batches = splits.train.batches(128, shuffle=True, generator=torch.Generator().manual_seed(0))
next(batches)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        xb, yb = next(batches)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
