"""Produces benchmarks/results/profile-pipeline-chunks-eager-<gpu>.txt (stdout; on a GPU).

Why a chunk of the pipeline costs more than its share: deep-lif (B=16, T=1024) on one GPU,
chunked_step at C = 1, 4, 16 timed, then profiled at C = 16 (host: cProfile; GPU: torch.profiler)."""
import cProfile
import pstats
import statistics
import time

import torch
from torch import nn

from spikefuse.models import build_model
from spikefuse.parallel.pipeline import chunked_step
from spikefuse.parallel.planner import measure_link

torch.set_float32_matmul_precision("high")
torch.manual_seed(0)
layers = build_model("deep-lif", (2048,), 10, None).layers.cuda()
T, B = 1024, 16
x = (torch.rand(T, B, 2048, device="cuda") < 0.2).float()
y = torch.randint(0, 10, (B,), device="cuda")


def loss(o, y):
    return nn.functional.cross_entropy(o.mean(0), y)


def step(C):
    layers.zero_grad(set_to_none=True)
    chunked_step(layers, x, y, loss, C)


for C in (1, 4, 16, 64):
    for _ in range(3):
        step(C)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step(C)
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t, host))
    print(f"C={C}: {statistics.median(a for a, _ in times) * 1e3:.2f} ms wall, host issue "
          f"{statistics.median(b for _, b in times) * 1e3:.2f} ms", flush=True)
prof = cProfile.Profile()
torch.cuda.synchronize()
prof.enable()
step(16)
torch.cuda.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(20)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
    step(16)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cpu_time_total", row_limit=25))
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=15))
if torch.cuda.device_count() > 1:
    print("link (alone on the machine): latency %.1f us, bandwidth %.0f GB/s" % (
        lambda l: (l[0] * 1e6, l[1] / 1e9))(measure_link()))
