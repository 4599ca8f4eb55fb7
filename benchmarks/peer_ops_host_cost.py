"""Produces benchmarks/results/s27-2026-11-28/eager/peer-ops-host-cost.txt: the host time of
one call of each operation a peer gradient bucket issues (GradientReducer's PeerBuckets.launch),
each issued behind ~20 ms of queued GPU work so that none waits for the GPU: what an eager
step pays on the host per bucket. Medians of 5, per rank.

    torchrun --standalone --nproc-per-node 2 benchmarks/peer_ops_host_cost.py
"""
import gc
import os
import time

import torch
import torch.distributed as dist

from spikefuse.ops.mean_rows import mean_rows
from spikefuse.parallel import peer_memory

rank = int(os.environ["RANK"])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
peer_memory.enable(dist.group.WORLD)
rows, handle = peer_memory.mapped((3, 1 << 22), torch.float32, device, dist.group.WORLD, purpose="probe", fallback="-")
theirs = handle.get_buffer(1 - rank, (3, 1 << 22), torch.float32)
side = torch.cuda.Stream(device)
a = torch.randn(1 << 22, device=device)


def host_us(fn, reps=5):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda._sleep(40_000_000)  # ~20 ms of GPU time queued ahead
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        out.append((t1 - t0) * 1e6)
    return sorted(out)[len(out) // 2]


res = {
    "empty launch (a.add_)": host_us(lambda: a.add_(1)),
    "handle.barrier": host_us(lambda: handle.barrier(channel=0)),
    "copy_ from peer row": host_us(lambda: rows[0].copy_(theirs[1])),
    "mean_rows": host_us(lambda: mean_rows(rows[:2], rows[2])),
    "torch.cat out=": host_us(lambda: torch.cat([a[:1000], a[1000:]], out=rows[rank])),
}


def stream_switch():
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        pass


res["wait_stream + stream context"] = host_us(stream_switch)
with torch.cuda.stream(side):
    res["barrier on side stream"] = host_us(lambda: handle.barrier(channel=0))
print(rank, {k: round(v, 1) for k, v in res.items()}, flush=True)
gc.collect()
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
