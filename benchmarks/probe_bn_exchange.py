"""Produces benchmarks/results/multi-gpu-*/bn-exchange-probe-*.json: what one SyncBN exchange
over peer memory costs inside a CUDA graph (an isolated measurement, not a training step).

A graph of 18 backward exchanges (spikefuse.ops.bn_peer_exchange.exchange_sums, 18 sites as
CIFAR-medium's 9 layers have), replayed back to back, against a graph of 18 local kernels of
the same shape (the scale the exchange also applies); optionally with a busy kernel of ~40 us
before each, so that the ranks arrive apart as in a step. Per exchange: (graph - local graph)
/ 18, CUDA events, medians of 7 rounds of 50 replays, slowest rank.

    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/probe_bn_exchange.py
"""
import json
import os
import statistics

import torch
import torch.distributed as dist

from spikefuse.ops.bn_peer_exchange import exchange_sums
from spikefuse.parallel import sync_bn

SITES = 18


def replay_us(graph, reps=50, rounds=7):
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps * 1e3)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    ranks = sync_bn.RankSync(None, "symmetric")
    out = {"world": world, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    busy_a = torch.randn(1024, 1024, device=device)
    for C in (64, 256):
        sums = torch.randn(2, C, device=device) + rank
        scale = torch.full((1,), 0.5, device=device)
        ranks.peer_memory(sums)
        for busy in (False, True):
            def body(exchange):
                for site in range(SITES):
                    if busy:
                        torch.mm(busy_a, busy_a)  # ~40 us: ranks reach the exchange at their own pace
                    if exchange:
                        exchange_sums(sums, scale, rank, world, ranks.peer_buffers((site, C), 2 * C, C, device))
                    else:
                        sums.mul(scale)
            graphs = {}
            for exchange in (False, True):
                body(exchange)  # compile, map the buffers (both of each site's)
                body(exchange)
                torch.cuda.synchronize()
                dist.barrier()
                g = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.graph(g, stream=stream):
                    body(exchange)
                graphs[exchange] = g
            local, shared = replay_us(graphs[False]), replay_us(graphs[True])
            case = {"channels": C, "busy_kernel_before_each": busy, "local_graph_us": local,
                    "exchange_graph_us": shared, "per_exchange_us": (shared - local) / SITES}
            out["cases"].append(case)
            if rank == 0:
                print(json.dumps(case), flush=True)
    expected = sum(torch.arange(world, dtype=torch.float32)).item()
    check = exchange_sums(torch.ones(2, 8, device=device) * rank, torch.ones(1, device=device), rank, world,
                          ranks.peer_buffers(("check",), 16, 8, device))
    out["check_ok"] = bool((check == expected).all().item())
    if rank == 0:
        print("check", out["check_ok"], flush=True)
        path = os.path.join(os.environ.get("OUT", "."), f"bn-exchange-probe-{world}gpu.json")
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
