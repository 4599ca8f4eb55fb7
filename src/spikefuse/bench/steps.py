"""One whole training step (forward, loss, backward, optimizer step) issued four ways, side
by side in one run: eager (Python issues every kernel), captured (spikefuse.capture:
one CUDA-graph replay), torch.compile default (also with inductor's C++ wrapper:
"compiled-cpp-wrapper") and mode="reduce-overhead" (of the model; of the model and the
optimizer step: "reduce-overhead-step"; of the whole step as one function, its backward
traced by compiled autograd: "reduce-overhead-whole"; compiled rows note how many graphs
and graph breaks dynamo made); beside them the
step's GPU kernel time (profiler: the sum of its kernels' durations, what a step costs when
the host is never in the way) and SpikingJelly 2.0's eager step on the same network.

Networks: the IPU study's dense networks (ipu-shd, ipu-nmnist, ipu-dvsgesture; Adam) at
several batch sizes, the CIFAR-10 medium network of Liang et al. (T=10, B=64, SGD; fp32 and
bf16) and a spiking ResNet-18 (T=4, B=32, SGD). Every step reads one of two input batches in
turn, so the captured step pays its copy into the static input buffer like a training loop.
Times: CUDA events, medians; "step" is the steady state (10 steps queued back to back,
timed after 10 more), "call" one step from an idle GPU.

    spikefuse bench steps --out benchmarks/results
    spikefuse bench steps --quick --out /tmp/bench   # a smoke test: steps-quick-<device>.*
    spikefuse bench steps --nets ipu-shd --batches 1,8 --modes eager,captured
    spikefuse bench steps --nets ipu-shd --batches 1,8 --compile-batches 1,8 --no-peers \
        --modes captured,reduce-overhead-step,reduce-overhead-whole
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import traceback

import torch
from torch import nn
from torch._dynamo.utils import counters

from .. import precision as precisions
from ..errors import UsageError
from ..models import build_model
from ..neuron_options import check_int
from ..ops.launch import through_triton
from ..capture import CapturedStep, prepare_optimizer
from .options import counts, names
from .report import environment, table, write_results
from .timing import median_ms

MODES = ("eager", "eager-triton-launch", "captured", "compiled", "compiled-cpp-wrapper", "reduce-overhead",
         "reduce-overhead-step", "reduce-overhead-whole")
# what a run without --modes times: the four ways a user issues a step (the other modes are
# diagnoses of where a way loses time, ~20 s of compiling each; `bench all` keeps under 10 min)
DEFAULT_MODES = ("eager", "captured", "compiled", "reduce-overhead")
IPU_NETS = ("ipu-shd", "ipu-nmnist", "ipu-dvsgesture")
NETS = IPU_NETS + ("shd", "cifar-medium", "resnet18")
DEFAULT_NETS = ",".join(NETS)
DEFAULT_BATCHES = "1,8,48,256"
# --quick: one IPU network and CIFAR-medium, tiny, eager and captured (no compiling: ~20 s each)
QUICK = {"nets": "ipu-shd,cifar-medium", "batches": "1", "modes": "eager,captured"}
INPUT_DENSITY = 0.05  # event inputs: a binary frame with this share of ones


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--nets", default=DEFAULT_NETS,
                        help="comma-separated: ipu-shd, ipu-nmnist, ipu-dvsgesture, shd, cifar-medium, resnet18")
    parser.add_argument("--batches", default=DEFAULT_BATCHES, help="batch sizes of the IPU networks")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)}; "
                             "reduce-overhead-step: the optimizer step "
                             "compiled too; reduce-overhead-whole: the whole step compiled as one function, with "
                             "compiled autograd)")
    parser.add_argument("--compile-nets", default="ipu-shd,cifar-medium",
                        help="networks that also run the compiled and launch-path modes")
    parser.add_argument("--compile-batches", default="8",
                        help="IPU batch sizes that also run the compiled modes (compiling costs ~20 s each)")
    parser.add_argument("--no-peers", action="store_true", help="skip SpikingJelly")
    parser.add_argument("--smoke", action="store_true", help="tiny widths and batches, 2 timed steps (tests)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: --smoke's sizes, and unless given, --nets " + QUICK["nets"] + " --batches "
                             + QUICK["batches"] + " --modes " + QUICK["modes"] + "; written as steps-quick-<device>")


# ---- workloads ----

def workloads(args):
    """(net, precision, batch, optimizer name) cases in the order they run."""
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    cases = []
    for net in nets:
        if net in IPU_NETS:
            cases += [(net, "fp32", b, "adam") for b in batches]
        elif net == "cifar-medium":
            cases += [(net, "fp32", 2 if args.smoke else 64, "sgd"), (net, "bf16", 2 if args.smoke else 64, "sgd")]
        elif net == "resnet18":
            cases.append((net, "fp32", 2 if args.smoke else 32, "sgd"))
        elif net == "shd":  # the `spikefuse train --dataset shd-synthetic --model shd` step
            cases.append((net, "fp32", 2 if args.smoke else 128, "adam"))
        else:
            raise ValueError(f"--nets: unknown {net!r}")
    return cases


def make_model(net, width, backend):
    if net in IPU_NETS:
        from ..models.ipu import NETWORKS
        spec = NETWORKS[net]
        model = build_model(net, spec.input_shape, spec.num_classes, spec.time_steps, width=width, backend=backend)
        return model, (spec.time_steps, spec.input_shape), spec.num_classes
    if net == "shd":
        return build_model(net, (700,), 20, 100, width=width, backend=backend), (100, (700,)), 20
    T = 10 if net == "cifar-medium" else 4
    model = build_model(net, (3, 32, 32), 10, T, width=width, backend=backend)
    return model, (None, (3, 32, 32)), 10


def make_inputs(shape, num_classes, batch, device, count=2):
    T, item = shape
    out = []
    for _ in range(count):
        if T is None:  # images, repeated over time by the network (direct encoding)
            x = torch.randn(batch, *item, device=device)
        else:
            x = (torch.rand(T, batch, *item, device=device) < INPUT_DENSITY).float()
        out.append((x, torch.randint(0, num_classes, (batch,), device=device)))
    return out


def make_optimizer(name, params):
    return (torch.optim.Adam(params, lr=1e-3) if name == "adam"
            else torch.optim.SGD(params, lr=0.01, momentum=0.9))


def step_function(model, forward, optimizer, precision, optimizer_step=None, mark_step=False):
    """optimizer_step: what runs the update (default optimizer.step; a compiled one)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    optimizer_step = optimizer_step or optimizer.step

    def step(x, y):
        if mark_step:  # reduce-overhead: this step may overwrite the last step's graph outputs
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=dtype, enabled=precision == "bf16", cache_enabled=False):
            loss = nn.functional.cross_entropy(forward(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step()
        return loss
    return step


def whole_step(step):
    """reduce-overhead-whole: `step` (forward, loss, zero_grad, backward, optimizer step)
    compiled as one function, mode="reduce-overhead", with compiled autograd, so that its
    backward becomes a dynamo graph (and a CUDA graph) too, like its forward and its update."""
    with torch._dynamo.config.patch(compiled_autograd=True):  # torch.compile reads it when it wraps
        compiled = torch.compile(step, mode="reduce-overhead")

    def call(x, y):
        torch.compiler.cudagraph_mark_step_begin()  # outside the compiled function
        return compiled(x, y)
    return call


def spikingjelly_mlp(net, width):
    """The IPU network from SpikingJelly 2.0 layers (multi-step LIF, the same equations:
    tau = 1/(1-decay), decay_input=False, hard reset to 0 with the reset detached; its
    Sigmoid surrogate) and a time-averaged linear readout, no biases."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate

    from ..models.ipu import HIDDEN, NETWORKS
    spec = NETWORKS[net]
    sizes = [math.prod(spec.input_shape), *(max(1, round(h * width)) for h in HIDDEN)]
    layers = [nn.Flatten(2)]
    for a, b in zip(sizes, sizes[1:]):
        layers += [layer.Linear(a, b, bias=False, step_mode="m"),
                   neuron.LIFNode(tau=1 / (1 - 0.95), decay_input=False, v_threshold=1.0, v_reset=0.0,
                                  detach_reset=True, surrogate_function=surrogate.Sigmoid(), step_mode="m")]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*layers)
            self.readout = nn.Linear(sizes[-1], spec.num_classes, bias=False)

        def forward(self, x):
            functional.reset_net(self.body)
            return self.readout(self.body(x)).mean(0)
    return Net()


# ---- measurement ----

def kernel_time_ms(step, inputs, reps=5):
    """GPU time of one step: the summed durations of its kernels (and copies) under the
    profiler, over `reps` eager steps."""
    from torch.profiler import ProfilerActivity, profile

    reps = check_int("reps", reps)  # 0 divided by zero below
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            step(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in device_events) / 1e3 / reps


def rotating(step, inputs):
    state = {"i": 0}

    def call():
        state["i"] += 1
        return step(*inputs[state["i"] % len(inputs)])
    return call


def time_step(call, smoke):
    warm = 1 if smoke else 5
    stream, _ = median_ms(call, warmup=warm, min_reps=2 if smoke else 10, max_reps=2 if smoke else 30,
                          back_to_back=1 if smoke else 10, budget_s=3.0)
    single, _ = median_ms(call, warmup=0, min_reps=2 if smoke else 10, max_reps=2 if smoke else 30)
    return stream, single


def measure(net, precision, batch, opt_name, mode, args, device, template):
    """eager-triton-launch: eager with every kernel launched through Triton's own path
    instead of ops/launch.py's cached one (what the cache saves the host)."""
    case = {"net": net, "precision": precision, "B": batch, "optimizer": opt_name, "mode": mode}
    with through_triton() if mode == "eager-triton-launch" else contextlib.nullcontext():
        return _measure(case, net, precision, batch, opt_name, mode, args, device, template)


def _measure(case, net, precision, batch, opt_name, mode, args, device, template):
    try:
        torch._dynamo.reset()
        counters.clear()  # graphs and graph breaks of this case alone
        torch.manual_seed(0)
        if mode == "spikingjelly":
            model = spikingjelly_mlp(net, args.width).to(device)
        else:
            model = copy.deepcopy(template)
        optimizer = make_optimizer(opt_name, model.parameters())
        if mode in ("captured", "reduce-overhead-step", "reduce-overhead-whole"):  # a tensor learning rate
            why = prepare_optimizer(optimizer)
            if why is not None:
                raise RuntimeError(f"optimizer not capturable: {why}")
        forward = model
        if mode == "compiled":
            forward = torch.compile(model)
        if mode == "compiled-cpp-wrapper":  # inductor's launches from C++, not Python
            forward = torch.compile(model, options={"cpp_wrapper": True})
        optimizer_step = None
        if mode in ("reduce-overhead", "reduce-overhead-step"):
            forward = torch.compile(model, mode="reduce-overhead")
        if mode == "reduce-overhead-step":  # the update compiled too, its learning rate a tensor
            optimizer_step = torch.compile(optimizer.step, mode="reduce-overhead")
        step = step_function(model, forward, optimizer, precision, optimizer_step,
                             mark_step=mode in ("reduce-overhead", "reduce-overhead-step"))
        if mode == "reduce-overhead-whole":
            step = whole_step(step)
        inputs = make_inputs(args.shapes, args.num_classes, batch, device)
        if mode == "captured":
            for x, y in inputs:  # the profiler's steps also warm up what the graph will hold
                step(x, y)
            case["kernel_ms"] = kernel_time_ms(step, inputs)  # its own kernels: capturable Adam differs
            captured = CapturedStep(step)
            call = rotating(captured, inputs)
            for _ in range(captured.warmup + 1):
                call()
            if captured.captured != 1:
                raise RuntimeError(f"not captured: {captured.fallback_reason}")
            case["pool_mib"] = captured.pool_bytes / 2**20
        else:
            call = rotating(step, inputs)
        torch.cuda.reset_peak_memory_stats()
        case["step_ms"], case["call_ms"] = time_step(call, args.smoke)
        case["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        if mode == "eager":
            case["kernel_ms"] = kernel_time_ms(step, inputs)
        case["loss"] = float(call().detach())
        if counters["stats"]["unique_graphs"]:  # what dynamo made of the compiled modes
            case["graphs"] = counters["stats"]["unique_graphs"]
            case["graph_breaks"] = sum(counters["graph_break"].values())
            case["autograd_graphs"] = counters["compiled_autograd"]["captures"]
    except Exception as e:  # noqa: BLE001  (recorded; the rest still run)
        if not isinstance(e, ImportError):
            traceback.print_exc()
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    finally:
        gc.collect()
        torch.cuda.empty_cache()
    print(summary_line(case), flush=True)
    return case


def summary_line(case):
    head = f"{case['net']} {case['precision']} B={case['B']} {case['mode']}:"
    if "error" in case:
        return f"{head} skipped ({case['error']})"
    kern = f", kernels {case['kernel_ms']:.3f} ms" if "kernel_ms" in case else ""
    graphs = f", {graph_note(case)}" if "graphs" in case else ""
    return (f"{head} step {case['step_ms']:.3f} ms, call {case['call_ms']:.3f} ms{kern}, "
            f"peak {case['peak_mib']:.0f} MiB{graphs}")


def graph_note(case):
    """'dynamo graphs: 3 (1 by compiled autograd), graph breaks: 4' for a compiled mode's row."""
    autograd = f" ({case['autograd_graphs']} by compiled autograd)" if case.get("autograd_graphs") else ""
    return f"dynamo graphs: {case['graphs']}{autograd}, graph breaks: {case['graph_breaks']}"


def add_ratios(cases):
    by_key = {(c["net"], c["precision"], c["B"], c["mode"]): c for c in cases}
    for c in cases:
        eager = by_key.get((c["net"], c["precision"], c["B"], "eager"), {})
        captured = by_key.get((c["net"], c["precision"], c["B"], "captured"), {})
        if "step_ms" not in c:
            continue
        kernel_ms = c.get("kernel_ms", eager.get("kernel_ms"))
        if kernel_ms:
            c["x_kernel_time"] = c["step_ms"] / kernel_ms
        if "step_ms" in eager:
            c["speedup_vs_eager"] = eager["step_ms"] / c["step_ms"]
        if "step_ms" in captured:
            c["x_captured"] = c["step_ms"] / captured["step_ms"]


def quick_settings(args) -> None:
    """--quick: --smoke's sizes, and QUICK in place of the lists left at their defaults."""
    args.smoke = True
    defaults = {"nets": DEFAULT_NETS, "batches": DEFAULT_BATCHES, "modes": ",".join(DEFAULT_MODES)}
    for name, value in QUICK.items():
        if getattr(args, name) == defaults[name]:
            setattr(args, name, value)


def check_args(args) -> tuple[list[str], set[int], set[str]]:
    """(modes, compile batches, compile nets); UsageError naming the option, before the device is
    looked at: "--batches 1,x" raised int()'s ValueError (exit 1), an unknown mode was skipped
    silently, "--batches 0" reached the model."""
    names("--nets", args.nets, NETS)
    counts("--batches", args.batches)
    modes = names("--modes", args.modes, MODES)
    compile_batches = set(counts("--compile-batches", args.compile_batches, empty=True))
    none = not args.compile_nets.replace(",", "").strip()  # compile no network
    compile_nets = set() if none else set(names("--compile-nets", args.compile_nets, NETS))
    return modes, compile_batches, compile_nets


@precisions.applied("fp32")  # TF32 matmuls and convolutions for every library alike; the caller's flags after
def run(args) -> int:
    if args.quick:
        quick_settings(args)
    modes, compile_batches, compile_nets = check_args(args)
    if not torch.cuda.is_available():
        raise UsageError("spikefuse bench steps needs a CUDA device: its steps (--quick's too) run in CUDA graphs")
    device = torch.device("cuda")
    args.width = 1 / 16 if args.smoke else 1.0
    cases = []
    for net, precision, batch, opt_name in workloads(args):
        template, args.shapes, args.num_classes = make_model(net, args.width, "auto")
        template = template.to(device)
        # the compiled and launch-path modes (a compile costs ~1 min): chosen networks and batches
        chosen = net in compile_nets and (net not in IPU_NETS or batch in compile_batches)
        wanted = [m for m in modes if m in ("eager", "captured") or chosen]
        peer = not args.no_peers and (net in IPU_NETS or net == "cifar-medium")
        for mode in wanted + (["spikingjelly"] if peer else []):
            if mode == "spikingjelly" and net == "cifar-medium":
                mode = "spikingjelly-cifar"
            if mode == "spikingjelly-cifar":
                cases.append(measure_sj_cifar(precision, batch, args, device))
            else:
                cases.append(measure(net, precision, batch, opt_name, mode, args, device, template))
        del template
    add_ratios(cases)
    payload = {"benchmark": "steps", "environment": environment(), "input_density": INPUT_DENSITY,
               "timing": "CUDA events, medians; step = steady state (10 queued, after 10 more), call = one "
                         "step from an idle GPU; kernel = profiler sum of the GPU kernels of the step run eagerly (captured: with its capturable optimizer)",
               "smoke": args.smoke, "quick": args.quick, "cases": cases}
    # --quick: write_results names it steps-quick-<device>
    paths = write_results("steps-smoke" if args.smoke and not args.quick else "steps", payload,
                          markdown(payload), args.out)
    print("wrote", *paths)
    return 1 if any("error" in c and not c["mode"].startswith("spikingjelly") for c in cases) else 0


def measure_sj_cifar(precision, batch, args, device):
    """SpikingJelly's CIFAR-medium step, eager, from the train benchmark's builder."""
    from .train import make_step, spikingjelly_cifar

    case = {"net": "cifar-medium", "precision": precision, "B": batch, "optimizer": "sgd", "mode": "spikingjelly"}
    try:
        torch.manual_seed(0)
        model = spikingjelly_cifar("medium", args.width, time_steps=10).to(device)
        x = torch.randn(batch, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        step = make_step(model, x, y, precision, "sgd")
        torch.cuda.reset_peak_memory_stats()
        case["step_ms"], case["call_ms"] = time_step(step, args.smoke)
        case["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as e:  # noqa: BLE001
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    print(summary_line(case), flush=True)
    return case


def markdown(payload) -> str:
    env = payload["environment"]
    out = ["# Training step: eager, captured, compiled\n",
           f"{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"{payload['timing']}. IPU inputs: binary frames, {payload['input_density']:.0%} ones.\n"]
    header = ["net", "precision", "B", "mode", "step ms", "call ms", "kernel ms", "x kernel",
              "vs eager", "x captured", "peak MiB", "graph pool MiB", "note"]
    rows = [[c["net"], c["precision"], c["B"], c["mode"], c.get("step_ms"), c.get("call_ms"),
             c.get("kernel_ms"), c.get("x_kernel_time"), c.get("speedup_vs_eager"), c.get("x_captured"),
             c.get("peak_mib"), c.get("pool_mib"), c.get("error") or (graph_note(c) if "graphs" in c else "")]
            for c in payload["cases"]]
    out.append(table(header, rows))
    return "\n".join(out)
