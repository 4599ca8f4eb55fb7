"""Our captured IPU step against SpikingJelly's fastest (its StaticCudaGraph mode), kernel by
kernel: where do the microseconds of a training step go on each side (issue 34, item 2).

    python benchmarks/profile_step_vs_sj.py --batches 48,256 --width 1 [--precision fp32]

Per batch: both steps built through `spikefuse bench steps`' own preparation (same inputs,
same optimizer), each profiled over 20 steps (the captured step's kernels as the profiler
sees them inside the graph replays), then the kernels grouped by name, GPU us per step,
largest first, and the sums. Prints to stdout (CUDA only).
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from spikefuse import precision as precisions
from spikefuse.bench import steps

STEPS = 20


def kernels_per_step(call):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            call()
        torch.cuda.synchronize()
    totals, counts = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name[:90]] += e.device_time / STEPS
            counts[e.name[:90]] += 1 / STEPS
    return totals, counts


@precisions.applied("fp32")
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="ipu-shd")
    parser.add_argument("--batches", default="48")
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--top", type=int, default=30)
    a = parser.parse_args()
    device = torch.device("cuda")
    args = argparse.Namespace(smoke=False, width=a.width)
    template, args.shapes, args.num_classes = steps.make_model(a.net, a.width, "auto")
    template = template.to(device)
    for batch in (int(b) for b in a.batches.split(",")):
        print(f"== {a.net} x{a.width:g} {a.precision} B={batch} ({torch.cuda.get_device_name()}, torch {torch.__version__})")
        for mode in ("captured", "spikingjelly-graph"):
            case = steps.new_case(a.net, a.precision, batch, "adam", mode, a.width)
            call = steps.prepare(case, args, device, template)
            if call is None:
                print(f"-- {mode}: {case['error']}")
                continue
            ms = steps.stream_ms(call, False)
            totals, counts = kernels_per_step(call)
            print(f"-- {mode}: step {ms:.3f} ms (steady state), GPU {sum(totals.values()) / 1e3:.3f} ms/step, "
                  f"{sum(counts.values()):.0f} kernels/step, peak {case['peak_mib']:.0f} MiB")
            for name, us in totals.most_common(a.top):
                print(f"   {us:8.1f} us  x{counts[name]:4.1f}  {name}")
            del call
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
