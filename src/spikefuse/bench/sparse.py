"""Sparse against dense training steps of the IPU study's networks, and where each wins.

Per case (network, width, batch, secondary threshold theta_grad), side by side in one run,
every step captured in one CUDA graph (the dense baseline is the captured dense step):
- dense:        IPUNet(sparse=False), torch Adam(fused=True): the study's dense network;
- sparse-adam:  IPUNet(sparse="sparse", grad_threshold=theta_grad), the same fused Adam
                (what the sparse backward alone saves);
- sparse:       the same network with spikefuse.optim.LazyAdam (zero gradient rows skipped);
- auto:         IPUNet(sparse=True): backward chosen by update_dispatch after warm-up, LazyAdam;
- spikingjelly: SpikingJelly 2.0's dense network, eager (small cases only).
Activity (--activity): "natural" is the network's own at initialisation (random weights,
5 % input events), held there by a learning rate of 0 (--lr): every update still runs, but
the weights, and so the activity, stay put (at 1e-3 the random-label steps drive the hidden
rates to 10-40 % within the warm-up); theta_grad then sets the share of neurons that carry
gradient (reported per case). A number p is the IPU study's "fixed activity": in every
hidden layer the same p of the neurons fire at every step and carry gradient, the rest stay
silent (force_activity).
Also the weight-gradient kernel alone against cuBLAS at 1-5 % carrying outputs.
Cross-checks: the sparse step's gradients against the dense backward's with the same cut.

    spikefuse bench sparse --out benchmarks/results
    spikefuse bench sparse --quick --out /tmp/bench   # a smoke test (CPU too): sparse-quick-<device>.*
"""
from __future__ import annotations

import argparse
import copy
import gc
import math
import traceback
from collections import Counter

import torch
from torch import nn

from .. import precision as precisions
from ..models.ipu import HIDDEN, NETWORKS, IPUNet
from ..nn import LIF
from ..nn.recurrent_lif import RecurrentLIF
from ..nn.sparse_linear import SparseSpikingLinear, update_dispatch
from ..optim import LazyAdam
from ..errors import UsageError
from ..train.config import MAX_COUNT
from ..capture import CapturedStep, prepare_optimizer
from . import options
from .report import environment, table, write_results
from . import spikingjelly
from .steps import INPUT_DENSITY
from .timing import captured, median_ms

MODES = ("dense", "sparse-adam", "sparse", "auto", "spikingjelly")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--cases", default="default",
                        help="'default' (the acceptance region first, then the rest), 'map' (the IPU study's "
                             "grid: widths x1/x4/x16 by batches 1/8/48/256, feed-forward and recurrent, less "
                             "x16 at batch 256 and the recurrent x16), its halves 'map-feedforward' and "
                             "'map-recurrent', or "
                             "net:width:batch:theta,...")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate of the timed steps; 0 (default) keeps the weights, and so the "
                             "activity, at their random initial values while every update still runs "
                             "(--train: 2e-3, cosine-annealed, as spikefuse train)")
    parser.add_argument("--activity", default="natural",
                        help="comma-separated: 'natural' and/or fixed spike shares, e.g. natural,0.01,0.025,0.05,0.1 "
                             "(every case runs at each)")
    parser.add_argument("--no-kernel", action="store_true", help="skip the weight-gradient kernel comparison")
    parser.add_argument("--chart", action=argparse.BooleanOptionalAction, default=True,
                        help="draw the run (sparse-<device>.png; needs matplotlib; default on)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, eager, runs on the CPU (tests)")
    parser.add_argument("--quick", action="store_true",
                        help="--smoke's tiny cases (captured on a GPU, eager on the CPU), marked and named as a "
                             "quick run (sparse-quick-<device>): a smoke test")
    train = parser.add_argument_group("--train: whole training runs, time to accuracy (spikefuse.bench.sparse_train)")
    train.add_argument("--train", action="store_true",
                       help="train dense, sparse and control runs from the same init and time them to accuracy "
                            "(--cases then takes task:net:width:batch items, or 'default')")
    train.add_argument("--runs", default="dense,sparse,dense-lazyadam,dense-free",
                       help="comma-separated, of dense, sparse, dense-lazyadam, dense-free (the dense run "
                            "without the regulariser; only with --max-rate, --rate-l1 or --rate-log)")
    train.add_argument("--epochs", type=int, default=20, help="epochs per run (default: 20)")
    train.add_argument("--seeds", default="0", help="comma-separated seeds: init and data order (default: 0)")
    train.add_argument("--max-rate", type=float, default=None,
                       help="the rate regulariser of spikefuse train --max-rate, on every run but dense-free")
    train.add_argument("--rate-weight", type=float, default=100.0, help="its weight (default: 100)")
    train.add_argument("--rate-l1", type=float, default=0.0,
                       help="weight of the L1 term on spikes of spikefuse train --rate-l1, on every run but "
                            "dense-free (default: 0, none)")
    train.add_argument("--rate-log", type=float, default=0.0,
                       help="weight of the log term on rates of spikefuse train --rate-log, on every run but "
                            "dense-free (default: 0, none; spikefuse train --sparse's default: 0.05)")
    train.add_argument("--grad-threshold", type=float, default=0.9,
                       help="the sparse run's cut, as a fraction of the threshold (default: 0.9, IPUNet's)")
    train.add_argument("--margin", type=float, default=1.0,
                       help="the target: the dense run's best test accuracy minus this many points (default: 1)")


def default_cases():
    """The acceptance's region first (width >= x4, batch <= 8), then the rest of the map."""
    cases = [("ipu-shd", w, b, 0.9) for w in (4, 16) for b in (1, 8)]
    cases += [("ipu-shd", 4, 8, theta) for theta in (0.5, float("-inf"))]
    cases += [(net, 4, 8, 0.9) for net in ("ipu-nmnist", "ipu-dvsgesture")]
    cases += [("ipu-shd", 1, b, 0.9) for b in (1, 8, 48)] + [("ipu-shd", 4, b, 0.9) for b in (48, 256)]
    cases += [("ipu-shd", 16, 48, 0.9), ("ipu-shd", 1, 256, 0.9), ("ipu-shd", 4, 8, 0.0)]
    cases += [("ipu-shd-recurrent", w, b, 0.9) for w in (4, 1) for b in (1, 8)]
    cases += [("ipu-shd-recurrent", 4, b, 0.9) for b in (48, 256)]
    return cases


def network(net):
    """(the study's network spec, recurrent?) for a case's name: "ipu-shd" or "ipu-shd-recurrent"."""
    base = net.removesuffix("-recurrent")
    if base not in NETWORKS:
        raise ValueError(f"--cases: unknown network {net!r}; expected one of {list(NETWORKS)}, "
                         "optionally with -recurrent")
    return NETWORKS[base], net != base


def map_cases():
    """The IPU study's grid for the map (with --activity natural,0.01,0.025,0.05,0.1): widths
    x1, x4, x16 by batches 1, 8, 48, 256 on the SHD network, feed-forward and recurrent; x16 at
    batch 256 and the recurrent x16 (a 2.2 GB W read at every step) are left out to keep a run
    within minutes."""
    cases = [("ipu-shd", w, b, 0.9) for w in (1, 4, 16) for b in (1, 8, 48, 256) if (w, b) != (16, 256)]
    return cases + [("ipu-shd-recurrent", w, b, 0.9) for w in (1, 4) for b in (1, 8, 48, 256)]


def parse_cases(text):
    if text == "default":
        return default_cases()
    if text == "map":
        return map_cases()
    if text in ("map-feedforward", "map-recurrent"):  # each half within one 10-minute call
        recurrent = text == "map-recurrent"
        return [case for case in map_cases() if case[0].endswith("-recurrent") == recurrent]
    out = []
    for item in text.split(","):
        try:
            net, width, batch, theta = item.split(":")
            case = (net, float(width), int(batch), float(theta))
        except ValueError:
            raise ValueError(f"--cases: expected net:width:batch:theta_grad items, got {item!r}") from None
        network(net)
        # an infinite width, a batch of 2**70 and a NaN theta were taken (failing once measured)
        if not (0 < case[1] < math.inf and 1 <= case[2] <= MAX_COUNT and case[3] < math.inf):
            raise ValueError(f"--cases: width must be finite and > 0, batch from 1 to {MAX_COUNT} and theta a real "
                             f"number or -inf (no cut), got {item!r}")
        options.width(f"--cases {item!r}", case[1], max(HIDDEN))
        out.append(case)
    return out


def parse_activities(text):
    """'natural,0.01' -> ["natural", 0.01]; a share must lie in (0, 1]."""
    out = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        if item == "natural":
            out.append(item)
            continue
        try:
            share = float(item)
        except ValueError:
            share = float("nan")
        if not 0.0 < share <= 1.0:
            raise ValueError(f"--activity: expected 'natural' or a spike share in (0, 1], got {item!r}")
        out.append(share)
    if not out:
        raise ValueError("--activity: expected 'natural' or spike shares in (0, 1]")
    return out


FORCED_MARGIN = 0.2   # the chosen neurons' potential sits this far above threshold ...
SILENT_DRIVE = -1.0   # ... the others' this low (below any secondary threshold >= -1)
WEIGHT_SWING = 0.05   # the most the weights may move a potential, whatever spikes arrive


@torch.no_grad()
def force_activity(model, share, generator):
    """Fixed activity: in every hidden LIF layer of an IPUNet the same round(share x N)
    randomly chosen neurons fire at every step and carry gradient; the rest never come near
    threshold. A constant drive added to each LIF's input does it (threshold +
    FORCED_MARGIN on the chosen neurons, SILENT_DRIVE elsewhere), and the weights feeding a
    LIF (recurrent ones too) shrink to |W s| <= WEIGHT_SWING, so the drive alone decides
    while gradient still flows down through them. Timing is unchanged by the weights'
    values (dense GEMMs); the drive costs one elementwise add per layer, in every mode."""
    layers = list(model.layers)
    for feeder, lif in zip(layers, layers[1:]):
        if not isinstance(lif, (LIF, RecurrentLIF)) or not isinstance(feeder, nn.Linear):
            continue
        n = feeder.out_features
        feeder.weight.uniform_(-WEIGHT_SWING / feeder.in_features, WEIGHT_SWING / feeder.in_features,
                               generator=generator)
        if isinstance(lif, RecurrentLIF):
            lif.weight.uniform_(-WEIGHT_SWING / n, WEIGHT_SWING / n, generator=generator)
        chosen = torch.randperm(n, generator=generator, device=generator.device)[:round(share * n)]
        drive = torch.full((n,), SILENT_DRIVE, device=feeder.weight.device, dtype=feeder.weight.dtype)
        drive[chosen] = lif.threshold + FORCED_MARGIN
        lif.register_forward_pre_hook(lambda module, args, drive=drive: (args[0] + drive, *args[1:]))


def build(net, width, mode, theta):
    spec, recurrent = network(net)
    if mode == "spikingjelly":
        if recurrent:
            raise ImportError("no SpikingJelly recurrent counterpart in this benchmark")
        return spikingjelly.mlp(net, width)
    sparse = {"dense": False, "auto": True}.get(mode, "sparse")
    lif = {} if mode == "dense" else {"grad_threshold": theta}
    return IPUNet(spec.input_shape, spec.num_classes, width=width, sparse=sparse, recurrent=recurrent, **lif)


def dispatched(model):
    """The layers whose path dispatch chooses: sparse Linear layers and recurrent LIFs."""
    return [m for m in model.modules() if isinstance(m, (SparseSpikingLinear, RecurrentLIF))]


def optimizer_for(mode, model, capture, lr):
    if mode in ("sparse", "auto"):
        opt = LazyAdam(model.parameters(), lr=lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, fused=capture or None)
    if capture and mode != "spikingjelly" and prepare_optimizer(opt) is not None:
        raise RuntimeError("optimizer not capturable")
    return opt


def make_step(model, opt):
    def step(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def hidden_activity(model, x):
    """Spike rate of each hidden LIF layer on x (forward only)."""
    rates = []
    hooks = [m.register_forward_hook(lambda m, i, o: rates.append(float(o.float().mean())))
             for m in model.modules() if type(m).__name__ in ("LIF", "RecurrentLIF")]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return rates


def measure(case, mode, args, device, template_state, activity="natural"):
    net, width, batch, theta = case
    row = {"net": net, "width": width, "B": batch, "theta_grad": theta, "mode": mode, "activity": activity}
    capture = device.type == "cuda"
    try:
        torch.manual_seed(0)
        with torch.device(device):  # initialised where it runs (x16 has 0.6 G weights)
            model = build(net, width, mode, theta)
        if mode != "spikingjelly":
            model.load_state_dict(template_state)
            if activity != "natural":
                force_activity(model, activity, torch.Generator(device=device).manual_seed(2))
        elif activity != "natural":
            raise ImportError("fixed activity is not set up for the SpikingJelly network")
        opt = optimizer_for(mode, model, capture and mode != "spikingjelly", args.lr)
        spec, _ = network(net)
        T = 4 if args.smoke else spec.time_steps
        gen = torch.Generator(device=device).manual_seed(1)
        inputs = [((torch.rand(T, batch, *spec.input_shape, device=device, generator=gen) < INPUT_DENSITY).float(),
                   torch.randint(0, spec.num_classes, (batch,), device=device, generator=gen)) for _ in range(2)]
        step = make_step(model, opt)
        for x, y in inputs * 2:  # warm-up: lazy state, Triton compiles, the carrying counts
            step(x, y)
        if mode != "spikingjelly":  # the sparse layers' capacities, and auto's choices, as a trainer sets them
            update_dispatch(model)
        if mode == "auto":
            row["auto_choice"] = ["sparse" if m.sparse else "dense" for m in dispatched(model)]
        if capture and mode != "spikingjelly":
            step = CapturedStep(step)
        state = {"i": 0}

        def call():
            state["i"] += 1
            return step(*inputs[state["i"] % 2])
        for _ in range(4):
            call()
        if capture and mode != "spikingjelly" and step.captured != 1:
            raise RuntimeError(f"not captured: {step.fallback_reason}")
        for m in model.modules():  # count the shares over the timed steps only
            if isinstance(m, SparseSpikingLinear):
                m.carrying_share(reset=True)
            elif isinstance(m, RecurrentLIF):
                m.active_share(reset=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        row["step_ms"], _ = median_ms(call, warmup=2, min_reps=3 if args.smoke else 10, max_reps=30,
                                      back_to_back=1 if args.smoke else 5, budget_s=1.5)
        if device.type == "cuda":
            row["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        shares = [m.carrying_share() for m in model.modules() if isinstance(m, SparseSpikingLinear)]
        if shares:
            row["carrying_share"] = shares
        active = [m.active_share() for m in model.modules() if isinstance(m, RecurrentLIF) and m.path == "auto"]
        if active and None not in active:
            row["recurrent_active_share"] = active
        if mode == "dense":
            row["spike_rate"] = hidden_activity(model, inputs[0][0])
    except Exception as e:  # noqa: BLE001  (recorded; the rest still run)
        if not isinstance(e, ImportError):
            traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(summary_line(row), flush=True)
    return row


def cross_check(case, device, smoke):
    """Max relative difference of every parameter gradient: sparse backward against the dense
    backward of the same network (same cut), one step on the same batch."""
    net, width, batch, theta = case
    spec, recurrent = network(net)
    torch.manual_seed(0)
    with torch.device(device):
        sparse = IPUNet(spec.input_shape, spec.num_classes, width=width, sparse="sparse", grad_threshold=theta,
                        recurrent=recurrent)
    dense = copy.deepcopy(sparse)
    for m in dispatched(dense):
        m.sparse = False
    T = 4 if smoke else spec.time_steps
    x = (torch.rand(T, batch, *spec.input_shape, device=device) < INPUT_DENSITY).float()
    y = torch.randint(0, spec.num_classes, (batch,), device=device)
    for model in (sparse, dense):
        nn.functional.cross_entropy(model(x), y).backward()
    worst = 0.0
    for a, b in zip(sparse.parameters(), dense.parameters()):
        scale = b.grad.abs().max().clamp_min(1e-30)
        worst = max(worst, float((a.grad - b.grad).abs().max() / scale))
    return worst


def weight_grad_kernel(device, smoke):
    """The layer-2 weight gradient at width x4 (5880 x 5888) and x16, R = T*B rows: cuBLAS
    (gy^T @ s, dense, s as float32) against the sparse path with its dense zero-filled
    output, the path on a pre-zeroed gradient (row-sparse: what LazyAdam consumes), both
    with the listing of the carrying columns (flags, list, gather; shared with the input
    gradient), and the weight-gradient kernel alone on the listed block; the sparse kernel
    reads s as the forward saved it, bits."""
    from ..ops.sparse_linear import _precision, gather_carrying, weight_grad
    from ..ops.spike_pack import pack
    rows = []
    shapes = [(5880, 5888, 100), (5880, 5888, 800), (23520, 23552, 100)] if not smoke else [(40, 48, 12)]
    for out_f, in_f, R in shapes:
        for share in (0.01, 0.02, 0.05):
            gen = torch.Generator(device=device).manual_seed(0)
            cols = torch.rand(out_f, device=device, generator=gen) < share
            gy = torch.randn(R, out_f, device=device, generator=gen) * cols
            s = (torch.rand(R, in_f, device=device, generator=gen) < 0.02).float()
            bits = pack(s)  # as the forward saves them
            gw = torch.zeros(out_f, in_f, device=device)
            prec = _precision(gy)

            def sparse_kernel_only():
                gyt, c, n = gather_carrying(gy)
                weight_grad(gyt, bits, c, n, gw, prec)

            def sparse_dense_output():
                gw.zero_()
                sparse_kernel_only()
            listed = gather_carrying(gy)
            sparse_kernel_only()
            dense = gy.t() @ s  # both on TF32: compared relative to the largest entry
            ok = float((gw - dense).abs().max() / dense.abs().max().clamp_min(1e-30)) < 5e-3
            kw = dict(warmup=3, min_reps=5, max_reps=50, budget_s=0.5)
            calls = {"dense": lambda: gy.t() @ s, "sparse_dense_output": sparse_dense_output,
                     "sparse_row_sparse": sparse_kernel_only,
                     "sparse_kernel_alone": lambda: weight_grad(listed[0], bits, listed[1], listed[2], gw, prec)}
            row = {"out": out_f, "in": in_f, "R": R, "carrying_share": float(cols.float().mean()),
                   "matches_dense": ok}
            for name, call in calls.items():  # eager: one call from the host, its launches included
                row[f"{name}_ms"] = median_ms(call, **kw)[0]
            if device.type == "cuda":  # captured: the kernels' GPU time, as in a captured step
                for name, call in calls.items():
                    row[f"{name}_captured_ms"] = median_ms(captured(call)[0], back_to_back=10, **kw)[0]
            for suffix in ("", "_captured"):
                if f"dense{suffix}_ms" in row:
                    for output in ("dense_output", "row_sparse", "kernel_alone"):
                        row[f"speedup_{output}{suffix}"] = row[f"dense{suffix}_ms"] / row[f"sparse_{output}{suffix}_ms"]
            print(f"weight grad {out_f}x{in_f} R={R} carrying {row['carrying_share']:.3f}: dense {row['dense_ms']:.4f} ms, "
                  f"sparse {row['sparse_dense_output_ms']:.4f} (zero-filled) / {row['sparse_row_sparse_ms']:.4f} "
                  f"(row-sparse), matches {ok}" + (
                      f"; captured: dense {row['dense_captured_ms']:.4f}, sparse "
                      f"{row['sparse_dense_output_captured_ms']:.4f} / {row['sparse_row_sparse_captured_ms']:.4f}, "
                      f"kernel alone {row['sparse_kernel_alone_captured_ms']:.4f}"
                      if "dense_captured_ms" in row else ""), flush=True)
            rows.append(row)
    return rows


def summary_line(row):
    activity = row.get("activity", "natural")
    activity = activity if activity == "natural" else f"fixed {activity:g}"
    head = f"{row['net']} x{row['width']:g} B={row['B']} theta={row['theta_grad']:g} {activity} {row['mode']}:"
    if "error" in row:
        return f"{head} skipped ({row['error']})"
    extra = f", carrying {row['carrying_share']}" if "carrying_share" in row else ""
    return f"{head} step {row['step_ms']:.3f} ms{extra}"


def case_key(r):
    return r["net"], r["width"], r["B"], r["theta_grad"], r.get("activity", "natural")


def add_ratios(rows):
    by = {(*case_key(r), r["mode"]): r for r in rows}
    for r in rows:
        dense = by.get((*case_key(r), "dense"), {})
        if "step_ms" in r and "step_ms" in dense:
            r["speedup_vs_dense"] = dense["step_ms"] / r["step_ms"]
    for key in {k[:5] for k in by}:  # dispatch against the better of the fixed choices
        auto, best = by.get((*key, "auto"), {}), [by.get((*key, m), {}).get("step_ms") for m in ("dense", "sparse")]
        best = [b for b in best if b is not None]
        if "step_ms" in auto and best:
            auto["x_best_fixed"] = auto["step_ms"] / min(best)


@precisions.applied("fp32")  # TF32 matmuls and convolutions for every library alike; the caller's flags after
def run(args) -> int:
    if args.train:
        from .sparse_train import run as run_training
        if args.lr is None:
            args.lr = 2e-3
        return run_training(args)
    if args.lr is None:
        args.lr = 0.0
    elif args.lr != 0:  # 0 keeps the weights; NaN, inf or -1 were taken
        options.rate("--lr", args.lr)
    args.smoke = args.smoke or args.quick
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise UsageError(f"--modes {args.modes}: pick from {', '.join(MODES)}")
    try:
        activities = parse_activities(args.activity)
        cases = ([("ipu-shd", 1 / 64, 2, 0.9), ("ipu-shd-recurrent", 1 / 64, 2, 0.9)] if args.smoke
                 else parse_cases(args.cases))
    except ValueError as e:
        raise UsageError(str(e)) from None
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise UsageError("spikefuse bench sparse needs a CUDA device (or --quick, tiny sizes on the CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    rows, checks = [], []

    def save(kernel=()):  # after every case: a run cut short keeps what it measured
        add_ratios(rows)
        payload = {"benchmark": "sparse", "environment": environment(), "input_density": INPUT_DENSITY,
                   "timing": "CUDA events, medians of 5 captured steps queued back to back (steady state); "
                             "every spikefuse mode is one CUDA-graph replay; SpikingJelly eager",
                   "lr": args.lr,
                   "smoke": args.smoke, "quick": args.quick, "cases": rows, "cross_checks": checks,
                   "weight_grad_kernel": list(kernel)}
        # --quick: write_results names it sparse-quick-<device>
        return write_results("sparse-smoke" if args.smoke and not args.quick else "sparse", payload,
                             markdown(payload), args.out)
    kernel = [] if args.no_kernel else weight_grad_kernel(device, args.smoke)
    save(kernel)
    for case in cases:
        net, width, batch, theta = case
        spec, recurrent = network(net)
        torch.manual_seed(0)
        with torch.device(device):
            template_state = IPUNet(spec.input_shape, spec.num_classes, width=width, recurrent=recurrent).state_dict()
        for activity in activities:
            for mode in modes:
                if mode == "spikingjelly" and (width > 4 or batch > 8 or theta != 0.9 or activity != "natural"):
                    continue
                rows.append(measure(case, mode, args, device, template_state, activity))
        try:
            checks.append({"case": case, "max_rel_grad_diff": cross_check(case, device, args.smoke)})
            print(f"cross-check {case}: sparse vs dense backward, max rel grad diff {checks[-1]['max_rel_grad_diff']:.2e}")
        except Exception as e:  # noqa: BLE001
            checks.append({"case": case, "error": str(e)[:200]})
        paths = save(kernel)
    if args.chart:
        paths = (*paths, chart(rows, paths[0].removesuffix(".json") + ".png", quick=args.quick))
    print("wrote", *[p for p in paths if p])
    return 1 if any("error" in r and r["mode"] != "spikingjelly" for r in rows) else 0


def markdown(payload) -> str:
    env = payload["environment"]
    out = ["# Sparse vs dense training steps (IPU-study networks)\n",
           f"{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"{payload['timing']}. Inputs: binary frames, {payload['input_density']:.0%} ones; activity "
           "natural (random initial weights) or fixed (a share p of each hidden layer's neurons forced to fire "
           f"at every step and carry gradient, the rest silent), learning rate {payload['lr']:g} (0: the weights stay at their "
           "initial values, every update still runs). Optimizers: dense and sparse-adam torch Adam(fused=True), "
           "sparse and auto spikefuse LazyAdam.\n"]
    header = ["net", "width", "B", "theta_grad", "activity", "mode", "step ms", "x dense", "carrying share",
              "recurrent active share", "hidden spike rates", "auto choice", "auto / best fixed", "peak MiB", "note"]
    rows = [[r["net"], r["width"], r["B"], r["theta_grad"], r.get("activity", "natural"), r["mode"], r.get("step_ms"), r.get("speedup_vs_dense"),
             ", ".join(f"{s:.4f}" for s in r.get("carrying_share", [])),
             ", ".join(f"{s:.4f}" for s in r.get("recurrent_active_share", [])),
             ", ".join(f"{s:.4f}" for s in r.get("spike_rate", [])), ",".join(r.get("auto_choice", [])),
             r.get("x_best_fixed"), r.get("peak_mib"), r.get("error", "")] for r in payload["cases"]]
    out.append(table(header, rows))
    out.append("\n## Cross-checks (sparse vs dense backward, same cut)\n")
    out.append(table(["case", "max rel grad diff", "error"],
                     [[str(c["case"]), c.get("max_rel_grad_diff"), c.get("error", "")] for c in payload["cross_checks"]]))
    if payload["weight_grad_kernel"]:
        out.append("\n## Weight-gradient kernel (layer 2), dense cuBLAS TF32 vs sparse\n")
        out.append("Dense: cuBLAS on float32 spikes (a training step would first unpack them from bits, "
                   "not counted here). Sparse: flagging the carrying columns, listing and gathering them, the "
                   "kernel on the spikes' bits (and, zero-filled, the dense gradient's memset); kernel alone: the "
                   "weight-gradient kernel on the listed block (the listing is shared with the input gradient). "
                   "Eager: one call from the host, launches included. "
                   "Captured: the same calls replayed from a CUDA graph, 10 queued back to back (the GPU's "
                   "time, as inside a captured training step).\n")
        out.append(table(["out x in", "R", "carrying", "dense ms", "sparse zero-filled ms", "x", "sparse row-sparse ms",
                          "x", "captured: dense ms", "zero-filled ms", "x", "row-sparse ms", "x", "kernel alone ms", "x",
                          "matches"],
                         [[f"{k['out']}x{k['in']}", k["R"], k["carrying_share"], k["dense_ms"],
                           k["sparse_dense_output_ms"], k["speedup_dense_output"], k["sparse_row_sparse_ms"],
                           k["speedup_row_sparse"], k.get("dense_captured_ms"),
                           k.get("sparse_dense_output_captured_ms"), k.get("speedup_dense_output_captured"),
                           k.get("sparse_row_sparse_captured_ms"), k.get("speedup_row_sparse_captured"),
                           k.get("sparse_kernel_alone_captured_ms"), k.get("speedup_kernel_alone_captured"),
                           k["matches_dense"]] for k in payload["weight_grad_kernel"]]))
    return "\n".join(out)


def chart(rows, path, quick=False):
    """The run as a picture (the path, or None without matplotlib or without sparse/dense
    pairs): a grid run (`--cases map`: every network, activity and theta_grad on 4 or more
    width x batch cells) as one heat map per panel; any other case list as bars, each mode's
    speedup over the captured dense step per case."""
    pairs = [r for r in rows if r["mode"] == "sparse" and "speedup_vs_dense" in r]
    if not pairs:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("spikefuse bench sparse: no chart (matplotlib is not installed: pip install 'spikefuse[plot]')")
        return None
    cells = Counter(_panel(r) for r in pairs)
    return _map_chart(pairs, path, quick) if min(cells.values()) >= 4 else _bar_chart(rows, path, quick)


def _panel(r):
    """A row's heat map: its network, activity and theta_grad."""
    return r["net"], str(r.get("activity", "natural")), r["theta_grad"]


def _bar_chart(rows, path, quick=False):
    """Per case (a row each, top to bottom in run order), each mode's speedup over the
    captured dense step as a horizontal bar; log axis, 1x drawn."""
    from matplotlib.ticker import FuncFormatter
    from ..train.plots import _figure, _save
    modes = [m for m in MODES if m != "dense" and any(r["mode"] == m and "speedup_vs_dense" in r for r in rows)]

    def key(r):
        return r["net"], r["width"], r["B"], r["theta_grad"], str(r.get("activity", "natural"))
    cases = list(dict.fromkeys(key(r) for r in rows if "speedup_vs_dense" in r and r["mode"] != "dense"))
    fig = _figure(figsize=(9.0, 1.2 + 0.16 * len(cases) * max(len(modes), 1)))
    ax = fig.subplots()
    height = 0.8 / max(len(modes), 1)
    for k, mode in enumerate(modes):
        found = {key(r): r["speedup_vs_dense"] for r in rows if r["mode"] == mode and "speedup_vs_dense" in r}
        ys = [i + (k - (len(modes) - 1) / 2) * height for i, case in enumerate(cases) if case in found]
        ax.barh(ys, [found[case] for case in cases if case in found], height, label=mode)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="dense (captured) = 1x")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlabel("speedup over the captured dense step (log scale; right of 1x: faster than dense)")
    labels = [f"{net} x{w:g} B={b} theta_grad={theta:g}" + ("" if activity == "natural" else f" p={activity}")
              for net, w, b, theta, activity in cases]
    ax.set_yticks(range(len(cases)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(modes) + 1, frameon=False)
    fig.suptitle("Sparse against dense training steps, per case"
                 + (" (quick run: not benchmark figures)" if quick else ""), fontsize=10)
    return str(_save(fig, path))


def _map_chart(pairs, path, quick=False):
    """Per network, activity and theta_grad, sparse's speedup over the captured dense step on
    a width x batch grid (green: sparse wins, red: dense wins)."""
    from matplotlib.colors import LogNorm
    from ..train.plots import _figure, _save
    panels = sorted({_panel(r) for r in pairs})
    fig = _figure(figsize=(4.2 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (net, activity, theta) in zip(axes, panels):
        mine = [r for r in pairs if _panel(r) == (net, activity, theta)]
        widths, batches = sorted({r["width"] for r in mine}), sorted({r["B"] for r in mine})
        grid = [[float("nan")] * len(batches) for _ in widths]
        for r in mine:
            grid[widths.index(r["width"])][batches.index(r["B"])] = r["speedup_vs_dense"]
        image = ax.imshow(grid, cmap="RdYlGn", norm=LogNorm(vmin=0.25, vmax=4.0), origin="lower")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v == v:
                    ax.text(j, i, f"{v:.2f}x", ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(batches)), [str(b) for b in batches])
        ax.set_yticks(range(len(widths)), [f"x{w:g}" for w in widths])
        ax.set_xlabel("batch")
        ax.set_ylabel("width")
        kind = activity if activity == "natural" else f"fixed {activity}"
        ax.set_title(f"{net}, {kind} activity, theta_grad {theta:g}", fontsize=9)
    bar = fig.colorbar(image, ax=list(axes), label="speedup: dense step time / sparse step time")
    bar.set_ticks([0.25, 0.5, 1, 2, 4], labels=["0.25x", "0.5x", "1x", "2x", "4x"])
    bar.minorticks_off()
    if quick:
        fig.suptitle("Quick run: not benchmark figures", fontsize=10)
    return str(_save(fig, path))
