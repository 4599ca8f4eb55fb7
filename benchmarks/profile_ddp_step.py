"""Produces benchmarks/results/profile-ddp-step-<gpu>.txt (stdout; 2 GPUs, torchrun).

Where a data-parallel CIFAR-medium step spends its time (torchrun, 2 GPUs): per mode, the
host's issue time and the wall time per step, and rank 0's torch.profiler table.
    torchrun --nproc-per-node 2 benchmarks/profile_ddp_step.py eager captured
TRACE_DIR=DIR: every rank's profiler timeline as DIR/<mode>-rank<r>-of-<n>.json (chrome trace)."""
import os
import statistics
import sys
import time

import torch

from spikefuse.bench.parallel_ddp import inputs, make_step
from spikefuse.parallel import init_data_parallel

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
dp = init_data_parallel("cuda")
for mode in sys.argv[1:]:
    step, _, _ = make_step(mode, "fp32", dp.device, dp)
    batches = inputs(dp.device, dp.rank)
    for i in range(15):
        step(*batches[i % 2])
    times = []
    for i in range(10):
        torch.cuda.synchronize()
        torch.distributed.barrier()
        t = time.perf_counter()
        step(*batches[i % 2])
        host = time.perf_counter() - t
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t, host))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as p:
        for i in range(3):
            step(*batches[i % 2])
        torch.cuda.synchronize()
    if os.environ.get("TRACE_DIR"):
        p.export_chrome_trace(os.path.join(os.environ["TRACE_DIR"], f"{mode}-rank{dp.rank}-of-{dp.world_size}.json"))
    if dp.is_main:
        print(f"== {mode}: wall {statistics.median(a for a, _ in times) * 1e3:.2f} ms, host issue "
              f"{statistics.median(b for _, b in times) * 1e3:.2f} ms per step (one at a time)", flush=True)
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=18))
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
torch.distributed.destroy_process_group()
