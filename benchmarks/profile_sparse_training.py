"""Where a training step of `bench sparse --train` spends its time (issue 32; on a GPU).

The IPU SHD net at width 4, batch 8, on the hard shd-synthetic set, dense and sparse from the
same fluctuation init, with the rate regulariser (max rate 0.05, L1 weight as --rate-l1), as
`spikefuse bench sparse --train` trains them: three epochs through the Trainer, then one more
under torch.profiler. Per run: samples/s of the plain epochs, and of the profiled one the wall
time per step, the GPU's busy time per step (the union of kernel intervals) and the kernels
that take it, grouped by name. The profiled epoch is slower than the plain ones (the
profiler's own cost); compare its rows with each other, not with the samples/s.

    python benchmarks/profile_sparse_training.py [--rate-l1 10] [--max-rate 0.05] > profile.txt
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from spikefuse.bench.sparse_train import TASKS, initial_state
from spikefuse.models.ipu import IPUNet
from spikefuse.optim import LazyAdam
from spikefuse.train.loop import Trainer


def busy_us(events) -> float:
    """Microseconds in which at least one kernel ran."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events)
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run(name, splits, state, args):
    sparse = name == "sparse"
    model = IPUNet(splits.input_shape, splits.num_classes, width=4.0, sparse=sparse).cuda()
    model.load_state_dict(state)
    optimizer = (LazyAdam(model.parameters(), lr=2e-3) if sparse
                 else torch.optim.Adam(model.parameters(), lr=2e-3, fused=True))
    regulariser = {} if args.no_regulariser else {"max_rate": args.max_rate, "rate_l1": args.rate_l1}
    trainer = Trainer(model, splits, optimizer, epochs=5, batch_size=8, device="cuda", progress=False, **regulariser)
    with trainer._watching():
        rates = [trainer.train_epoch(e)["samples_per_s"] for e in range(3)]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            record = trainer.train_epoch(3)
            torch.cuda.synchronize()
    steps = -(-len(splits.train) // 8)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name = collections.Counter()
    for e in kernels:
        by_name[e.name[:90]] += e.time_range.end - e.time_range.start
    print(f"== {name}: samples/s of epochs 1-3 {[round(r) for r in rates]}; profiled epoch "
          f"{record['train_time_s'] / steps * 1e3:.3f} ms/step wall, GPU busy {busy_us(kernels) / steps / 1e3:.3f} "
          f"ms/step, {len(kernels) / steps:.0f} kernels/step; hidden rates {record['train_firing_rates']}")
    for kernel, us in by_name.most_common(args.top):
        print(f"  {us / steps:8.1f} us/step  {kernel}")
    if args.ops:
        attribute_to_ops(model, splits, optimizer, regulariser, args)


def attribute_to_ops(model, splits, optimizer, regulariser, args):
    """Which torch ops launch the kernels: a few uncaptured steps (eager, so the profiler sees
    each op launch its kernels; slower than the captured step, same kernels), the ops by their
    own GPU time."""
    trainer = Trainer(model, splits, optimizer, epochs=5, batch_size=8, device="cuda", progress=False,
                      capture=False, **regulariser)
    with trainer._watching():
        trainer.train_epoch(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            trainer.train_epoch(1)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=60))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-rate", type=float, default=0.05)
    p.add_argument("--rate-l1", type=float, default=10.0)
    p.add_argument("--no-regulariser", action="store_true")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--ops", action="store_true", help="also an uncaptured epoch, kernels attributed to torch ops")
    args = p.parse_args()
    device = torch.device("cuda")
    splits = TASKS["shd-synthetic-hard"](device, False)
    state, _ = initial_state(splits, "ff", 4.0, 0, device)
    print(torch.cuda.get_device_name(), torch.__version__, vars(args))
    for name in ("dense", "sparse", "dense", "sparse"):
        run(name, splits, state, args)


if __name__ == "__main__":
    main()
