"""Produces benchmarks/results/s25-2026-11-28/profile-pipeline-before-<gpu>.txt and
s27-2026-11-28/profile-pipeline-*.txt (on 2 GPUs).

Where a pipelined step's time goes, captured as users run it: deep-lif (B = 16, T = 1024 or
as given, TF32) on one GPU unchunked and in C chunks (chunked_step; C = 8 and 16 or as given),
then the 2-stage PipelineTrainer.captured step at each C. Each: the median step time, and
the profiler's kernels over 2 replays grouped by name and by kind (GEMM, LIF, NCCL, bit
packing, other) with each rank's busy time, per step. Chrome traces of the first C's runs go
to OUT for a timeline.

    torchrun --standalone --nproc-per-node 2 benchmarks/profile_pipeline_captured.py OUT [T [C ...]]
"""
import collections
import datetime
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile

from spikefuse import precision
from spikefuse.capture import CapturedStep
from spikefuse.models import build_model
from spikefuse.parallel.pipeline import PipelineTrainer, chunked_step

T, B = 1024, 16
CHUNKS = (8, 16)


def loss_fn(outputs, target):
    return nn.functional.cross_entropy(outputs.mean(0), target)


def layers():
    torch.manual_seed(0)
    return build_model("deep-lif", (2048,), 10, None).layers


def kind(name):
    name = name.lower()
    for word, label in (("nccl", "nccl"), ("gemm", "gemm"), ("cutlass", "gemm"), ("xmma", "gemm"),
                        ("lif", "lif"), ("pack", "pack")):
        if word in name:
            return label
    return "other"


def busy_us(intervals):
    """Length of the union of [start, end) intervals: time the GPU ran at least one kernel."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def kernel_table(prof, tag, rank, reps):
    by_name, by_kind = collections.defaultdict(lambda: [0, 0.0]), collections.defaultdict(float)
    intervals = []  # of the non-NCCL kernels (NCCL's receives spin, resident, while others compute)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += 1
            by_name[e.name][1] += e.device_time_total
            by_kind[kind(e.name)] += e.device_time_total
            if kind(e.name) != "nccl":
                intervals.append((e.time_range.start, e.time_range.end))
    lines = [f"== {tag} rank {rank}: {sum(c for c, _ in by_name.values()) / reps:.0f} kernels/step, kernel time "
             f"{sum(by_kind.values()) / reps / 1e3:.3f} ms/step, busy (union of non-NCCL kernels) "
             f"{busy_us(intervals) / reps / 1e3:.3f} ms/step; "
             + ", ".join(f"{k} {v / reps / 1e3:.3f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]))]
    for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:30]:
        lines.append(f"   {count / reps:7.1f} x {us / max(count, 1):8.1f} us = {us / reps / 1e3:7.3f} ms  {name[:110]}")
    return "\n".join(lines)


def main(out):
    os.makedirs(out, exist_ok=True)
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    host = dist.new_group(backend="gloo")

    def median_ms(fn, together=False, reps=10):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            if together:
                dist.barrier(group=host)
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        if together:  # the slower rank's time
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host)
            times = t.tolist()
        return sorted(times)[len(times) // 2] * 1e3

    def profiled(fn, tag, trace=False, reps=2):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        if trace:
            prof.export_chrome_trace(f"{out}/{tag}-r{rank}.json")
        return kernel_table(prof, tag, rank, reps)

    g = torch.Generator().manual_seed(T)
    x = (torch.rand(T, B, 2048, generator=g) < 0.2).float().to(device)
    y = torch.randint(0, 10, (B,), generator=g).to(device)
    log = []
    with precision.applied("fp32"):
        if rank == 0:  # one GPU, while rank 1 waits on the host
            net = layers().to(device)

            def whole(x, y):
                net.zero_grad(set_to_none=True)
                loss_fn(net(x), y).backward()
            for C in (1, *CHUNKS):
                def chunked(x, y, C=C):
                    net.zero_grad(set_to_none=True)
                    return chunked_step(list(net), x, y, loss_fn, C)
                step = CapturedStep(whole if C == 1 else chunked, name=f"one GPU, {C} chunks")
                tag = "one-unchunked" if C == 1 else f"one-chunked{C}"
                log.append(f"one GPU, {C} chunks: {median_ms(lambda: step(x, y)):.3f} ms")
                log.append(profiled(lambda: step(x, y), tag, trace=C == CHUNKS[0]))
            net = step = None  # freed before the pipeline runs
            torch.cuda.empty_cache()
        dist.barrier(group=host)
        for C in CHUNKS:
            trainer = PipelineTrainer(layers(), loss_fn, C, device=device)
            step = trainer.captured()
            run = lambda: step(x if rank == 0 else T, y)  # noqa: E731
            ms = median_ms(run, together=True)
            dist.barrier(group=host)
            table = profiled(run, f"pipe{C}", trace=C == CHUNKS[0])
            tables = [None, None]
            dist.all_gather_object(tables, table, group=host)
            log.append(f"pipeline, 2 stages, {C} chunks: {ms:.3f} ms\n" + "\n".join(tables))
            trainer = step = run = None
            torch.cuda.empty_cache()
    if rank == 0:
        print("\n".join(log), flush=True)
    dist.barrier(group=host)
    gc.collect()  # CUDA graphs holding NCCL work go first (pytorch#115388)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 2:
        T = int(sys.argv[2])
        CHUNKS = tuple(int(c) for c in sys.argv[3:]) or CHUNKS
    main(sys.argv[1])
