"""Produces benchmarks/results/pipeline-nccl-channels-<gpu>.txt (stdout; 2 GPUs, torchrun).

Does the pipeline lose time to NCCL kernels spinning beside its GEMMs? deep-lif (B=16) on
2 GPUs, captured: the one-GPU step and the pipeline at given T and chunk counts, under
whatever NCCL_MAX_P2P_NCHANNELS the launch sets (how many SMs a send/recv may occupy).
    NCCL_MAX_P2P_NCHANNELS=2 torchrun --nproc-per-node 2 benchmarks/pipeline_channels.py 16384:32 4096:16"""
import datetime
import gc
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from spikefuse.models import build_model
from spikefuse.parallel.pipeline import PipelineTrainer
from spikefuse.capture import CapturedStep

rank = int(os.environ["RANK"])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
torch.set_float32_matmul_precision("high")
dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))
host = dist.new_group(backend="gloo")


def loss_fn(out, y):
    return nn.functional.cross_entropy(out.mean(0), y)


def layers():
    torch.manual_seed(0)
    return build_model("deep-lif", (2048,), 10, None).layers


def timed(step, reps=5, warmup=5):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier(group=host)
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host)
    return t.item()


for spec in sys.argv[1:]:
    T, C = map(int, spec.split(":"))
    g = torch.Generator().manual_seed(T)
    x = ((torch.rand(T, 16, 2048, generator=g) < 0.2).float()).to(device)
    y = torch.randint(0, 10, (16,), generator=g).to(device)
    single = None
    if rank == 0:  # alone on its GPU (rank 1 waits on the host)
        net = layers().to(device)

        def run(x, y):
            net.zero_grad(set_to_none=True)
            loss_fn(net(x), y).backward()
        step = CapturedStep(run)
        for _ in range(5):
            step(x, y)
        ts = []
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step(x, y)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        single = statistics.median(ts)
        del step, net
        torch.cuda.empty_cache()
    dist.barrier(group=host)
    trainer = PipelineTrainer(layers(), loss_fn, C, device=device)
    pstep = trainer.captured()
    seconds = timed(lambda: pstep(x if rank == 0 else T, y))
    if rank == 0:
        print(f"NCCL_MAX_P2P_NCHANNELS={os.environ.get('NCCL_MAX_P2P_NCHANNELS', 'default')} T={T} C={C}: one GPU "
              f"{single * 1e3:.1f} ms, pipeline {seconds * 1e3:.1f} ms, {single / seconds:.3f}x, "
              f"captured {pstep.graphs.captured > 0}", flush=True)
    trainer = pstep = None  # the graphs go before the next setting
    torch.cuda.empty_cache()
dist.barrier(group=host)
gc.collect()
torch.cuda.synchronize()
dist.destroy_process_group()
