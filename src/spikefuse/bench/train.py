"""One training step (forward, backward, optimizer step) of the CIFAR-10 networks of Liang et
al. and a spiking ResNet-18: spikefuse fused vs its vanilla per-step form vs SpikingJelly.

Each case reports the median step time (CUDA events after warm-up), the peak memory
(torch.cuda.max_memory_allocated after a reset: absolute, and beyond what the model,
optimizer and batch already held), and the floor of bench.roofline with its rates measured
in the same run (bytes per neuron-step at the copy bandwidth plus the conv/linear FLOPs at
a matmul rate). Input: random CIFAR-shaped images, direct encoding (repeated over T; the
fused form convolves the image once and reuses it at every step).

    spikefuse bench train --out benchmarks/results
    spikefuse bench train --quick --out /tmp/bench   # tiny, CPU-friendly: train-quick-<device>.*
"""
from __future__ import annotations

import argparse
import gc
import traceback

import torch
from torch import nn

from .. import precision as precisions
from ..models.cifar import LIANG_LIF, CifarNet
from .timing import median_ms
from ..models.resnet import SpikingResNet
from . import roofline, spikingjelly
from .options import count, counts
from .report import environment, table, write_results

PRECISIONS = ("fp32", "bf16")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny width and batch, 2 steps, reference backend on CPU (for tests)")
    parser.add_argument("--quick", action="store_true",
                        help="--smoke's sizes, marked and named as a quick run (train-quick-<device>): a smoke test")
    parser.add_argument("--size", default="medium", choices=["small", "medium", "large"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--time-steps", type=int, default=10)
    parser.add_argument("--resnet-time-steps", default="4,32", help="comma-separated; empty to skip")
    parser.add_argument("--resnet-batch", type=int, default=32)
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument("--iters", type=int, default=10, help="timed steps per case")
    parser.add_argument("--no-peers", action="store_true", help="skip SpikingJelly")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN time its algorithms per shape (torch.backends.cudnn.benchmark) "
                             "for every implementation alike")


# ---- the networks ----

def build(impl, net, width, T, backend, image=32):
    if impl == "spikingjelly":
        return spikingjelly.cifar(net, width, time_steps=T, image=image)
    fused, shape = impl == "spikefuse-fused", (3, image, image)
    if net == "resnet18":
        return SpikingResNet(18, shape, time_steps=T, width=width, fused=fused, backend=backend)
    return CifarNet(net, shape, time_steps=T, width=width, fused=fused, backend=backend)


# ---- measurement ----

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_step(model, x, y, precision, optimizer):
    opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3))

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def time_steps_ms(step, device, warmup, iters):
    """Median and all times of `iters` steps after `warmup` (CUDA events on a GPU)."""
    return median_ms(step, warmup=warmup, min_reps=iters, max_reps=iters)


def peak_memory_mib(step, device):
    """(absolute peak, peak beyond what was allocated before the step) in MiB."""
    if device.type != "cuda":
        return None, None
    sync(device)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    sync(device)
    peak = torch.cuda.max_memory_allocated()
    return peak / 2**20, (peak - base) / 2**20


def measure(impl, net, precision, T, B, args, device, rates, flops_cache):
    """One case; errors (out of memory, a missing peer) are recorded, not raised."""
    case = {"impl": impl, "net": net, "precision": precision, "T": T, "B": B, "width": args.width}
    model = step = None
    try:
        torch.manual_seed(0)
        model = build(impl, net, args.width, T, args.backend, args.image).to(device)
        x = torch.randn(B, 3, args.image, args.image, device=device)
        y = torch.randint(0, 10, (B,), device=device)
        step = make_step(model, x, y, precision, args.optimizer)
        ms, times = time_steps_ms(step, device, args.warmup, args.iters)
        peak, extra = peak_memory_mib(step, device)
        key = (net, T, B)
        if key not in flops_cache and impl == "spikefuse-vanilla":  # the work the network defines
            flops_cache[key] = (roofline.step_flops(step), roofline.neuron_steps(model, x))
        case.update(ms=ms, times_ms=times, peak_mib=peak, step_extra_mib=extra)
    except Exception as e:  # noqa: BLE001  (recorded; a spikefuse failure fails the run at the end)
        if not isinstance(e, ImportError) and "out of memory" not in str(e).lower():
            traceback.print_exc()
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    finally:
        del model, step
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(summary_line(case), flush=True)
    return case


def add_floors(cases, flops_cache, rates):
    for case in cases:
        flops, steps = flops_cache.get((case["net"], case["T"], case["B"]), (None, None))
        case["neuron_steps"], case["flops"] = steps, flops
        if steps is None or "ms" not in case:
            continue
        floor, mem_ms, flop_ms = roofline.floor_ms(case["precision"], steps, flops, rates)
        case.update(floor_ms=floor, floor_memory_ms=mem_ms, floor_compute_ms=flop_ms,
                    ratio_to_floor=case["ms"] / floor)
    by_key = {(c["impl"], c["net"], c["precision"], c["T"]): c for c in cases}
    for case in cases:
        for peer in ("spikefuse-vanilla", "spikingjelly"):
            other = by_key.get((peer, case["net"], case["precision"], case["T"]))
            if case["impl"] == "spikefuse-fused" and other and "ms" in other and "ms" in case:
                case[f"speedup_vs_{peer}"] = other["ms"] / case["ms"]
                if case.get("peak_mib") and other.get("peak_mib"):
                    case[f"memory_vs_{peer}"] = case["peak_mib"] / other["peak_mib"]


@precisions.applied("fp32")  # TF32 matmuls and convolutions for every library alike; the caller's flags after
def run(args) -> int:
    # checked before anything runs: 0, -1 or 2**70 were measured (or failed deep inside torch),
    # "--resnet-time-steps 1,x" raised int()'s ValueError (exit 1)
    for option, value in (("--batch", args.batch), ("--time-steps", args.time_steps),
                          ("--resnet-batch", args.resnet_batch), ("--iters", args.iters)):
        count(option, value)
    resnet_T = counts("--resnet-time-steps", args.resnet_time_steps, empty=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    args.width, args.warmup, args.backend, args.image = 1.0, 3, "auto", 32
    args.smoke = args.smoke or args.quick
    if args.smoke:
        args.width, args.batch, args.resnet_batch, args.image = 1 / 16, 2, 2, 16
        args.time_steps, resnet_T, args.iters, args.warmup = 2, resnet_T[:1] and [2], 2, 1
        args.backend = "auto" if device.type == "cuda" else "reference"
    rates = roofline.rates(device, args.smoke)
    print(f"copy {rates['copy_gbs']:.0f} GB/s, matmul {rates['matmul_tflops']}", flush=True)
    impls = ["spikefuse-fused", "spikefuse-vanilla"] + ([] if args.no_peers else ["spikingjelly"])
    cases, flops_cache = [], {}
    for precision in PRECISIONS:
        for impl in impls:
            cases.append(measure(impl, args.size, precision, args.time_steps, args.batch, args,
                                 device, rates, flops_cache))
    for T in resnet_T:
        for impl in impls[:2]:
            cases.append(measure(impl, "resnet18", "fp32", T, args.resnet_batch, args, device,
                                 rates, flops_cache))
    add_floors(cases, flops_cache, rates)
    payload = {"benchmark": "train", "environment": environment(), "rates": rates,
               "optimizer": args.optimizer, "floor_bytes_per_neuron_step": roofline.FLOOR_BYTES,
               "equations": "LIF decay 0.25, threshold 0.25, hard reset to 0; spikefuse: rectangular "
                            "surrogate, SpikingJelly: Sigmoid (its fused kernels lack a rectangular one)",
               "cudnn_benchmark": args.cudnn_benchmark, "smoke": args.smoke, "quick": args.quick, "cases": cases}
    # --quick: write_results names it train-quick-<device>
    paths = write_results("train-smoke" if args.smoke and not args.quick else "train", payload,
                          markdown(payload), args.out)
    print("wrote", *paths)
    failed = [c for c in cases if c["impl"].startswith("spikefuse") and "error" in c]
    return 1 if failed else 0


def summary_line(case):
    head = f"{case['net']} {case['impl']} {case['precision']} T={case['T']} B={case['B']}:"
    if "error" in case:
        return f"{head} skipped ({case['error']})"
    peak = f", peak {case['peak_mib']:.0f} MiB" if case.get("peak_mib") else ""
    return f"{head} {case['ms']:.2f} ms{peak}"


def markdown(payload) -> str:
    env, rates = payload["environment"], payload["rates"]
    out = [f"# Training step: CIFAR-10 {payload['cases'][0]['net']} net and spiking ResNet-18\n",
           f"{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"Measured in the run: copy {rates['copy_gbs']:.0f} GB/s, matmul {rates['matmul_tflops']} TFLOP/s "
           f"(fp32 = TF32). Floor = {payload['floor_bytes_per_neuron_step']} bytes per neuron-step / copy "
           f"bandwidth + FLOPs / matmul rate. Optimizer {payload['optimizer']}; cuDNN algorithm search "
           f"(cudnn.benchmark) {'on' if payload.get('cudnn_benchmark') else 'off'} for all. {payload['equations']}.\n"]
    header = ["net", "impl", "precision", "T", "B", "ms", "peak MiB", "step extra MiB", "floor ms",
              "x floor", "speedup vs vanilla", "speedup vs SJ", "memory vs vanilla", "note"]
    rows = [[c["net"], c["impl"], c["precision"], c["T"], c["B"], c.get("ms"), c.get("peak_mib"),
             c.get("step_extra_mib"), c.get("floor_ms"), c.get("ratio_to_floor"),
             c.get("speedup_vs_spikefuse-vanilla"), c.get("speedup_vs_spikingjelly"),
             c.get("memory_vs_spikefuse-vanilla"), c.get("error", "")] for c in payload["cases"]]
    out.append(table(header, rows))
    return "\n".join(out)
