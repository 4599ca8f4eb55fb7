"""Produces benchmarks/results/on-probe-[gemms-]<N>-<gpu>.txt (stdout; on a GPU).

Where the time of one `bench on` case goes: spikefuse and SpikingJelly timed in alternating
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


def grad_of_linear_output(fn):
    """The gradient reaching the Linear's output y in one forward+backward call of fn."""
    seen = []
    linear = torch.nn.functional.linear

    def hooked(*args, **kwargs):
        y = linear(*args, **kwargs)
        if y.requires_grad:
            y.register_hook(lambda g: seen.append(g.detach().clone()))
        return y
    torch.nn.functional.linear = hooked
    try:
        fn()
    finally:
        torch.nn.functional.linear = linear
    (g,) = seen
    return g


def backward_gemms(call, layers, problem, rounds):
    """Is the GEMMs' time inside a call data-dependent? The input gradient g W and weight
    gradient g^T x timed (alternating rounds, steady state) on each library's own g."""
    grads = {name: grad_of_linear_output(fn) for name, fn in call.items()}
    x = problem.x.detach().flatten(0, -2)
    for name, g in grads.items():
        g2 = g.flatten(0, -2)
        print(f"{name}: g {tuple(g.shape)} strides {g.stride()} zeros {(g2 == 0).float().mean().item():.4f} "
              f"rel diff to spikefuse {((g - grads['spikefuse']).norm() / grads['spikefuse'].norm()).item():.2e}")
    gemms = {}
    for name, g in grads.items():
        g2, w = g.flatten(0, -2), layers[name].weight.detach()
        gemms[(name, "g W")] = lambda g2=g2, w=w: g2 @ w
        gemms[(name, "g^T x")] = lambda g2=g2: g2.t() @ x
    times, _ = in_rounds(lambda fn: median_ms(fn, warmup=3, min_reps=10, max_reps=10, back_to_back=3)[0], gemms,
                         rounds)
    for (name, gemm), ts in times.items():
        print(f"  {gemm:6s} on {name}'s g: median {statistics.median(ts):.3f} ms ({' '.join(f'{t:.2f}' for t in ts)})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192])
    parser.add_argument("--precision", default="float32", choices=list(on.PRECISIONS))
    parser.add_argument("--mode", default="forward-backward", choices=list(on.MODES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gemms", action="store_true",
                        help="also time the backward's two GEMMs on each library's own gradient of y")
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
            if args.gemms:
                backward_gemms(call, layers, problem, args.rounds)
        del problem, layers, call
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
