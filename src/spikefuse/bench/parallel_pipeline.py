"""The temporal pipeline on 2 GPUs against one GPU, beside the planner's prediction.

    torchrun --nproc-per-node 2 -m spikefuse.bench.parallel_pipeline --out benchmarks/results
    spikefuse bench parallel --parts pipeline --gpus 2    # the same, through torch's launcher

deep-lif (8 x Linear(2048)+LIF, mean readout), B=16, for each T: the single-GPU step
(forward+backward, on rank 0), then the 2-stage pipeline (spikefuse.parallel.pipeline) at a few
chunk counts and at the planner's choice; speedup, the planner's predicted speedup at the same
chunk count, and peak memory per GPU (torch.cuda.max_memory_allocated, everything the process
holds on its GPU). Both the single-GPU step and the pipeline's run captured in CUDA graphs
(CapturedStep, PipelineTrainer.captured: the hand-offs are NCCL point-to-point ops inside the
graph); --eager also times the pipeline issued from Python at the planner's chunk count.
Times: medians after warm-up, each step bracketed by a host barrier (gloo) and
torch.cuda.synchronize on both ranks, the slower rank's time. While rank 0 plans and times one
GPU, rank 1 waits on the host (gloo), not in an NCCL kernel that would share GPU 1.
At the smallest T it checks the pipeline's loss and gradients (strict fp32) against one GPU
running the same chunks (chunked_step: the same sums) and against the unchunked step (whose
GEMMs sum in another order: a spike that flips there changes the gradients more).
Matmuls and convolutions run on TF32 (fp32, as `spikefuse train` does) unless --no-tf32 (fp32-strict).
Writes pipeline-<device>.json and .md into --out (device, torch/triton versions, date).
--device cpu (gloo, with --width 0.01) runs the same flow on a CPU, to check the script.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from spikefuse import precision as precisions
from spikefuse.bench.report import environment, table, write_results
from spikefuse.models import build_model
from spikefuse.parallel.pipeline import PipelineTrainer, chunked_step
from spikefuse.parallel.planner import format_plan, plan
from spikefuse.capture import CapturedStep

MODEL, FEATURES, CLASSES = "deep-lif", 2048, 10
TIME_STEPS, CHUNKS = [256, 1024, 4096, 16384], [8, 16, 32, 64]  # defaults of --time-steps, --chunks
REPS = {256: 20, 1024: 10, 4096: 5, 16384: 3}  # timed steps per T: the whole run stays under ~6 minutes
# --quick, a smoke test (3 timed steps): per device, the defaults of --time-steps, --chunks, --width
QUICK = {"cuda": ([64], [2, 4], 1 / 16), "cpu": ([4], [2], 0.005)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for pipeline-<device>.json and .md")
    p.add_argument("--time-steps", type=int, nargs="+", metavar="T",
                   help=f"sequence lengths (default {' '.join(map(str, TIME_STEPS))})")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--chunks", type=int, nargs="+", metavar="C",
                   help="chunk counts to time (those <= T), besides the planner's choice "
                        f"(default {' '.join(map(str, CHUNKS))})")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--width", type=float, help="scale deep-lif's 2048 units (default 1; CPU checks)")
    p.add_argument("--no-tf32", action="store_true", help="fp32-strict: IEEE float32 matmuls and convolutions")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--eager", action="store_true", help="also time the eager pipeline at the planner's chunks")
    p.add_argument("--quick", action="store_true", help="a smoke test: tiny T and width, written as pipeline-quick-*")
    args = p.parse_args(argv)
    time_steps, chunks, width = QUICK[args.device] if args.quick else (TIME_STEPS, CHUNKS, 1.0)
    args.time_steps = args.time_steps or time_steps
    args.chunks = args.chunks or chunks
    args.width = width if args.width is None else args.width
    return args


def rate_cross_entropy(out, y):
    return nn.functional.cross_entropy(out.mean(0), y)


def fresh_layers(args):
    torch.manual_seed(0)
    return build_model(MODEL, (FEATURES,), CLASSES, None, width=args.width).layers


def batch(T, args):
    g = torch.Generator().manual_seed(T)
    return (torch.rand(T, args.batch, FEATURES, generator=g) < 0.2).float(), \
        torch.randint(0, CLASSES, (args.batch,), generator=g)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


HOST = None  # a gloo group: barriers and object exchanges that leave the GPUs alone


def timed(step, reps, warmup, device, together):
    """Median seconds of step(); with `together`, every rank times each step between a
    barrier and a synchronize, and the slowest rank's time counts."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        sync(device)
        if together:
            dist.barrier(group=HOST)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    if together:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=HOST)
        times = t.tolist()
    return statistics.median(times)


def single_gpu(T, args, device, reps):
    """Rank 0 alone: the ordinary step; (seconds, peak bytes)."""
    layers = fresh_layers(args).to(device)
    x, y = (t.to(device) for t in batch(T, args))
    free(device)

    def run(x, y):
        layers.zero_grad(set_to_none=True)
        rate_cross_entropy(layers(x), y).backward()
    captured = CapturedStep(run, enabled=device.type == "cuda", name="one-GPU step")
    seconds = timed(lambda: captured(x, y), reps, args.warmup + captured.warmup + 1, device, together=False)
    result = seconds, peak(device)
    del layers, x, y, captured
    free(device)
    return result


def pipelined(T, chunks, cut, args, device, rank, world, reps, eager=False):
    """Both ranks: the pipeline's step (captured unless `eager`), stages as `cut`;
    (seconds, peak bytes of each rank, whether it was captured)."""
    trainer = PipelineTrainer(fresh_layers(args), rate_cross_entropy, chunks, cut=cut, device=device)
    x, y = batch(T, args)
    x = x.to(device) if rank == 0 else T
    y = y.to(device) if trainer.is_last else None
    free(device)
    if eager:
        def step(x, y):
            for p in trainer.parameters():
                p.grad = None
            trainer.step(x if rank == 0 else None, y)
        warmup = args.warmup
    else:
        step = trainer.captured()
        warmup = args.warmup + step.graphs.warmup + 1
    seconds = timed(lambda: step(x, y), reps, warmup, device, together=True)
    captured = bool(getattr(step, "graphs", None) and step.graphs.captured)
    peaks = [None] * world
    dist.all_gather_object(peaks, peak(device), group=HOST)
    del trainer, x, y, step
    free(device)
    return seconds, peaks, captured


@precisions.applied("fp32-strict")
def check_exactness(T, args, device, rank, world, chunks=4):
    """Strict fp32: the pipeline's loss and this rank's gradients against one device running
    the same chunks (chunked_step) and the whole sequence at once (each rank runs them on its
    own GPU). Largest |difference| / largest |gradient| over all parameters."""
    try:
        x, y = (t.to(device) for t in batch(T, args))
        references = {}
        for name, run in (("unchunked", lambda layers: rate_cross_entropy(layers(x), y)),
                          ("chunked", lambda layers: chunked_step(list(layers), x, y, rate_cross_entropy, chunks))):
            layers = fresh_layers(args).to(device)
            loss = run(layers)
            if name == "unchunked":
                loss.backward()
            references[name] = loss.item(), {n: p.grad for n, p in layers.named_parameters()}
        trainer = PipelineTrainer(fresh_layers(args), rate_cross_entropy, chunks, device=device)
        loss = trainer.step(x if rank == 0 else None, y)
        result = {"T": T, "chunks": chunks, "loss_pipeline": loss.item()}
        for name, (loss_ref, grads) in references.items():
            error = max(((p.grad - grads[n]).abs().max() / grads[n].abs().max().clamp_min(1e-30)).item()
                        for n, p in trainer.named_parameters())
            worst = torch.tensor(error, dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=HOST)
            result[f"loss_{name}"], result[f"max_relative_grad_error_vs_{name}"] = loss_ref, worst.item()
        return result
    finally:
        free(device)


def run_one_T(T, args, device, rank, world):
    reps = REPS.get(T, 3)
    planned = [None]
    if rank == 0:
        planned = [plan(MODEL, T, args.batch, gpus=world, device=device, input_shape=(FEATURES,),
                        num_classes=CLASSES, width=args.width)]
        free(device)
    dist.broadcast_object_list(planned, src=0, group=HOST)
    the_plan = planned[0]
    single = single_gpu(T, args, device, reps) if rank == 0 else (None, None)
    dist.barrier(group=HOST)
    counts = sorted({c for c in args.chunks if c <= T} | {the_plan.chosen.chunks})
    runs = []
    for chunks in counts:
        seconds, peaks, captured = pipelined(T, chunks, the_plan.chosen.cut, args, device, rank, world, reps)
        runs.append({"chunks": chunks, "seconds": seconds, "peak_bytes": peaks, "captured": captured,
                     "predicted_speedup": the_plan.at(world, chunks).predicted_speedup,
                     "planner_choice": chunks == the_plan.chosen.chunks})
    if args.eager:
        chunks = the_plan.chosen.chunks
        seconds, peaks, _ = pipelined(T, chunks, the_plan.chosen.cut, args, device, rank, world, reps, eager=True)
        runs.append({"chunks": chunks, "seconds": seconds, "peak_bytes": peaks, "captured": False, "eager": True,
                     "predicted_speedup": the_plan.at(world, chunks).predicted_speedup, "planner_choice": False})
    return the_plan, single, runs


def report(args, results, exactness, world, elapsed):
    env = environment()
    if args.device == "cpu":  # gloo processes on the CPU: not the machine's GPU, whatever it has
        env["device"] = "cpu"
    payload = {"environment": env, "benchmark": "temporal pipeline", "model": MODEL, "quick": args.quick,
               "batch": args.batch, "gpus": world, "tf32": not args.no_tf32, "width": args.width,
               "elapsed_s": elapsed, "exactness": exactness, "results": []}
    rows, plans = [], []
    for T, (the_plan, (single_s, single_peak), runs) in results.items():
        entry = {"T": T, "single_seconds": single_s, "single_peak_bytes": single_peak,
                 "planner": {"chunks": the_plan.chosen.chunks,
                             "predicted_speedup": the_plan.chosen.predicted_speedup,
                             "cut": [[r.start, r.stop] for r in the_plan.chosen.cut],
                             "memory_bytes": the_plan.chosen.memory_bytes,
                             "single_memory_bytes": the_plan.single_memory_bytes,
                             "ts_s": the_plan.ts_s, "chunked_s": the_plan.chunked_s,
                             "link": [the_plan.link_latency_s, the_plan.link_bandwidth, the_plan.link_source]},
                 "pipeline": []}
        for run in runs:
            speedup = single_s / run["seconds"]
            worst_peak = max(p for p in run["peak_bytes"] if p is not None) if single_peak else None
            entry["pipeline"].append({**run, "speedup": speedup,
                                      "measured_over_predicted": speedup / run["predicted_speedup"],
                                      "peak_ratio_to_single": worst_peak / single_peak if worst_peak else None})
            label = f"{run['chunks']} (planner)" if run["planner_choice"] else \
                f"{run['chunks']} (eager)" if run.get("eager") else run["chunks"]
            rows.append([T, label,
                         single_s * 1e3, run["seconds"] * 1e3, speedup, run["predicted_speedup"],
                         speedup / run["predicted_speedup"],
                         single_peak / 2**30 if single_peak else None,
                         " / ".join(f"{p / 2**30:.2f}" for p in run["peak_bytes"]) if single_peak else None,
                         entry["pipeline"][-1]["peak_ratio_to_single"]])
        payload["results"].append(entry)
        plans.append(f"### T = {T}\n\n```\n{format_plan(the_plan)}```\n")
    env = payload["environment"]
    markdown = (f"# Temporal pipeline: {MODEL}, B={args.batch}, {world} GPUs vs one\n\n"
                f"{env['device']}, torch {env['versions']['torch']}, triton {env['versions']['triton']}, "
                f"{env['date']}; TF32 {'on' if payload['tf32'] else 'off'}; run took {elapsed:.0f} s.\n\n"
                + table(["T", "chunks", "1 GPU ms", "pipeline ms", "speedup", "predicted", "measured/predicted",
                         "1 GPU peak GiB", "peak GiB per GPU", "peak ratio"], rows)
                + (f"\nExactness (strict fp32, T={exactness['T']}, {exactness['chunks']} chunks): pipeline loss "
                   f"{exactness['loss_pipeline']:.9g}; one GPU, same chunks {exactness['loss_chunked']:.9g} "
                   f"(largest gradient difference {exactness['max_relative_grad_error_vs_chunked']:.3g} of the "
                   f"largest gradient); one GPU, unchunked {exactness['loss_unchunked']:.9g} "
                   f"({exactness['max_relative_grad_error_vs_unchunked']:.3g}).\n" if exactness else "")
                + "\n## The planner's output\n\n" + "\n".join(plans))
    return write_results("pipeline", payload, markdown, args.out)


def main(argv=None):
    args = parse_args(argv)
    with precisions.applied("fp32-strict" if args.no_tf32 else "fp32"):  # the caller's flags after
        return _main(args)


def _main(args):
    if "RANK" not in os.environ:
        raise SystemExit("run me under torchrun: torchrun --nproc-per-node 2 -m spikefuse.bench.parallel_pipeline "
                         "--out DIR (or: spikefuse bench parallel --parts pipeline)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        if torch.cuda.device_count() < world:
            raise SystemExit(f"{world} processes need {world} GPUs; this machine has {torch.cuda.device_count()}")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # device_id starts NCCL at once (eager): the pipeline's send/recv then use the group's own
    # communicator instead of NCCL creating (and announcing on stderr) one per neighbour pair.
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    global HOST
    HOST = dist.new_group(backend="gloo")
    start = time.perf_counter()
    exactness = check_exactness(min(args.time_steps), args, device, rank, world)
    results = {}
    for T in args.time_steps:
        results[T] = run_one_T(T, args, device, rank, world)
        if rank == 0:
            the_plan, (single_s, _), runs = results[T]
            best = max(runs, key=lambda r: single_s / r["seconds"])
            print(f"T={T}: one GPU {single_s * 1e3:.1f} ms; pipeline best {best['seconds'] * 1e3:.1f} ms at "
                  f"{best['chunks']} chunks ({single_s / best['seconds']:.2f}x, predicted "
                  f"{best['predicted_speedup']:.2f}x, captured {best['captured']})", flush=True)
    if rank == 0:
        for path in report(args, results, exactness, world, time.perf_counter() - start):
            print("wrote", path)
    dist.barrier(group=HOST)
    gc.collect()  # CUDA graphs holding NCCL work first, or destroying the group hangs (pytorch#115388)
    sync(device)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
