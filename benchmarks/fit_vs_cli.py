"""Produces benchmarks/results/fit-vs-cli-<gpu>.json and .md: the step time a user gets from
`spikefuse train` and from `spikefuse.train.fit` for the same model, data, batch and
precision, on CUDA (the GPU-path issue's "one meaning of fp32").

Each path runs as a user would run it, in a fresh process: the command line, and a short
Python program calling `fit` with the defaults a user would pass (fp32, captured step).
`fit(..., precision="fp32-strict")` runs beside them as the control (IEEE float32 matmuls:
what `fit` ran before fp32 meant TF32 everywhere). The paths alternate over --rounds; a
step's time is batch / samples-per-second of the epochs after the first, medians over them.

    python benchmarks/fit_vs_cli.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FIT_PROGRAM = """
import sys, torch
from spikefuse.data import load
from spikefuse.models import build_model
from spikefuse.train import fit
model_name, dataset, batch, epochs, precision, run_dir = sys.argv[1:]
torch.manual_seed(0)
splits = load(dataset, device="cuda")
model = build_model(model_name, splits.input_shape, splits.num_classes, splits.time_steps)
fit(model, splits, torch.optim.Adam(model.parameters(), lr=2e-3), epochs=int(epochs), batch_size=int(batch),
    device="cuda", precision=precision, run_dir=run_dir, progress=False)
"""


def step_ms(run_dir: Path, batch: int) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [1e3 * batch / r["samples_per_s"] for r in records[1:]]  # epochs after the first


def run_path(path: str, args, run_dir: Path) -> list[float]:
    if path == "cli":
        argv = [sys.executable, "-m", "spikefuse.cli", "train", "--model", args.model, "--dataset", args.dataset,
                "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--quiet", "--out", str(run_dir)]
    else:
        precision = "fp32-strict" if path == "fit-strict" else "fp32"
        argv = [sys.executable, "-c", FIT_PROGRAM, args.model, args.dataset, str(args.batch_size),
                str(args.epochs), precision, str(run_dir)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return step_ms(run_dir, args.batch_size)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ipu-shd")
    p.add_argument("--dataset", default="shd-synthetic")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()

    from spikefuse.bench.report import atomic_write, environment

    paths = ("cli", "fit", "fit-strict")
    steps = {path: [] for path in paths}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for path in paths[r % len(paths):] + paths[:r % len(paths)]:  # each round starts further along
                steps[path] += run_path(path, args, Path(tmp) / f"{path}-{r}")
                print(f"round {r + 1}: {path} {steps[path][-1]:.3f} ms/step", flush=True)
    median = {path: statistics.median(v) for path, v in steps.items()}
    env = environment()
    payload = {"benchmark": "fit-vs-cli", "environment": env, "model": args.model, "dataset": args.dataset,
               "batch_size": args.batch_size, "epochs": args.epochs, "rounds": args.rounds,
               "step_ms": steps, "median_step_ms": median, "fit_over_cli": median["fit"] / median["cli"]}
    table = "\n".join(f"| {path} | {median[path]:.3f} ms | {min(steps[path]):.3f}-{max(steps[path]):.3f} | "
                      f"{median[path] / median['cli']:.3f} |" for path in paths)
    markdown = (f"# `spikefuse train` against `fit`: step time on {env['device']}\n\n"
                f"{args.model} on {args.dataset}, batch {args.batch_size}, fp32 (TF32 matmuls), captured steps; "
                f"epochs 2-{args.epochs} of {args.rounds} alternating rounds, each run a fresh process; "
                f"{env['date']}, torch {env['versions']['torch']}, triton {env['versions']['triton']}.\n\n"
                "| path | median step | range | x CLI |\n|---|---|---|---|\n" + table + "\n\n"
                "fit-strict: `fit(..., precision=\"fp32-strict\")`, IEEE float32 matmuls (the control).\n")
    tag = "".join(c if c.isalnum() else "-" for c in env["device"]).strip("-").lower()
    base = os.path.join(args.out, f"fit-vs-cli-{tag}")
    atomic_write(base + ".json", json.dumps(payload, indent=2) + "\n")
    atomic_write(base + ".md", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
