"""Produces benchmarks/results/multi-gpu-*/dp-overhead-*.json: where the 2-GPU captured
CIFAR-medium step's extra time over one GPU comes from. Each rank times, in turn, the
1-GPU captured step before any process group exists ("alone", both GPUs busy at once), the
same step after init_data_parallel ("alone-after-init": no collective in it), the
data-parallel steps (bench parallel_ddp modes; GradientReducer unless -ddp), variants of
the local-BN step ("@bN": N MB buckets; "@hp": the gradients on a NCCL group whose stream
has high priority; "@nccl", "@peer": the gradient buckets' transport), and "alone" again; the slowest rank's medians.
    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/dp_overhead.py TAG [CASE ...]"""
import dataclasses
import json
import os
import sys

import torch
import torch.distributed as dist

import spikefuse.bench.parallel_ddp as P
from spikefuse.parallel import init_data_parallel

tag = sys.argv[1] if len(sys.argv) > 1 else "default"
cases = sys.argv[2:] or ["alone-after-init", "captured-local-bn", "captured", "captured-ddp", "alone-again"]
local = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local)
torch.cuda.set_device(device)
P.precisions.applied("fp32").__enter__()  # as the bench runs
results = {"alone": P.measure("captured", "fp32", device, None).get("step_ms")}
dp = init_data_parallel("cuda")
options = dist.ProcessGroupNCCL.Options()
options.is_high_priority_stream = True
high = dataclasses.replace(dp, group=dist.new_group(list(range(dp.world_size)), pg_options=options))
for name in cases:
    dist.barrier()
    mode, _, variant = name.partition("@")
    world = None if mode.startswith("alone") else (high if variant == "hp" else dp)
    P.BUCKET_MB = float(variant[1:]) if variant.startswith("b") else None
    P.GRAD_TRANSPORT = variant if variant in ("nccl", "peer") else "auto"
    results[name] = P.measure("captured" if mode.startswith("alone") else mode, "fp32", device, world).get("step_ms")
slowest = {}
for name, ms in results.items():
    t = torch.tensor([ms if ms is not None else float("nan")], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    slowest[name] = float(t)
if dp.is_main:
    print(tag, json.dumps(slowest), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"dp-overhead-{tag}.json"), "w") as f:
        json.dump({"tag": tag, "slowest_rank_ms": slowest, "env": {k: v for k, v in os.environ.items()
                                                                   if k.startswith(("NCCL_", "TORCH_NCCL"))}}, f, indent=1)
dist.destroy_process_group()
