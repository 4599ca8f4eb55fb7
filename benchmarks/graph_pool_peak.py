"""What is alive at the peak of CIFAR-medium's captured fp32 step, against the graph pool's size:
the capture's allocations replayed from torch.cuda.memory._record_memory_history.

    PYTHONPATH=src python benchmarks/graph_pool_peak.py twin|tf32 [--timeline]

Prints the pool, the step time, the peak of live allocations and the largest blocks alive then
(each with the spikefuse frames that allocated it); --timeline lists every allocation and free
of 30 MiB or more during the capture.
"""
import collections
import sys

import torch

from spikefuse import precision
from spikefuse.bench.steps import make_inputs, make_model, make_optimizer, rotating, step_function
from spikefuse.bench.timing import median_ms
from spikefuse.capture import CapturedStep, prepare_optimizer
from spikefuse.nn.spiking_layers import ConvBNLIF


def where(frames):
    out = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames
           if "spikefuse" in f["filename"] or "autograd" in f["filename"].split("/")[-1]]
    return " < ".join(out[:4])


def capture_trace(twin: bool):
    with precision.applied("fp32"):
        torch.manual_seed(0)
        model, shapes, classes = make_model("cifar-medium", 1.0, "auto")
        model = model.cuda()
        for m in model.modules():
            if isinstance(m, ConvBNLIF):
                m.half_twin = twin
        inputs = make_inputs(shapes, classes, 64, torch.device("cuda"))
        optimizer = make_optimizer("sgd", model.parameters())
        prepare_optimizer(optimizer)
        captured = CapturedStep(step_function(model, model, optimizer, "fp32"))
        call = rotating(captured, inputs)
        for _ in range(captured.warmup):
            call()
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        call()  # the capture
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        assert captured.captured == 1, captured.fallback_reason
        print(f"pool {captured.pool_bytes / 2**20:.0f} MiB, step {median_ms(call, warmup=3, min_reps=10, back_to_back=10)[0]:.3f} ms")
    return snapshot["device_traces"][0]


def main(variant, timeline):
    trace = capture_trace(variant == "twin")
    alive, total, peak, at_peak = {}, 0, 0, (0, {})
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            alive[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at_peak = total, (i, dict(alive))
        elif e["action"] == "free_requested" and e["addr"] in alive:
            total -= alive.pop(e["addr"])["size"]
    print(f"peak of live allocations {peak / 2**20:.1f} MiB at event {at_peak[0]} of {len(trace)}")
    for e in sorted(at_peak[1].values(), key=lambda e: -e["size"])[:20]:
        print(f"{e['size'] / 2**20:9.1f} MiB  {where(e['frames'])}")
    segments = collections.Counter(e["size"] // 2**20 for e in trace if e["action"] == "segment_alloc")
    print("segments made during capture (MiB: count):", sorted(segments.items()))
    if timeline:
        names = {}
        for i, e in enumerate(trace):
            if e["size"] >= 30 * 2**20:
                name = names.setdefault(e["addr"], f"b{len(names)}")
                print(f"{i:4d} {e['action']:15s} {name:4s} {e['size'] / 2**20:7.1f} {where(e.get('frames', []))[:150]}")


if __name__ == "__main__":
    main(sys.argv[1], "--timeline" in sys.argv)
