"""Produces benchmarks/results/s27-2026-11-28/eager/cprofile-*.txt: Python's profile of rank
0's eager CIFAR-medium steps (20 after warm-up): the 1-GPU step (no collective in it), then
data parallel with local BN and with SyncBN on 2 GPUs; the functions by own time.

    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/eager_dp_cprofile.py
"""
import cProfile
import gc
import io
import os
import pstats

import torch

import spikefuse.bench.parallel_ddp as P
from spikefuse.parallel import init_data_parallel

local = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local)
torch.cuda.set_device(device)
P.precisions.applied("fp32").__enter__()


def prof(mode, dp, tag):
    step, model, reducer = P.make_step(mode, "fp32", device, dp)
    batches = P.inputs(device, local)
    for i in range(8):
        step(*batches[i % 2])
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for i in range(20):
        step(*batches[i % 2])
    torch.cuda.synchronize()
    pr.disable()
    if local == 0:
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(pr, stream=s).strip_dirs().sort_stats(key).print_stats(45)
            with open(f"{os.environ['OUT']}/cprofile-{tag}-{key}.txt", "w") as f:
                f.write(s.getvalue())
    del step, model, reducer
    torch.cuda.empty_cache()


dp = init_data_parallel("cuda")
prof("eager", None, "alone")
prof("eager-local-bn", dp, "dp-local-bn")
prof("eager", dp, "dp-syncbn")
gc.collect()
torch.distributed.barrier()
torch.distributed.destroy_process_group()
