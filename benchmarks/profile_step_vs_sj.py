"""Our captured IPU step against SpikingJelly's fastest (its StaticCudaGraph mode), kernel by
kernel: where do the microseconds of a training step go on each side (issue 34, item 2).

    python benchmarks/profile_step_vs_sj.py --batches 48,256 --width 1 [--precision fp32]

Per batch: both steps built through `spikefuse bench steps`' own preparation (same inputs,
same optimizer), each profiled over 20 steps (the captured step's kernels as the profiler
sees them inside the graph replays), then the kernels grouped by name, GPU us per step,
largest first, and the sums. Prints to stdout (CUDA only).
"""
import argparse

import torch
from on_probe import kernels  # benchmarks/on_probe.py: a call's kernels summed by name

from spikefuse import precision as precisions
from spikefuse.bench import steps

STEPS = 20


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
            rows = kernels(call, STEPS)
            print(f"-- {mode}: step {ms:.3f} ms (steady state), GPU {sum(t for _, t, _ in rows):.3f} ms/step, "
                  f"{sum(c for _, _, c in rows)} kernels/step, peak {case['peak_mib']:.0f} MiB")
            for name, ms_per_step, launches in rows[:a.top]:
                print(f"   {ms_per_step * 1e3:8.1f} us  x{launches:4d}  {name[:90]}")
            del call
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
