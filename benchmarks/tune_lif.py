"""Sweep the fused LIF's launch configuration on a GPU and write the best into the package.

For every shape, times forward and backward for each (V neurons per thread, K steps per
chunk), queued back to back so the figure is the kernels' own time, and prints it as
bytes moved over time next to the copy bandwidth. Then, per dtype, picks the
LaunchConfig (K, largest V, target program count) whose rule does best over all shapes
(geometric mean of time over the floor). argv: results JSON, [tuning JSON to write].
"""
import itertools
import json
import math
import sys

import torch

import spikefuse.ops.lif as lif_ops
from spikefuse.bench.timing import copy_bandwidth_gbs, median_ms

SHAPES = [(100, 64, 4096), (500, 16, 4096), (1000, 8, 8192),  # the benchmark's main shapes
          (32, 8, 262144), (2048, 8, 4096)]  # two of its fixed-work T sweep
PAIRS = [(v, k) for v, k in itertools.product([1, 2, 4, 8], [8, 16, 32]) if v * k <= 64]
TARGETS = [256, 512, 1024, 2048, 4096]


def time_pair(x, gs, V, K):
    lif_ops._launch_config = lambda n, dtype: (V, K)
    fwd = lambda: lif_ops._forward(x, 0.5, None, None, 1.0, "hard", 0.0, True)  # noqa: E731
    _, _, xs, ckpt = fwd()
    bwd = lambda: lif_ops._backward(gs, None, xs, ckpt, 0.5, None, 1.0, "hard",  # noqa: E731
                                    0.0, False, "rectangular", 1.0, False, False)
    f_ms, _ = median_ms(fwd, budget_s=0.15, back_to_back=10)
    b_ms, _ = median_ms(bwd, budget_s=0.15, back_to_back=10)
    return f_ms, b_ms


def choose(cases):
    """The LaunchConfig with the best geometric mean of (fwd + bwd) / floor over cases."""
    best, best_score = None, math.inf
    for (_, K), max_v, target in itertools.product(PAIRS, [1, 2, 4, 8], TARGETS):
        config = lif_ops.LaunchConfig(K, max_v, target)
        logs = []
        for case in cases:
            pair = (config.per_thread(case["shape"][1] * case["shape"][2]), K)
            row = case["times"].get(str(pair))
            if row is None:
                break
            logs.append(math.log((row["fwd_ms"] + row["bwd_ms"]) / case["floor_ms"]))
        else:
            score = math.exp(sum(logs) / len(logs))
            if score < best_score:
                best, best_score = config, score
    return best, best_score


def main(out_path, table_path=None):
    original = lif_ops._launch_config
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for T, B, N in SHAPES:
            x = (torch.randn(T, B, N, device="cuda") * 0.6 + 0.4).to(dtype)
            gs = torch.randn_like(x)
            n, esize = T * B * N, x.element_size()
            times = {}
            for V, K in PAIRS:
                f_ms, b_ms = time_pair(x, gs, V, K)
                times[str((V, K))] = {"fwd_ms": f_ms, "bwd_ms": b_ms, "fwd_gbs": 2 * esize * n / f_ms / 1e6,
                                      "bwd_gbs": 3 * esize * n / b_ms / 1e6}
            floor = 5 * esize * n / bw / 1e6
            best = min(times, key=lambda p: times[p]["fwd_ms"] + times[p]["bwd_ms"])
            r = times[best]
            print(f"{dtype} T={T} B={B} N={N}: floor {floor:.3f} ms; best (V, K) {best}: fwd {r['fwd_ms']:.3f} ms "
                  f"({r['fwd_gbs']:.0f} GB/s), bwd {r['bwd_ms']:.3f} ms ({r['bwd_gbs']:.0f} GB/s), "
                  f"{(r['fwd_ms'] + r['bwd_ms']) / floor:.2f}x floor", flush=True)
            results.append({"dtype": str(dtype), "shape": [T, B, N], "floor_ms": floor, "times": times})
            del x, gs
    lif_ops._launch_config = original
    configs = {}
    for dtype in ("float32", "bfloat16"):
        config, score = choose([r for r in results if r["dtype"] == f"torch.{dtype}"])
        configs[dtype] = {"steps_per_chunk": config.steps_per_chunk, "max_per_thread": config.max_per_thread,
                          "target_programs": config.target_programs}
        print(f"{dtype}: chosen {configs[dtype]}, geometric mean {score:.2f}x floor over {len(SHAPES)} shapes")
    configs["float16"] = configs["bfloat16"]
    with open(out_path, "w") as f:
        json.dump({"copy_gbs": bw, "device": torch.cuda.get_device_name(), "results": results,
                   "chosen": configs}, f, indent=1)
    if table_path:
        with open(table_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "measured_by": "benchmarks/tune_lif.py",
                       "configs": configs}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
