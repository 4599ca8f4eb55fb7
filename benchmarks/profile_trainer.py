"""Produces benchmarks/results/profile-trainer-shd-<gpu>.txt (stdout; on a GPU).

Where a captured trainer epoch spends the host's time: `spikefuse train`'s SHD case
(shd-synthetic, shd model, batch 128), two epochs, then one more under cProfile.

    python benchmarks/profile_trainer.py
"""
import cProfile
import pstats
import time

import torch

from spikefuse.data import load
from spikefuse.models import build_model
from spikefuse.train.loop import Trainer


def main():
    torch.manual_seed(0)
    splits = load("shd-synthetic", device="cuda")
    model = build_model("shd", splits.input_shape, splits.num_classes, splits.time_steps)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    trainer = Trainer(model, splits, optimizer, epochs=3, batch_size=128, device="cuda", progress=False)
    with trainer._watching():
        for epoch in range(2):
            print(trainer.train_epoch(epoch)["samples_per_s"])
        torch.cuda.synchronize()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        record = trainer.train_epoch(2)
        profiler.disable()
        print("profiled epoch", record["samples_per_s"], "samples/s", time.perf_counter() - start, "s")
        batches = list(splits.train.batches(128, shuffle=True, generator=torch.Generator().manual_seed(5)))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x, y in splits.train.batches(128, shuffle=True, generator=torch.Generator().manual_seed(5)):
            pass
        torch.cuda.synchronize()
        print(f"data pipeline alone: {time.perf_counter() - start:.4f} s for {len(batches)} batches")
        start = time.perf_counter()
        for x, y in batches:
            trainer.step(x, y)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        print(f"captured steps alone on ready batches: {elapsed:.4f} s, {len(splits.train) / elapsed:.0f} samples/s")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    from torch.profiler import ProfilerActivity, profile
    x, y = batches[0]
    for _ in range(3):
        trainer.step(x, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            trainer.step(x, y)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=25))


if __name__ == "__main__":
    main()
