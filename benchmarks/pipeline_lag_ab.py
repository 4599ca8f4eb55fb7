"""The pipeline's weight-gradient lag and hand-off communicator, alternated: the 2-stage
captured pipeline with its weight gradients computed chunk by chunk (lag 0), with the default
lag (2k + 1 chunks held back on stage k), and with the default lag but its hand-offs on the
process group itself (NCCL's default thread blocks, not PipelineTrainer's 4-block
communicator), and one GPU's captured step for the speedups, in one run. $VARIANTS
(comma-separated names of VARIANT_OPTIONS) picks some.

    torchrun --standalone --nproc-per-node 2 benchmarks/pipeline_lag_ab.py OUT [T:C ...]

deep-lif, B = 16, TF32. Rounds alternate the variants; each round times 5 steps, each step
bracketed by a host barrier and synchronize on both ranks, the slower rank's time; medians.
Writes OUT/pipeline-lag-ab-<device>[-<tag>].json (tag: $TAG, e.g. an NCCL setting).
"""
import datetime
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from spikefuse import precision
from spikefuse.bench.parallel_pipeline import batch, fresh_layers, rate_cross_entropy
from spikefuse.bench.report import environment
from spikefuse.capture import CapturedStep
from spikefuse.parallel import pipeline
from spikefuse.parallel.pipeline import PipelineTrainer

ROUNDS, REPS = 5, 5
VARIANT_OPTIONS = {  # name -> PipelineTrainer options ("uncapped": hand-offs on the group itself)
    "lag 0": dict(weight_grad_lag=0),
    "default lag": {},
    "default lag, NCCL's default blocks": dict(uncapped=True),
}
VARIANTS = [v for v in os.environ.get("VARIANTS", ",".join(VARIANT_OPTIONS)).split(",") if v]


class Args:
    width, batch, time_steps = 1.0, 16, None


def main(out, cases):
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(minutes=5))
    host = dist.new_group(backend="gloo")

    def timed(fn, together):
        times = []
        for _ in range(REPS):
            torch.cuda.synchronize()
            dist.barrier(group=host)
            start = time.perf_counter()
            if rank == 0 or together:
                fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host)
        return statistics.median(t.tolist()) * 1e3

    results = []
    with precision.applied("fp32"):
        for T, C in cases:
            x, y = (t.to(device) for t in batch(T, Args))
            steps = {}
            if rank == 0:  # one GPU, rank 1 idle
                net = fresh_layers(Args).to(device)

                def whole(x, y):
                    net.zero_grad(set_to_none=True)
                    rate_cross_entropy(net(x), y).backward()
                one = CapturedStep(whole, name="one GPU")
                steps["one GPU"] = (lambda: one(x, y), False)
            else:
                steps["one GPU"] = (lambda: None, False)
            capped = pipeline._handoff_group
            for name in VARIANTS:
                options, handoffs = dict(VARIANT_OPTIONS[name]), capped
                if options.pop("uncapped", False):
                    handoffs = lambda group: group  # noqa: E731  (the hand-offs on the process group itself)
                pipeline._handoff_group = handoffs
                trainer = PipelineTrainer(fresh_layers(Args), rate_cross_entropy, C, device=device, **options)
                pipeline._handoff_group = capped
                step = trainer.captured()
                run = (lambda step=step, first=rank == 0: step(x if first else T, y))
                steps[name] = (run, True)
            for fn, together in steps.values():  # warm-up and capture
                for _ in range(5):
                    if rank == 0 or together:
                        fn()
                torch.cuda.synchronize()
                dist.barrier(group=host)
            times = {k: [] for k in steps}
            for _ in range(ROUNDS):
                for k, (fn, together) in steps.items():
                    times[k].append(timed(fn, together))
            row = {"T": T, "chunks": C, "ms": {k: statistics.median(v) for k, v in times.items()},
                   "rounds": times}
            one_ms = row["ms"]["one GPU"]
            row["speedup"] = {k: one_ms / v for k, v in row["ms"].items() if k != "one GPU"}
            results.append(row)
            if rank == 0:
                print(f"T={T} C={C}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in row["ms"].items())
                      + "; speedups " + ", ".join(f"{k} {v:.3f}x" for k, v in row["speedup"].items()), flush=True)
            steps = one = trainer = step = None
            torch.cuda.empty_cache()
    if rank == 0:
        tag = os.environ.get("TAG", "")
        name = torch.cuda.get_device_name().lower().replace(" ", "-")
        with open(f"{out}/pipeline-lag-ab-{name}{'-' + tag if tag else ''}.json", "w") as f:
            json.dump({"environment": environment(), "nccl_env": {k: v for k, v in os.environ.items()
                                                                   if k.startswith("NCCL_")},
                       "results": results}, f, indent=1)
    dist.barrier(group=host)
    gc.collect()  # CUDA graphs holding NCCL work go first (pytorch#115388)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    main(sys.argv[1], [tuple(int(v) for v in a.split(":")) for a in sys.argv[2:]] or [(1024, 8), (4096, 16)])
