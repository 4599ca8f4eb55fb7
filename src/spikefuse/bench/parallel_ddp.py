"""Data-parallel scaling of CIFAR-medium (Liang et al., T=10, per-GPU batch 64, SGD): samples/s
on one GPU and on N GPUs under torchrun, spikefuse beside SpikingJelly 2.0's same network.

Modes (fp32 and bf16):
    captured            spikefuse's step in one CUDA graph, temporal SyncBN, the gradients averaged
                        by spikefuse.parallel.GradientReducer, which steps SGD bucket by bucket
                        (what the Trainer does)
    captured-local-bn   the same with each rank's own BN statistics (as SpikingJelly's DDP runs)
    captured-ddp        the captured SyncBN step with torch's DistributedDataParallel instead
    eager               spikefuse's step issued from Python, SyncBN, GradientReducer
    eager-local-bn      the same, local BN
    eager-ddp           the eager SyncBN step under torch's DDP: what a user wrapping the model by hand gets
    spikingjelly        SpikingJelly's network (bench.spikingjelly.cifar) in plain DDP
On one GPU there is no reducer, DDP or SyncBN: the -local-bn and -ddp modes are their base mode there.
Times: CUDA events, the median of 10 x 10 steps queued back to back after warm-up, the
slowest rank's; samples/s = world size x 64 / step time. A check trains 15 steps captured and
15 eager from the same weights and inputs under SyncBN, both averaging their gradients through
the transport a captured step takes, and reports the parameters' largest relative difference
(the captured all-reduces computed what the eager ones do).

    torchrun --standalone --nproc-per-node N -m spikefuse.bench.parallel_ddp --out DIR   # DIR/ddp-<N>gpu.json
    python -m spikefuse.bench.parallel_ddp --merge --out DIR    # DIR/ddp-scaling-<device>.json and .md
(`spikefuse bench parallel --parts ddp --gpus N` runs all three.)
--quick, a smoke test: QUICK's sizes, fp32, captured and eager (and SpikingJelly where installed)
unless --modes/--precisions say otherwise; ddp-<N>gpu-quick.json, merged into ddp-scaling-quick-*.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import gc
import json
import os
import traceback
import warnings

import torch
from torch import nn

from spikefuse import precision as precisions
from spikefuse.bench.report import atomic_write, environment, table, write_results
from spikefuse.bench.timing import median_ms
from spikefuse.models import build_model
from spikefuse.parallel import GradientReducer, convert_sync_batchnorm, init_data_parallel, launched
from spikefuse.parallel.sync_bn import RankSync
from spikefuse.capture import CaptureFallback, CapturedStep, prepare_optimizer

BATCH, TIME_STEPS = 64, 10
MODES = ("captured", "captured-local-bn", "captured-ddp", "eager", "eager-local-bn", "eager-ddp", "spikingjelly")
ONE_GPU_ALIAS = {"captured-local-bn": "captured", "eager-local-bn": "eager", "captured-ddp": "captured",
                 "eager-ddp": "eager"}
PRECISIONS = ("fp32", "bf16")
REPS, BACK_TO_BACK = 10, 10
WIDTH, CHECK_STEPS = 1.0, 15  # the network's width; steps of the captured-vs-eager check
QUICK = {"BATCH": 8, "TIME_STEPS": 4, "WIDTH": 0.25, "REPS": 3, "BACK_TO_BACK": 2, "CHECK_STEPS": 3}


def build(mode: str, device, dp):
    torch.manual_seed(0)  # the same weights on every rank (DDP broadcasts rank 0's anyway)
    if mode == "spikingjelly":
        from spikefuse.bench.spikingjelly import cifar
        return cifar("medium", WIDTH, time_steps=TIME_STEPS).to(device)
    model = build_model("cifar-medium", (3, 32, 32), 10, TIME_STEPS, width=WIDTH).to(device)
    if dp is None or "local-bn" in mode:
        return model
    return convert_sync_batchnorm(model, dp.sync_bn_group, transport=TRANSPORT)


BUCKET_MB = None  # --bucket-mb: the bucket size of spikefuse's modes (None: the reducer's or DDP's default)
TRANSPORT = "auto"  # --transport: how SyncBN's statistics travel (spikefuse.parallel.sync_bn.RankSync)
GRAD_TRANSPORT = "auto"  # --grad-transport: how the reducer's gradient buckets travel (GradientReducer)
STEP_IN_BUCKETS = True  # the reducer steps SGD bucket by bucket in captured steps (--step-after-buckets: off)


def make_step(mode: str, precision: str, device, dp):
    """(step(x, y) -> loss, the model, its GradientReducer or None): forward, loss, backward,
    SGD step; captured modes return a CapturedStep."""
    model = build(mode, device, dp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    captured, ours = mode.startswith("captured"), mode != "spikingjelly"
    # ours eager too: the same (fused) SGD update as the captured step
    if ours and prepare_optimizer(optimizer) is not None:
        raise RuntimeError("SGD is not capturable here")
    forward, reducer = model, None
    stream = torch.cuda.Stream(device) if captured else None  # DDP's hooks run where the step does
    ddp = dp is not None and (mode.endswith("-ddp") or not ours)
    if dp is not None:
        if not ours:  # as a SpikingJelly user would
            forward = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
        elif ddp:
            forward = dp.wrap(model, stream=stream, bucket_cap_mb=BUCKET_MB)
        else:
            reducer = dp.reducer(model, bucket_mb=BUCKET_MB, transport=GRAD_TRANSPORT,
                                 optimizer=optimizer if STEP_IN_BUCKETS else None)

    def step(x, y):
        if reducer is not None:
            reducer.sync_buffers()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=False):
            loss = nn.functional.cross_entropy(forward(x).float(), y)
        optimizer.zero_grad(set_to_none=not ddp)  # DDP's gradients live in its buckets
        loss.backward()
        if reducer is not None:
            reducer.finish()  # (stepping the optimizer where it holds it)
        if reducer is None or reducer.optimizer is None:
            optimizer.step()
        return loss
    if captured:
        warmup = {} if dp is None else {"warmup": dp.capture_warmup if ddp else dp.reducer_warmup,
                                        "agree_across": dp.group or torch.distributed.group.WORLD}
        step = CapturedStep(step, stream=stream, **warmup)
    return step, model, reducer


def inputs(device, rank: int, count: int = 2):
    g = torch.Generator(device=device).manual_seed(100 + rank)  # each rank its own slice of data
    return [(torch.randn(BATCH, 3, 32, 32, device=device, generator=g),
             torch.randint(0, 10, (BATCH,), device=device, generator=g)) for _ in range(count)]


def slowest(value: float, dp) -> float:
    if dp is None:
        return value
    t = torch.tensor([value], device=dp.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


def measure(mode, precision, device, dp) -> dict:
    world = dp.world_size if dp is not None else 1
    case = {"mode": mode, "precision": precision, "gpus": world, "batch_per_gpu": BATCH}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CaptureFallback)
            step, model, reducer = make_step(mode, precision, device, dp)
            batches = inputs(device, dp.rank if dp is not None else 0)
            turn = [0]

            def call():
                turn[0] += 1
                return step(*batches[turn[0] % len(batches)])
            warm = (step.warmup + 2) if isinstance(step, CapturedStep) else 5
            for _ in range(warm):
                call()
            ms, _ = median_ms(call, warmup=2, min_reps=REPS, max_reps=REPS, back_to_back=BACK_TO_BACK)
        case["step_ms"] = slowest(ms, dp)
        case["samples_per_s"] = world * BATCH / case["step_ms"] * 1e3
        if isinstance(step, CapturedStep):
            case["captured"] = step.captured > 0
            case["fallback"] = step.fallback_reason
        syncs = {m.sync.transport_in_use for m in model.modules() if getattr(m, "sync", None) is not None}
        case["sync_bn_transport"] = syncs.pop() if syncs else None
        case["grad_transport"] = reducer.transport_in_use if reducer is not None else None
        case["stepped_in_buckets"] = reducer.stepped_in_buckets if reducer is not None else None
        case["warnings"] = sorted({str(w.message)[:200] for w in caught})
        case["loss"] = float(call().detach())
    except Exception as e:  # noqa: BLE001  (recorded; the other modes still run)
        traceback.print_exc()
        case["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if dp is None or dp.is_main:
        shown = (f"{case['step_ms']:.2f} ms/step, {case['samples_per_s']:.0f} samples/s"
                 if "step_ms" in case else case["error"])
        print(f"{world} GPU {precision} {mode}: {shown}", flush=True)
    return case


def check_capture(device, dp, steps: int = 15) -> dict:
    """Captured vs eager SyncBN steps (GradientReducer) from the same start: the parameters' largest
    relative difference after `steps` steps (fp32). Both must average their gradients through
    one transport (as "auto" now does, captured or eager): beyond two ranks NCCL and peer
    memory sum in different orders, whose last-bit differences training grows (0.87-1.03 after
    15 steps on 4 H100s, when "auto" gave eager steps NCCL and captured ones peer memory)."""
    params, transports = [], set()
    for mode in ("captured", "eager"):
        step, model, reducer = make_step(mode, "fp32", device, dp)
        batches = inputs(device, dp.rank)
        for i in range(steps):
            step(*batches[i % 2])
        params.append([p.detach().clone() for p in model.parameters()])
        transports.add(reducer.transport_in_use)
    diff = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(*params))
    return {"steps": steps, "grad_transport": ",".join(sorted(transports)),
            "max_relative_difference": slowest(diff, dp)}


@precisions.applied("fp32")  # as spikefuse train and bench steps, for every library; the caller's flags after
def run(args) -> int:
    dp = init_data_parallel("cuda", timeout=datetime.timedelta(seconds=120)) if launched() else None
    device = dp.device if dp is not None else torch.device("cuda", 0)
    torch.cuda.set_device(device)
    world = dp.world_size if dp is not None else 1
    modes = [m for m in args.modes.split(",") if m and (world > 1 or m not in ONE_GPU_ALIAS)]
    payload = {"gpus": world, "environment": environment(), "cases": [], "capture_check": None,
               "bucket_cap_mb": BUCKET_MB, "sync_bn_transport": TRANSPORT,
               "grad_transport": GRAD_TRANSPORT, "step_in_buckets": STEP_IN_BUCKETS, "quick": args.quick,
               "batch_per_gpu": BATCH, "time_steps": TIME_STEPS,
               "width": WIDTH, "timing": f"{REPS} x {BACK_TO_BACK}"}
    name = f"ddp-{world}gpu{args.tag}" + ("-quick" if args.quick else "")

    def save():  # after every case: a run cut short keeps what it measured
        if dp is None or dp.is_main:
            atomic_write(os.path.join(args.out, name + ".json"), json.dumps(payload, indent=2) + "\n")
    for precision in args.precisions.split(","):
        for mode in modes:
            payload["cases"].append(measure(mode, precision, device, dp))
            save()
    if dp is not None and not args.no_check:
        try:
            payload["capture_check"] = check_capture(device, dp, CHECK_STEPS)
        except Exception as e:  # noqa: BLE001
            payload["capture_check"] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
        save()
        if dp.is_main:
            print("captured vs eager (SyncBN, GradientReducer):", payload["capture_check"], flush=True)
    if dp is not None:
        gc.collect()  # CUDA graphs holding NCCL work first, or destroying the group hangs (pytorch#115388)
        torch.cuda.synchronize()
        torch.distributed.destroy_process_group()
    return 0


def merge(args) -> int:
    """One table: samples/s on 1 and N GPUs per mode and precision, the scaling, and each
    mode's throughput next to SpikingJelly's on the same GPUs."""
    runs = {}
    ending = "gpu-quick.json" if args.quick else "gpu.json"  # a quick run merges only quick runs
    for name in sorted(os.listdir(args.out)):
        if name.startswith("ddp-") and name.endswith(ending):
            payload = json.load(open(os.path.join(args.out, name)))
            runs[payload["gpus"]] = payload
    if 1 not in runs or len(runs) < 2:
        print(f"--merge: need ddp-1{ending} and an N-GPU run in {args.out}, found {sorted(runs)}")
        return 1
    n = max(runs)
    one = {(c["mode"], c["precision"]): c for c in runs[1]["cases"]}
    many = {(c["mode"], c["precision"]): c for c in runs[n]["cases"]}
    rows, results = [], []
    for (mode, precision), case in many.items():
        base = one.get((ONE_GPU_ALIAS.get(mode, mode), precision), {})
        peer = many.get(("spikingjelly", precision), {})
        entry = {"mode": mode, "precision": precision, "gpus": n,
                 "samples_per_s_1gpu": base.get("samples_per_s"), "samples_per_s": case.get("samples_per_s"),
                 "step_ms_1gpu": base.get("step_ms"), "step_ms": case.get("step_ms"),
                 "captured": case.get("captured"), "fallback": case.get("fallback"), "error": case.get("error")}
        if entry["samples_per_s"] and entry["samples_per_s_1gpu"]:
            entry["scaling"] = entry["samples_per_s"] / entry["samples_per_s_1gpu"]
        if entry["samples_per_s"] and peer.get("samples_per_s"):
            entry["x_spikingjelly"] = entry["samples_per_s"] / peer["samples_per_s"]
        results.append(entry)
        rows.append([mode, precision, entry["step_ms_1gpu"], entry["step_ms"], entry["samples_per_s_1gpu"],
                     entry["samples_per_s"], entry.get("scaling"), entry.get("x_spikingjelly"),
                     {True: "yes", False: "no"}.get(entry["captured"], "-"),
                     entry["error"] or entry["fallback"] or ""])
    env = runs[n]["environment"]
    # the runs' own settings (--quick changes them; runs from before they were recorded: the defaults)
    T, batch = runs[n].get("time_steps", TIME_STEPS), runs[n].get("batch_per_gpu", BATCH)
    payload = {"benchmark": "ddp-scaling", "environment": env, "network": "cifar-medium",
               "time_steps": T, "batch_per_gpu": batch, "width": runs[n].get("width", WIDTH), "results": results,
               "capture_check": runs[n].get("capture_check"), "runs": runs, "quick": args.quick}
    header = ["mode", "precision", "1 GPU ms", f"{n} GPU ms", "1 GPU samples/s", f"{n} GPU samples/s",
              "scaling", "x SpikingJelly", "captured", "note"]
    text = (f"# Data-parallel scaling: CIFAR-medium, T={T}, batch {batch} per GPU\n\n"
            f"{env['device']} x {n}, {env['date']}, versions {env['versions']}\n\n"
            f"CUDA events, medians of {runs[n].get('timing', '10 x 10')} back-to-back steps after warm-up (slowest rank); "
            "SpikingJelly runs local BN (its SyncBN fails in multi-step mode).\n\n"
            + table(header, rows) + f"\ncaptured vs eager SyncBN check: {runs[n].get('capture_check')}\n")
    paths = write_results("ddp-scaling", payload, text, args.out)
    print(text)
    print("wrote", *paths)
    return 0


def quick_settings(args, parser) -> None:
    """--quick: QUICK's sizes; unless given, fp32 and the captured and eager modes (SpikingJelly too
    where it is installed, else a note)."""
    globals().update(QUICK)
    if args.precisions == parser.get_default("precisions"):
        args.precisions = "fp32"
    if args.modes == parser.get_default("modes"):
        args.modes = "captured,eager"
        if importlib.util.find_spec("spikingjelly") is None:
            print("spikingjelly: skipped, not installed", flush=True)
        else:
            args.modes += ",spikingjelly"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, of fp32, bf16")
    parser.add_argument("--bucket-mb", type=float, help="bucket size in MB for spikefuse's modes (reducer or DDP)")
    parser.add_argument("--transport", default="auto", choices=RankSync.TRANSPORTS,
                        help="how SyncBN's statistics travel (default auto: GPU peer memory where it works)")
    parser.add_argument("--grad-transport", default="auto", choices=GradientReducer.TRANSPORTS,
                        help="how the gradient buckets travel (default auto: GPU peer memory where it works)")
    parser.add_argument("--step-after-buckets", action="store_true",
                        help="SGD steps after the last bucket (default: the reducer steps each bucket's parameters "
                             "as its mean is ready, in captured steps)")
    parser.add_argument("--tag", default="", help="suffix of the output file (runs --merge leaves alone)")
    parser.add_argument("--no-check", action="store_true", help="skip the captured-vs-eager check")
    parser.add_argument("--merge", action="store_true", help="merge ddp-*gpu.json in --out into one table")
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny network, few steps (*-quick files)")
    args = parser.parse_args(argv)
    global BUCKET_MB, TRANSPORT, GRAD_TRANSPORT, STEP_IN_BUCKETS
    BUCKET_MB, TRANSPORT, GRAD_TRANSPORT = args.bucket_mb, args.transport, args.grad_transport
    STEP_IN_BUCKETS = not args.step_after_buckets
    if args.quick and not args.merge:  # a worker process of its own (torchrun): its constants, this run's
        quick_settings(args, parser)
    os.makedirs(args.out, exist_ok=True)
    return merge(args) if args.merge else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
