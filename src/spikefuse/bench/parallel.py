"""`spikefuse bench parallel`: the multi-GPU benchmarks, each run in processes of its own.

    ddp       data-parallel CIFAR-medium beside SpikingJelly (spikefuse.bench.parallel_ddp):
              1 process, then --gpus processes, then the merge:
              ddp-1gpu.json, ddp-<N>gpu.json, ddp-scaling-<device>.json and .md
    pipeline  the temporal pipeline on --gpus processes beside the planner
              (spikefuse.bench.parallel_pipeline): pipeline-<device>.json and .md

--quick, a smoke test: 2 processes, tiny sizes, few repetitions, results named *-quick*; without
2 CUDA GPUs (and no --device), the pipeline on 2 CPU processes (gloo) and ddp skipped.

Every run is `python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ...`,
what torchrun does, started as a subprocess: fresh processes for each run (a run's CUDA
graphs, NCCL communicators and GPU memory go with it), this environment inherited (NCCL_*
settings reach the workers), and each worker's output printed as it comes.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import torch

from spikefuse.errors import RunError, UsageError

from . import parallel_pipeline
from .options import count, width

PARTS = ("ddp", "pipeline")
NEEDS_TWO = {"ddp": "it compares 1 GPU with N", "pipeline": "one stage on each process"}
MAX_PROCESSES = 1024  # processes of one run on one machine (spikefuse train's --threads bound)
LAUNCHER = (sys.executable, "-m", "torch.distributed.run", "--standalone")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, metavar="N",
                        help="processes of the multi-process runs, one per GPU (default: every visible CUDA GPU)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    pipeline = parser.add_argument_group("passed on to the pipeline")
    pipeline.add_argument("--time-steps", type=int, nargs="+", metavar="T",
                          help=f"sequence lengths (default: {' '.join(map(str, parallel_pipeline.TIME_STEPS))})")
    pipeline.add_argument("--chunks", type=int, nargs="+", metavar="C",
                          help="chunk counts to time besides the planner's choice "
                               f"(default: {' '.join(map(str, parallel_pipeline.CHUNKS))})")
    pipeline.add_argument("--device", choices=["cuda", "cpu"],
                          help="cpu: gloo processes on the CPU, to check the flow (the pipeline part only; "
                               "default cuda, with --quick cpu where there are fewer than 2 CUDA GPUs)")
    pipeline.add_argument("--width", type=float, help="scale deep-lif's 2048 units (default 1; 0.01 on a CPU)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 2 processes, tiny sizes, few repetitions, results named *-quick*; "
                             "without 2 CUDA GPUs the pipeline on 2 CPU processes and ddp skipped")


def run(args) -> int:
    parts = [p for p in args.parts.split(",") if p]
    if args.quick:
        parts = quick_setup(args, parts)
    args.device = args.device or "cuda"
    gpus = check(args, parts)
    failed = []
    if "ddp" in parts:
        failed += run_ddp(gpus, args.out, args.quick)
    if "pipeline" in parts:
        failed += run_pipeline(gpus, args)
    if failed:
        raise RunError(f"{', '.join(failed)} failed; the output above says why")
    return 0


def quick_setup(args, parts: list[str]) -> list[str]:
    """--quick: 2 processes unless --gpus says otherwise; without 2 CUDA GPUs (and no --device)
    on the CPU, where ddp cannot run: it is skipped with a note (or refused by check, if alone)."""
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.device is None and available < 2:
        args.device = "cpu"
    if args.device == "cpu" and "ddp" in parts and len(parts) > 1:
        print("ddp: skipped, it needs 2 or more CUDA GPUs (its steps run in CUDA graphs)", flush=True)
        parts = [p for p in parts if p != "ddp"]
    if args.gpus is None:
        args.gpus = 2
    return parts


def check(args, parts: list[str]) -> int:
    """The number of processes for the multi-process runs; UsageError when they cannot run."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise UsageError(f"--parts {args.parts}: pick from {', '.join(PARTS)}")
    for option, values in (("--time-steps", args.time_steps), ("--chunks", args.chunks)):
        if values and min(values) < 1:
            raise UsageError(f"{option}: expected whole numbers >= 1, got {' '.join(map(str, values))}")
        for value in values or ():  # 2**70 reached the workers' torch.rand
            count(option, value)
    if args.width is not None and not 0 < args.width < float("inf"):
        raise UsageError(f"--width: expected a number > 0, got {args.width}")
    if args.width is not None:  # 1e300 failed in every worker's build_model
        width("--width", args.width, parallel_pipeline.FEATURES)
    if args.gpus is not None and args.gpus > 1:  # fewer: refused below, saying why; 2**70 CPU
        count("--gpus", args.gpus, MAX_PROCESSES)  # processes went to torch's launcher
    if args.device == "cpu" and "ddp" in parts:
        raise UsageError("the ddp part needs CUDA GPUs (its steps run in CUDA graphs); "
                         "on the CPU pass --parts pipeline")
    available = torch.cuda.device_count() if args.device == "cuda" and torch.cuda.is_available() else 0
    gpus = available if args.gpus is None else args.gpus
    if args.device == "cuda" and gpus > available:
        raise UsageError(f"--gpus {gpus}: this machine has {available} CUDA GPU{'' if available == 1 else 's'}")
    if gpus < 2:
        part = "pipeline" if "pipeline" in parts else "ddp"
        why = NEEDS_TWO[part]
        if args.gpus is not None:
            raise UsageError(f"--gpus {gpus}: the {part} part needs 2 or more processes ({why})")
        if args.device == "cuda":
            raise UsageError(f"the {part} part needs 2 or more CUDA GPUs ({why}); this machine has {available}")
        raise UsageError(f"the {part} part needs --gpus 2 or more on the CPU ({why}; "
                         "--gpus defaults to the number of CUDA GPUs)")
    return gpus


def run_ddp(gpus: int, out: str, quick: bool = False) -> list[str]:
    """One process, then `gpus`, then the table of both; what failed."""
    from . import parallel_ddp

    argv = ["--out", out] + (["--quick"] if quick else [])
    for n in (1, gpus):  # the 1-GPU run under the launcher too
        if launch(n, "spikefuse.bench.parallel_ddp", argv) != 0:
            return [f"ddp on {n} GPU{'' if n == 1 else 's'}"]
    return [] if parallel_ddp.main(["--merge", *argv]) == 0 else ["the ddp merge"]


def run_pipeline(gpus: int, args) -> list[str]:
    argv = ["--out", args.out, "--device", args.device]
    if args.time_steps:
        argv += ["--time-steps", *map(str, args.time_steps)]
    if args.chunks:
        argv += ["--chunks", *map(str, args.chunks)]
    if args.width is not None:
        argv += ["--width", str(args.width)]
    if args.quick:
        argv.append("--quick")
    return [] if launch(gpus, "spikefuse.bench.parallel_pipeline", argv) == 0 else ["the pipeline"]


def launch(nproc: int, module: str, argv: list[str]) -> int:
    """`python -m module *argv` on `nproc` processes of this machine through torch's elastic
    launcher; their exit code. (spikefuse.parallel.ddp.launch runs `python -m spikefuse` only,
    inside this process: these runs are other modules, each wanting processes of its own.)"""
    command = [*LAUNCHER, f"--nproc-per-node={nproc}", "-m", module, *argv]
    print("$", shlex.join(["torchrun", *command[3:]]), flush=True)  # what is run, for the log
    # torchrun's own default, set here so that it does not print a banner saying it set it
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env).returncode
