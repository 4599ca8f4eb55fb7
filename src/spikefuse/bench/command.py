"""`spikefuse bench lif | train | steps | sparse | data | neurons | parallel | on | runs | all`: each benchmark
writes JSON + markdown results; `all` runs every other one."""
from __future__ import annotations

import importlib

BENCHMARKS = {
    "lif": ("spikefuse.bench.lif", "LIF forward+backward vs the bandwidth floor and peer libraries"),
    "train": ("spikefuse.bench.train", "one training step of the CIFAR-10 networks vs vanilla and SpikingJelly"),
    "steps": ("spikefuse.bench.steps", "one training step eager, captured (CUDA graph) and compiled, vs its GPU kernel time"),
    "sparse": ("spikefuse.bench.sparse", "sparse against dense training steps of the IPU-study networks: where each wins"),
    "data": ("spikefuse.bench.data", "one epoch of SHD-shaped data through four loading pipelines"),
    "neurons": ("spikefuse.bench.neurons", "ALIF, CUBA, recurrent LIF/ALIF and learnable LIF forward+backward vs the PyTorch loop and peers"),
    "chart": ("spikefuse.bench.chart", "draw the PNG chart of results files already written (no GPU needed)"),
    "parallel": ("spikefuse.bench.parallel",
                 "multi-GPU: data-parallel scaling beside SpikingJelly, and the temporal pipeline beside the planner"),
    "on": ("spikefuse.bench.on", "the Open Neuromorphic benchmark, corrected: Linear(N, N) + LIF in every library, "
                                 "same equations, synchronised timing, beside the matmul and bandwidth floors"),
    "runs": ("spikefuse.bench.runs", "whole training runs in spikefuse, SpikingJelly, snnTorch and Norse: the same "
                                     "network, data, seed and recipe, wall time to a common test accuracy"),
    "all": ("spikefuse.bench.all", "run every benchmark above (or --only some) into one folder, with a summary"),
}


def configure(parser):
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            importlib.import_module(module).configure(p)
        except ImportError:  # a benchmark still being written: listed, not runnable
            pass


def run(args) -> int:
    return importlib.import_module(BENCHMARKS[args.benchmark][0]).run(args)
