"""Produces benchmarks/results/overlap-wgrad-<gpu>.json: an experiment, not a library path.

Would backward's two halves overlap? In the captured CIFAR-medium step (one GPU, fp32, 64
samples, T = 10) the convolutions' weight gradients (compute-bound, ~2.9 ms of a 10.9 ms
step on an H100) run one after another with the BN+LIF backward chain (memory-bound, ~2.9
ms), although conv k+1's weight gradient does not feed BNLIF k's backward. Here, with the
library untouched, SpikeConv2dFunction's backward is patched to compute its input gradient on
the current stream and its weight gradient on a side stream (the bits unpacked there too);
the step waits for the side stream before the optimizer. Alternating rounds of the plain and
the patched captured step (CUDA events, medians of 10 x 10 steps), and both trained 15 steps
from the same weights: the parameters' largest difference (0 expected: the same kernels).

    python benchmarks/overlap_wgrad.py OUT_DIR
"""
import json
import os
import statistics
import sys

import torch

from spikefuse import precision as precisions
from spikefuse.bench.parallel_ddp import inputs, make_step
from spikefuse.bench.report import environment
from spikefuse.bench.timing import median_ms
from spikefuse.ops import spike_conv

plain_backward = spike_conv.SpikeConv2dFunction.backward
side = None  # the weight gradients' stream
waits, kept = [], []  # this backward's side-stream events; tensors both streams use, held until the next step


def overlapped_backward(ctx, gy):
    """The input gradient here, the weight (and bias) gradient on the side stream; the first
    call of a backward queues the join (the current stream waits for every side-stream
    event) for the end of that backward, before the optimizer runs."""
    need_s, need_w, need_b = ctx.needs_input_grad[:3]
    if torch.is_grad_enabled() or not need_w:
        return plain_backward(ctx, gy)
    packed, weight, _ = ctx.saved_tensors
    main = torch.cuda.current_stream(gy.device)
    if not waits:
        torch.autograd.Variable._execution_engine.queue_callback(_join)
    gs = None
    if need_s:
        gs = spike_conv._backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, ctx.channels_last,
                                  ctx.has_bias, ctx.conv, True, False, False)[0]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        _, gw, gb = spike_conv._backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, ctx.channels_last,
                                         ctx.has_bias, ctx.conv, False, True, need_b)
        done = torch.cuda.Event()
        done.record(side)
    waits.append(done)
    kept.extend((gy, packed))
    return (gs, gw, gb, None, None, None, None, None, None)


def _join():
    main = torch.cuda.current_stream()
    while waits:
        main.wait_event(waits.pop())


def patched(step, overlap: bool):
    """step(x, y) with SpikeConv2dFunction's backward patched (overlap) or not while it runs."""
    def call(x, y):
        kept.clear()
        spike_conv.SpikeConv2dFunction.backward = staticmethod(overlapped_backward if overlap else plain_backward)
        try:
            return step(x, y)
        finally:
            spike_conv.SpikeConv2dFunction.backward = staticmethod(plain_backward)
    return call


def main(out: str) -> int:
    global side
    device = torch.device("cuda", 0)
    side = torch.cuda.Stream(device)
    os.makedirs(out, exist_ok=True)
    precisions.applied("fp32").__enter__()  # as the bench runs: TF32
    batches = inputs(device, 0)
    results = {"environment": environment(), "rounds": [], "note": __doc__.splitlines()[0]}
    built = {}
    for overlap in (False, True):
        step, model, _ = make_step("captured", "fp32", device, None)
        built[overlap] = (patched(step, overlap), model)
    for rnd in range(3):  # alternating rounds
        for overlap in (False, True):
            call = built[overlap][0]
            turn = [0]

            def once():
                turn[0] += 1
                return call(*batches[turn[0] % 2])
            for _ in range(6):
                once()
            ms, _ = median_ms(once, warmup=2, min_reps=10, max_reps=10, back_to_back=10)
            results["rounds"].append({"round": rnd, "overlap": overlap, "step_ms": ms})
            print(f"round {rnd} overlap={overlap}: {ms:.3f} ms", flush=True)
    for overlap in (False, True):
        results[f"median_ms_overlap_{overlap}"] = statistics.median(
            r["step_ms"] for r in results["rounds"] if r["overlap"] == overlap)
    trained = []  # the same 15 steps from the same weights (make_step seeds them)
    for overlap in (False, True):
        step, model, _ = make_step("captured", "fp32", device, None)
        call = patched(step, overlap)
        for i in range(15):
            call(*batches[i % 2])
        torch.cuda.synchronize()
        trained.append([p.detach().clone() for p in model.parameters()])
    results["max_abs_difference"] = max((a - b).abs().max().item() for a, b in zip(*trained))
    print(json.dumps({k: v for k, v in results.items() if k != "environment"}, indent=1), flush=True)
    name = torch.cuda.get_device_name().replace(" ", "-").lower()
    with open(os.path.join(out, f"overlap-wgrad-{name}.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/overlap"))
