"""Where the time of one `bench on` case goes: spikefuse and SpikingJelly timed in alternating
rounds (drift on a shared GPU hits both alike), then each call's GPU kernels from
torch.profiler, summed by kernel name. Default: N = 8192, float32, forward+backward, the case
where `bench on` saw the two within a few per cent of each other.

    python benchmarks/on_probe.py [--sizes 8192] [--rounds 7] > OUT.txt
"""
from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from spikefuse.bench import on, peers
from spikefuse.bench.timing import in_rounds, median_ms


def kernels(call, steps: int = 3) -> list[tuple[str, float, int]]:
    """(kernel name, total ms per call, launches per call), largest first."""
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total[e.name] += e.device_time_total / 1e3 / steps
            count[e.name] += 1
    return sorted(((n, t, count[n] // steps) for n, t in total.items()), key=lambda r: -r[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192])
    parser.add_argument("--precision", default="float32", choices=list(on.PRECISIONS))
    parser.add_argument("--mode", default="forward-backward", choices=list(on.MODES))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for N in args.sizes:
        problem = on.make_problem(N, on.TIME_STEPS, on.BATCH, "cuda", seed=0)
        with on.tf32_matmuls("cuda"):
            layers = {name: peers.LAYERS[name](problem.weight) for name in ("spikefuse", "spikingjelly")}
            call = {name: on.calls(layer, problem.x, problem.g, args.precision, "cuda")[args.mode]
                    for name, layer in layers.items()}
            times, errors = in_rounds(lambda fn: median_ms(fn, warmup=2, min_reps=5, max_reps=5)[0], call,
                                      args.rounds)
            for name, error in errors.items():
                print(f"N={N} {name}: failed: {error}", flush=True)
            for name, ts in ((n, ts) for n, ts in times.items() if ts):
                print(f"N={N} {args.precision} {args.mode} {name}: median {statistics.median(ts):.3f} ms "
                      f"over {len(ts)} rounds ({' '.join(f'{t:.2f}' for t in ts)})", flush=True)
            for name, fn in call.items():
                rows = kernels(fn)
                print(f"\n{name}: GPU kernel time per call {sum(t for _, t, _ in rows):.3f} ms")
                for kernel, t, n in rows[:12]:
                    print(f"  {t:8.3f} ms  x{n:<4d} {kernel[:110]}")
        del problem, layers, call
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
