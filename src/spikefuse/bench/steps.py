"""One whole training step (forward, loss, backward, optimizer step) issued four ways, side
by side in one run: eager (Python issues every kernel), captured (spikefuse.capture:
one CUDA-graph replay), torch.compile default (also with inductor's C++ wrapper:
"compiled-cpp-wrapper") and mode="reduce-overhead" (of the model; of the model and the
optimizer step: "reduce-overhead-step"; of the whole step as one function, its backward
traced by compiled autograd: "reduce-overhead-whole"; compiled rows note how many graphs
and graph breaks dynamo made); beside them the
step's GPU kernel time (profiler: the sum of its kernels' durations, what a step costs when
the host is never in the way) and SpikingJelly 2.0's step on the same network in each of its
execution modes (bench.spikingjelly: eager, its StaticCudaGraph as its trainer uses it, and
torch.compile), the captured row compared with the fastest of them.

Networks: the IPU study's dense networks (ipu-shd, ipu-nmnist, ipu-dvsgesture; Adam) at
several batch sizes, widths and precisions (--batches, --widths, --precisions), the CIFAR-10 medium network of Liang et al. (T=10, B=64, SGD; fp32 and
bf16) and a spiking ResNet-18 (T=4, B=32, SGD). Every step reads one of two input batches in
turn, so the captured step pays its copy into the static input buffer like a training loop.
Times: CUDA events, medians; "step" is the steady state (10 steps queued back to back,
timed after 10 more), the median of --rounds alternating rounds in which every mode of the
case is timed in turn (all resident), so drift on a shared GPU hits all alike; "call" one
step from an idle GPU. Peak memory is each mode's absolute peak over one step (its model,
optimizer state, inputs and graph pool included). SpikingJelly's IPU logits are cross-checked
against ours at the same weights.

    spikefuse bench steps --out benchmarks/results
    spikefuse bench steps --quick --out /tmp/bench   # a smoke test: steps-quick-<device>.*
    spikefuse bench steps --nets ipu-shd --batches 1,8 --modes eager,captured
    spikefuse bench steps --nets ipu-shd --batches 1,8 --compile-batches 1,8 --no-peers \
        --modes captured,reduce-overhead-step,reduce-overhead-whole
"""
from __future__ import annotations

import argparse
import copy
import gc
import statistics
import traceback

import torch
from torch import nn
from torch._dynamo.utils import counters

from .. import precision as precisions
from ..errors import UsageError
from ..models import build_model
from ..models.ipu import HIDDEN
from ..neuron_options import check_int
from ..ops.launch import through_triton
from ..capture import CapturedStep, prepare_optimizer
from . import roofline, spikingjelly
from .options import count, counts, names, width as check_width
from .report import environment, table, write_results
from .timing import graph_pool_segments, in_rounds, median_ms, step_peak_bytes

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
QUICK = {"nets": "ipu-shd,cifar-medium", "batches": "1", "modes": "eager,captured", "peer_modes": "eager,graph"}
INPUT_DENSITY = 0.05  # event inputs: a binary frame with this share of ones
DEFAULT_PEER_MODES = ("eager", "graph", "compiled")
PEER_MODES = tuple(f"spikingjelly-{m}" for m in spikingjelly.MODES)
ROUNDS = 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--nets", default=DEFAULT_NETS,
                        help="comma-separated: ipu-shd, ipu-nmnist, ipu-dvsgesture, shd, cifar-medium, resnet18")
    parser.add_argument("--batches", default=DEFAULT_BATCHES, help="batch sizes of the IPU networks")
    parser.add_argument("--widths", default="1", help="width multipliers of the IPU networks (1: 1472-1470 hidden)")
    parser.add_argument("--precisions", default="fp32",
                        help="precisions of the IPU networks: fp32 (TF32 matmuls), bf16 (autocast); CIFAR-medium "
                             "runs both")
    parser.add_argument("--peer-modes", default=",".join(DEFAULT_PEER_MODES),
                        help=f"SpikingJelly's execution modes, of {', '.join(spikingjelly.MODES)} (bench.spikingjelly; "
                             "compiled only on --compile-nets and --compile-batches)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating timing rounds per case (every mode of a case timed in turn each round)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: {','.join(DEFAULT_MODES)}; "
                             "reduce-overhead-step: the optimizer step "
                             "compiled too; reduce-overhead-whole: the whole step compiled as one function, with "
                             "compiled autograd)")
    parser.add_argument("--compile-nets", default="ipu-shd,cifar-medium",
                        help="networks that also run the compiled and launch-path modes")
    parser.add_argument("--compile-batches", default="8",
                        help="IPU batch sizes that also run the compiled modes (compiling costs ~20 s each)")
    parser.add_argument("--no-peers", action="store_true", help="skip SpikingJelly (all its modes)")
    parser.add_argument("--smoke", action="store_true", help="tiny widths and batches, 2 timed steps (tests)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: --smoke's sizes, and unless given, --nets " + QUICK["nets"] + " --batches "
                             + QUICK["batches"] + " --modes " + QUICK["modes"] + "; written as steps-quick-<device>")


# ---- workloads ----

def workloads(args):
    """(net, precision, batch, optimizer name, width) cases in the order they run."""
    nets = names("--nets", args.nets, NETS)
    batches = counts("--batches", args.batches)
    widths = [check_width("--widths", w, max(HIDDEN)) for w in floats("--widths", args.widths)]
    ipu_precisions = names("--precisions", args.precisions, ("fp32", "bf16"))
    cases = []
    for net in nets:
        if net in IPU_NETS:
            cases += [(net, p, b, "adam", w) for w in widths for p in ipu_precisions for b in batches]
        elif net == "cifar-medium":
            cases += [(net, p, 2 if args.smoke else 64, "sgd", 1.0) for p in ("fp32", "bf16")]
        elif net == "resnet18":
            cases.append((net, "fp32", 2 if args.smoke else 32, "sgd", 1.0))
        else:  # shd: the `spikefuse train --dataset shd-synthetic --model shd` step
            cases.append((net, "fp32", 2 if args.smoke else 128, "adam", 1.0))
    return cases


def floats(option, text):
    try:
        values = [float(w) for w in str(text).split(",") if w.strip()]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"{option} {text}: expected comma-separated numbers")
    return values


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


def stream_ms(call, smoke):
    """The steady-state step: 10 queued back to back, after 10 more (timing.median_ms)."""
    ms, _ = median_ms(call, warmup=1 if smoke else 3, min_reps=2 if smoke else 10, max_reps=2 if smoke else 30,
                      back_to_back=1 if smoke else 10, budget_s=1.5)
    return ms


def single_ms(call, smoke):
    """One step from an idle GPU."""
    ms, _ = median_ms(call, warmup=0, min_reps=2 if smoke else 10, max_reps=2 if smoke else 30)
    return ms


def new_case(net, precision, batch, opt_name, mode, width=1.0):
    return {"net": net, "precision": precision, "B": batch, "width": width, "optimizer": opt_name, "mode": mode}


def measure(net, precision, batch, opt_name, mode, args, device, template):
    """One mode's case on its own (prepared, then timed in one round). eager-triton-launch:
    eager with every kernel launched through Triton's own path instead of ops/launch.py's
    cached one (what the cache saves the host)."""
    case = new_case(net, precision, batch, opt_name, mode, args.width)
    call = prepare(case, args, device, template)
    if call is not None:
        time_in_rounds({mode: (case, call)}, args, rounds=1)
    finish(case, call)
    return case


def prepare(case, args, device, template):
    """The case's step built, warmed up (captured where the mode captures) and its GPU time
    and absolute peak memory measured: the call that runs one step, or None with
    case["error"] recorded."""
    try:
        torch._dynamo.reset()
        counters.clear()  # graphs and graph breaks of this case alone
        torch.manual_seed(0)
        gc.collect()
        cuda = device.type == "cuda"
        base = torch.cuda.memory_allocated() if cuda else 0  # what the other modes hold
        pools = graph_pool_segments() if cuda else {}
        inputs = make_inputs(args.shapes, args.num_classes, case["B"], device)
        if case["mode"].startswith("spikingjelly-"):
            call = _prepare_peer(case, args, device, template, inputs)
        else:
            call = _prepare_ours(case, args, device, template, inputs)
        if cuda:
            case["peak_mib"] = step_peak_bytes(call, base, pools) / 2**20
        return call
    except Exception as e:  # noqa: BLE001  (recorded; the rest still run)
        if not isinstance(e, ImportError):
            traceback.print_exc()
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        return None


def _prepare_ours(case, args, device, template, inputs):
    mode = case["mode"]
    model = copy.deepcopy(template)
    optimizer = make_optimizer(case["optimizer"], model.parameters())
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
    step = step_function(model, forward, optimizer, case["precision"], optimizer_step,
                         mark_step=mode in ("reduce-overhead", "reduce-overhead-step"))
    if mode == "reduce-overhead-whole":
        step = whole_step(step)
    if mode == "eager-triton-launch":
        step = triton_launched(step)
    if mode != "captured":
        call = rotating(step, inputs)
        warm(call, args.smoke)
        if mode == "eager":
            case["kernel_ms"] = kernel_time_ms(step, inputs)
        return call
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
    return call


def step_floor(template, args, precision, batch, opt_name, device, measured) -> dict:
    """The case's floor (bench.roofline) from our network: its FLOPs counted over one eager
    step of a copy, its neuron-steps over one forward."""
    try:
        model = copy.deepcopy(template)
        step = step_function(model, model, make_optimizer(opt_name, model.parameters()), precision)
        x, y = make_inputs(args.shapes, args.num_classes, batch, device, count=1)[0]
        flops, steps = roofline.step_flops(lambda: step(x, y)), roofline.neuron_steps(model, x)
        floor, memory, compute = roofline.floor_ms(precision, steps, flops, measured)
        return {"floor_ms": floor, "floor_memory_ms": memory, "floor_compute_ms": compute,
                "neuron_steps": steps, "flops": flops}
    except Exception as e:  # noqa: BLE001  (a floor that cannot be computed must not lose the timings)
        print(f"  floor not computed: {type(e).__name__}: {e}", flush=True)
        return {}
    finally:
        gc.collect()


def triton_launched(step):
    """step with every kernel launched through Triton's own path (ops.launch.through_triton)."""
    def call(x, y):
        with through_triton():
            return step(x, y)
    return call


def _prepare_peer(case, args, device, template, inputs):
    """SpikingJelly's step in the mode the case names (bench.spikingjelly); on the IPU
    networks its logits are first cross-checked against ours at the same weights."""
    net, mode = case["net"], case["mode"].removeprefix("spikingjelly-")
    if net in IPU_NETS:
        model = spikingjelly.mlp(net, args.width).to(device)
        case["cross_check"], case["cross_check_logit_max"] = cross_check(template, model, inputs[0][0],
                                                                        case["precision"])
    elif net == "cifar-medium":
        model = spikingjelly.cifar("medium", args.width, time_steps=10).to(device)
    else:
        raise ImportError(f"no SpikingJelly counterpart of {net} in this benchmark")
    step = spikingjelly.training_step(model, case["optimizer"], case["precision"], mode)
    call = rotating(step, inputs)
    warm(call, args.smoke, at_least=spikingjelly.GRAPH_WARMUP + 2)  # its graph captured, then replayed
    case["kernel_ms"] = kernel_time_ms(step, inputs)  # graph mode: the replay's kernels and the eager update's
    return call


def cross_check(ours, theirs, x, precision):
    """Copy our IPU network's weights into SpikingJelly's and compare the logits on x:
    (the largest difference relative to the largest logit, the largest logit: 0 would mean
    silent networks and a vacuous check). Its LIF rounds h = v(1 - 1/tau) + x its own way,
    so a spike near the threshold may flip; under bf16 autocast its LIF runs in bf16."""
    weights = [m.weight for m in ours.modules() if isinstance(m, nn.Linear)]
    targets = [m.weight for m in theirs.modules() if isinstance(m, nn.Linear)]
    if [w.shape for w in weights] != [t.shape for t in targets]:
        raise RuntimeError("SpikingJelly's network has other layer sizes than ours")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=precision == "bf16"):
        for w, t in zip(weights, targets):
            t.copy_(w)
        a, b = ours(x).float(), theirs(x).float()
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30)), float(a.abs().max())


def warm(call, smoke, at_least=1):
    for _ in range(max(at_least, 1 if smoke else 5)):
        call()


def time_in_rounds(prepared, args, rounds):
    """Each prepared mode's steady-state step timed in alternating rounds (timing.in_rounds:
    drift on a shared GPU hits all alike): step_ms is the median of its round medians,
    round_ms the rounds; then one step from an idle GPU (call_ms) each."""
    calls = {mode: call for mode, (case, call) in prepared.items()}
    times, errors = in_rounds(lambda call: stream_ms(call, args.smoke), calls, rounds)
    for mode, (case, call) in prepared.items():
        if mode in errors:
            case["error"] = f"{type(errors[mode]).__name__}: {str(errors[mode])[:200]}"
            continue
        case["step_ms"], case["round_ms"] = statistics.median(times[mode]), times[mode]
        case["call_ms"] = single_ms(call, args.smoke)


def finish(case, call):
    try:
        if call is not None and "error" not in case:
            case["loss"] = float(call().detach())
            if counters["stats"]["unique_graphs"]:  # what dynamo made of the compiled modes
                case["graphs"] = counters["stats"]["unique_graphs"]
                case["graph_breaks"] = sum(counters["graph_break"].values())
                case["autograd_graphs"] = counters["compiled_autograd"]["captures"]
    except Exception as e:  # noqa: BLE001
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    print(summary_line(case), flush=True)


def summary_line(case):
    head = f"{case['net']} {case['precision']} B={case['B']} {case['mode']}:"
    if case.get("width", 1.0) != 1.0:
        head = f"{case['net']} x{case['width']:g} {case['precision']} B={case['B']} {case['mode']}:"
    if "error" in case:
        return f"{head} skipped ({case['error']})"
    kern = f", kernels {case['kernel_ms']:.3f} ms" if "kernel_ms" in case else ""
    graphs = f", {graph_note(case)}" if "graphs" in case else ""
    peak = f", peak {case['peak_mib']:.0f} MiB" if "peak_mib" in case else ""
    return f"{head} step {case['step_ms']:.3f} ms, call {case['call_ms']:.3f} ms{kern}{peak}{graphs}"


def graph_note(case):
    """'dynamo graphs: 3 (1 by compiled autograd), graph breaks: 4' for a compiled mode's row."""
    autograd = f" ({case['autograd_graphs']} by compiled autograd)" if case.get("autograd_graphs") else ""
    return f"dynamo graphs: {case['graphs']}{autograd}, graph breaks: {case['graph_breaks']}"


def case_key(c):
    return c["net"], c.get("width", 1.0), c["precision"], c["B"]


def add_ratios(cases):
    """Per row: against its own eager and captured rows and its GPU time; on the captured
    row, SpikingJelly's fastest mode over ours (wall and GPU time) and where we stand: a tie
    where the two rows' rounds overlap once widened by TIE (the issue's rule), else ahead or
    behind."""
    by_key = {(*case_key(c), c["mode"]): c for c in cases}
    for c in cases:
        eager = by_key.get((*case_key(c), "eager"), {})
        captured = by_key.get((*case_key(c), "captured"), {})
        if "step_ms" not in c:
            continue
        kernel_ms = c.get("kernel_ms", eager.get("kernel_ms"))
        if kernel_ms:
            c["x_kernel_time"] = c["step_ms"] / kernel_ms
        if "step_ms" in eager:
            c["speedup_vs_eager"] = eager["step_ms"] / c["step_ms"]
        if "step_ms" in captured:
            c["x_captured"] = c["step_ms"] / captured["step_ms"]
        if c.get("kernel_ms") and c.get("floor_ms"):
            c["gpu_x_floor"] = c["kernel_ms"] / c["floor_ms"]
    for c in cases:
        peers = [by_key.get((*case_key(c), m), {}) for m in PEER_MODES]
        peers = [p for p in peers if "step_ms" in p]
        if c["mode"] != "captured" or "step_ms" not in c or not peers:
            continue
        best = min(peers, key=lambda p: p["step_ms"])
        c["sj_best_mode"], c["sj_best_ms"] = best["mode"], best["step_ms"]
        c["vs_sj_best"] = best["step_ms"] / c["step_ms"]
        if best.get("kernel_ms") and c.get("kernel_ms"):
            c["vs_sj_best_gpu"] = best["kernel_ms"] / c["kernel_ms"]
        if best.get("peak_mib") and c.get("peak_mib"):
            c["peak_vs_sj_best"] = c["peak_mib"] / best["peak_mib"]
        c["standing"] = standing(c.get("round_ms") or [c["step_ms"]], best.get("round_ms") or [best["step_ms"]])


TIE = 0.02  # the issue's tie: the rounds' ranges overlap within 2 %


def standing(ours, theirs):
    """'tie' where [min, max] of our rounds and of theirs overlap once each is widened by
    TIE; else 'ahead' (ours faster) or 'behind'."""
    if min(ours) * (1 - TIE) <= max(theirs) * (1 + TIE) and min(theirs) * (1 - TIE) <= max(ours) * (1 + TIE):
        return "tie"
    return "ahead" if statistics.median(ours) < statistics.median(theirs) else "behind"


def quick_settings(args) -> None:
    """--quick: --smoke's sizes, and QUICK in place of the lists left at their defaults."""
    args.smoke = True
    defaults = {"nets": DEFAULT_NETS, "batches": DEFAULT_BATCHES, "modes": ",".join(DEFAULT_MODES),
                "peer_modes": ",".join(DEFAULT_PEER_MODES)}
    for name, value in QUICK.items():
        if getattr(args, name) == defaults[name]:
            setattr(args, name, value)


def check_args(args) -> tuple[list[str], list[str], set[int], set[str]]:
    """(modes, SpikingJelly's modes, compile batches, compile nets); UsageError naming the option, before the device is
    looked at: "--batches 1,x" raised int()'s ValueError (exit 1), an unknown mode was skipped
    silently, "--batches 0" reached the model."""
    workloads(args)  # --nets, --batches, --widths, --precisions
    modes = names("--modes", args.modes, MODES)
    peer_modes = [] if args.no_peers else names("--peer-modes", args.peer_modes, spikingjelly.MODES)
    count("--rounds", args.rounds)
    compile_batches = set(counts("--compile-batches", args.compile_batches, empty=True))
    none = not args.compile_nets.replace(",", "").strip()  # compile no network
    compile_nets = set() if none else set(names("--compile-nets", args.compile_nets, NETS))
    return modes, peer_modes, compile_batches, compile_nets


@precisions.applied("fp32")  # TF32 matmuls and convolutions for every library alike; the caller's flags after
def run(args) -> int:
    if args.quick:
        quick_settings(args)
    modes, peer_modes, compile_batches, compile_nets = check_args(args)
    if not torch.cuda.is_available():
        raise UsageError("spikefuse bench steps needs a CUDA device: its steps (--quick's too) run in CUDA graphs")
    device = torch.device("cuda")
    rounds = 1 if args.smoke else args.rounds
    measured = roofline.rates(device, args.smoke)  # the floor's copy bandwidth and matmul rates
    cases = []
    for net, precision, batch, opt_name, width in workloads(args):
        args.width = width / 16 if args.smoke else width
        template, args.shapes, args.num_classes = make_model(net, args.width, "auto")
        template = template.to(device)
        # the compiled and launch-path modes (a compile costs ~1 min): chosen networks and batches
        chosen = net in compile_nets and (net not in IPU_NETS or batch in compile_batches)
        wanted = [m for m in modes if m in ("eager", "captured") or chosen]
        peer = net in IPU_NETS or net == "cifar-medium"
        wanted += [f"spikingjelly-{m}" for m in peer_modes if peer and (m != "compiled" or chosen)]
        floor = step_floor(template, args, precision, batch, opt_name, device, measured)
        prepared = {}
        for mode in wanted:  # all built first, all resident while the rounds alternate
            case = new_case(net, precision, batch, opt_name, mode, width)
            case.update(floor)
            cases.append(case)
            call = prepare(case, args, device, template)
            if call is not None:
                prepared[mode] = (case, call)
        time_in_rounds(prepared, args, rounds)
        for mode, (case, call) in prepared.items():
            finish(case, call)
        del template, prepared
        gc.collect()
        torch.cuda.empty_cache()
    add_ratios(cases)
    payload = {"benchmark": "steps", "environment": environment(), "input_density": INPUT_DENSITY,
               "timing": f"CUDA events, medians; step = steady state (10 queued, after 10 more), the median of "
                         f"{rounds} alternating rounds' medians (every mode of a case resident, timed in turn); "
                         "call = one step from an idle GPU; kernel = profiler sum of the GPU kernels of the step "
                         "(captured: run eagerly with its capturable optimizer; SpikingJelly's graph mode: its "
                         "replays and its eager update); peak = absolute peak of one step (model, optimizer "
                         "state, inputs, graph pool and what the step allocates)",
               "floor": f"bench.roofline: {roofline.FLOOR_BYTES} bytes per neuron-step at the copy bandwidth "
                        "plus the step's matmul/conv FLOPs at the matmul rate, both measured in this run; "
                        "'GPU x floor' is the row's profiler GPU time over it", "rates": measured,
               "smoke": args.smoke, "quick": args.quick, "rounds": rounds, "cases": cases}
    # --quick: write_results names it steps-quick-<device>
    paths = write_results("steps-smoke" if args.smoke and not args.quick else "steps", payload,
                          markdown(payload), args.out)
    print("wrote", *paths)
    return 1 if any("error" in c and not c["mode"].startswith("spikingjelly") for c in cases) else 0


def markdown(payload) -> str:
    env = payload["environment"]
    out = ["# Training step: eager, captured, compiled, and SpikingJelly's modes\n",
           f"{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"{payload['timing']}. IPU inputs: binary frames, {payload['input_density']:.0%} ones.\n"]
    header = ["net", "width", "precision", "B", "mode", "step ms", "rounds spread", "call ms", "kernel ms",
              "x kernel", "floor ms", "GPU x floor", "vs eager", "x captured", "peak MiB", "graph pool MiB", "SJ best / ours (wall)",
              "(GPU)", "standing", "peak / SJ best's", "note"]

    def spread(c):
        r = c.get("round_ms")
        return (max(r) - min(r)) / c["step_ms"] if r and c.get("step_ms") else None

    def note(c):
        if c.get("error"):
            return c["error"]
        parts = [graph_note(c)] if "graphs" in c else []
        if "sj_best_mode" in c:
            parts.append(f"SJ best: {c['sj_best_mode']}")
        if "cross_check" in c:
            parts.append(f"logits vs ours at the same weights: {c['cross_check']:.1e}")
        return "; ".join(parts)

    rows = [[c["net"], c.get("width", 1.0), c["precision"], c["B"], c["mode"], c.get("step_ms"), spread(c),
             c.get("call_ms"), c.get("kernel_ms"), c.get("x_kernel_time"), c.get("floor_ms"), c.get("gpu_x_floor"),
             c.get("speedup_vs_eager"),
             c.get("x_captured"), c.get("peak_mib"), c.get("pool_mib"), c.get("vs_sj_best"), c.get("vs_sj_best_gpu"),
             c.get("standing"), c.get("peak_vs_sj_best"), note(c)]
            for c in payload["cases"]]
    out.append(table(header, rows))
    return "\n".join(out)
