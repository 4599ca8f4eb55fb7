"""Produces benchmarks/results/s27-2026-11-28/eager/probe*.json: is the eager data-parallel
CIFAR-medium step slow because of data parallel or because of the host? Each rank times the
1-GPU eager step alone (both ranks at once, no collective in it), then the DP steps
(`bench parallel_ddp` modes) at the reducer's default bucket size and at 16 and 64 MB, two
rounds, then the 1-GPU step again. Per case: back-to-back steps (20, one sync: what the host
allows), the synchronized wall time and the host's issue time (the call's return), medians.

    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/eager_dp_probe.py
"""
import gc
import json
import os
import statistics
import time

import torch

import spikefuse.bench.parallel_ddp as P
from spikefuse.parallel import init_data_parallel

local = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local)
torch.cuda.set_device(device)
P.precisions.applied("fp32").__enter__()


def probe(mode, dp):
    step, model, reducer = P.make_step(mode, "fp32", device, dp)
    batches = P.inputs(device, local)
    for i in range(8):
        step(*batches[i % 2])
    torch.cuda.synchronize()
    walls, issues = [], []
    for i in range(30):
        if dp is not None:
            torch.distributed.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(*batches[i % 2])
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        issues.append((t1 - t0) * 1e3)
        walls.append((t2 - t0) * 1e3)
    # back to back (the host may run ahead): 20 steps, one sync
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(20):
        step(*batches[i % 2])
    torch.cuda.synchronize()
    b2b = (time.perf_counter() - t0) / 20 * 1e3
    del step, model, reducer
    torch.cuda.empty_cache()
    return {"wall_ms": statistics.median(walls), "host_issue_ms": statistics.median(issues), "back_to_back_ms": b2b}


res = {"alone (both ranks at once)": probe("eager", None)}
dp = init_data_parallel("cuda")
for rnd in range(2):
    for mode in ("eager-local-bn", "eager", "captured-local-bn", "captured"):
        for mb in (None, 16.0, 64.0):
            if mode.startswith("captured") and mb == 16.0:
                continue
            P.BUCKET_MB = mb
            res[f"{mode} @{mb or 'default'} r{rnd}"] = probe(mode, dp)
P.BUCKET_MB = None
res["alone again"] = probe("eager", None)
print(local, json.dumps(res), flush=True)
out = os.environ.get("OUT")
if out:
    with open(f"{out}/eager-probe-r{local}.json", "w") as f:
        json.dump(res, f, indent=1)
gc.collect()  # CUDA graphs holding NCCL work go first (pytorch#115388)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
