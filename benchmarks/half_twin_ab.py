"""CIFAR-medium's captured fp32 step with and without the fp16 weight-gradient twin
(spikefuse.ops.half_grad), alternated in one process: step time (CUDA events, 10 steps
queued back to back, medians of rounds), the profiler's GPU time per step, the absolute
peak memory (graph pool at its reserved size, as `bench steps`), and how far each run's
conv weight gradients lie from float64's on the same step.

    PYTHONPATH=src python benchmarks/half_twin_ab.py OUT.json [ROUNDS]
"""
import copy
import gc
import json
import statistics
import sys
from datetime import datetime, timezone

import torch

from spikefuse import precision
from spikefuse.bench.steps import kernel_time_ms, make_inputs, make_model, make_optimizer, rotating, step_function
from spikefuse.bench.timing import graph_pool_segments, median_ms, step_peak_bytes
from spikefuse.capture import CapturedStep, prepare_optimizer
from spikefuse.nn.spiking_layers import ConvBNLIF

B = 64


def build(template, twin, inputs):
    model = copy.deepcopy(template)
    for m in model.modules():
        if isinstance(m, ConvBNLIF):
            m.half_twin = twin
    optimizer = make_optimizer("sgd", model.parameters())
    prepare_optimizer(optimizer)
    step = step_function(model, model, optimizer, "fp32")
    for x, y in inputs:
        step(x, y)
    kernel_ms = kernel_time_ms(step, inputs)
    captured = CapturedStep(step)
    call = rotating(captured, inputs)
    for _ in range(captured.warmup + 1):
        call()
    assert captured.captured == 1, captured.fallback_reason
    return model, call, kernel_ms, captured.pool_bytes


def weight_grad_errors(template, inputs):
    """Relative Frobenius error against float64 of every spiking conv's weight gradient,
    twin and TF32, on one eager step from the same weights (float64: the same model in
    float64 through the reference backend would change the spikes; instead each conv's own
    saved gy and spikes are recorded and its weight gradient recomputed in float64)."""
    from spikefuse.ops import spike_conv
    records = []
    real = spike_conv._twin_weight_grad

    def recording(gy, wanted, packed, weight, s_shape, channels_last, conv, launch):
        gw = real(gy, wanted, packed, weight, s_shape, channels_last, conv, launch)
        if gw is None:  # no twin came with gy
            return gw
        s = spike_conv._spikes(packed, s_shape, channels_last, torch.float64, launch)
        stride, padding, dilation, groups = conv
        exact = torch.ops.aten.convolution_backward(
            gy.double(), s, weight.double(), None, list(stride), list(padding), list(dilation), False, [0, 0],
            groups, [False, True, False])[1]
        tf32 = torch.ops.aten.convolution_backward(
            gy, s.float(), weight, None, list(stride), list(padding), list(dilation), False, [0, 0], groups,
            [False, True, False])[1]

        def err(g):
            return ((g.double() - exact).norm() / exact.norm()).item()
        records.append({"weight": list(weight.shape), "twin": err(gw), "tf32": err(tf32)})
        return gw
    spike_conv._twin_weight_grad = recording
    try:
        model = copy.deepcopy(template)
        x, y = inputs[0]
        torch.nn.functional.cross_entropy(model(x), y).backward()
    finally:
        spike_conv._twin_weight_grad = real
    return records


def main(out_path, rounds=5):
    device = torch.device("cuda")
    with precision.applied("fp32"):
        torch.manual_seed(0)
        template, shapes, classes = make_model("cifar-medium", 1.0, "auto")
        template = template.to(device)
        inputs = make_inputs(shapes, classes, B, device)
        errors = weight_grad_errors(template, inputs)
        runs = {}
        for name, twin in (("tf32", False), ("twin", True)):
            gc.collect()
            base, pools = torch.cuda.memory_allocated(), graph_pool_segments()
            model, call, kernel_ms, pool = build(template, twin, inputs)
            runs[name] = {"call": call, "kernel_ms": kernel_ms, "pool_mib": pool / 2**20,
                          "peak_mib": step_peak_bytes(call, base, pools) / 2**20, "ms": [], "model": model}
        for _ in range(rounds):
            for run in runs.values():
                run["ms"].append(median_ms(run["call"], warmup=3, min_reps=10, max_reps=30, back_to_back=10,
                                           budget_s=1.5)[0])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "net": "cifar-medium", "B": B,
              "T": 10, "precision": "fp32 (TF32)", "rounds": rounds, "conv_weight_grad_errors": errors,
              "runs": {k: {"median_ms": statistics.median(v["ms"]), "rounds_ms": v["ms"], "kernel_ms": v["kernel_ms"],
                           "pool_mib": v["pool_mib"], "peak_mib": v["peak_mib"]} for k, v in runs.items()}}
    r = result["runs"]
    result["speedup"] = r["tf32"]["median_ms"] / r["twin"]["median_ms"]
    print(json.dumps(result, indent=1))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
