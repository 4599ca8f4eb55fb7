"""Produces benchmarks/results/tune-lif-<gpu>.json (argv[1]) and .txt (stdout), and src/spikefuse/ops/lif_tuning.json (argv[2]); on a GPU.

Sweep the fused LIF's launch configuration (BLOCK, K, num_warps) per shape on a GPU.

Prints, per shape, forward and backward times of each configuration and the best, as
bytes moved over time (GB/s) next to the copy bandwidth. Used to choose
spikefuse.ops.lif.launch_config; results go to the JSON file given as argv[1].
"""
import json
import sys

import torch

import spikefuse.ops.lif as lif_ops
from spikefuse.bench.timing import copy_bandwidth_gbs, median_ms

MAIN_SHAPES = [(100, 64, 4096), (500, 16, 4096), (1000, 8, 8192)]  # the benchmark's main shapes
# float32 also at two of the benchmark's fixed-work time sweep (few neurons, long T)
SHAPES = {torch.float32: MAIN_SHAPES + [(2048, 8, 4096), (8192, 8, 1024)], torch.bfloat16: MAIN_SHAPES}
# per dtype: one warp per program; narrow programs with long chunks keep many bytes in flight
# when few neurons leave few programs (wider or longer ones spill registers in the backward)
CONFIGS = {torch.float32: [(32, 16, 1), (32, 32, 1), (64, 8, 1), (64, 16, 1), (128, 8, 1), (128, 16, 1)],
           torch.bfloat16: [(64, 16, 1), (64, 32, 1), (128, 8, 1), (128, 16, 1), (256, 8, 1)]}


def main(out_path, table_path=None):
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for T, B, N in SHAPES[dtype]:
            x = (torch.randn(T, B, N, device="cuda") * 0.6 + 0.4).to(dtype)
            gs = torch.randn_like(x)
            esize = x.element_size()
            rows = []
            for cfg in CONFIGS[dtype]:
                lif_ops.launch_config = lambda n, dtype, cfg=cfg: cfg
                fwd = lambda: lif_ops._forward(x, 0.5, None, None, 1.0, "hard", 0.0, True)
                _, _, xs, ckpt = fwd()
                bwd = lambda: lif_ops._backward(gs, None, xs, ckpt, 0.5, None, 1.0, "hard",
                                                0.0, False, "rectangular", 1.0, False, False)
                # back to back: the kernels' own time, without the host's launch overhead
                f_ms, _ = median_ms(fwd, budget_s=0.15, back_to_back=10)
                b_ms, _ = median_ms(bwd, budget_s=0.15, back_to_back=10)
                n = T * B * N
                rows.append({"cfg": cfg, "fwd_ms": f_ms, "bwd_ms": b_ms,
                             "fwd_gbs": 2 * esize * n / f_ms / 1e6, "bwd_gbs": 3 * esize * n / b_ms / 1e6})
            best_f = min(rows, key=lambda r: r["fwd_ms"])
            best_b = min(rows, key=lambda r: r["bwd_ms"])
            floor = 5 * esize * T * B * N / bw / 1e6
            print(f"{dtype} T={T} B={B} N={N}: floor {floor:.3f} ms; best fwd {best_f['cfg']} "
                  f"{best_f['fwd_ms']:.3f} ms ({best_f['fwd_gbs']:.0f} GB/s); best bwd {best_b['cfg']} "
                  f"{best_b['bwd_ms']:.3f} ms ({best_b['bwd_gbs']:.0f} GB/s); "
                  f"best sum/floor {(best_f['fwd_ms'] + best_b['bwd_ms']) / floor:.2f}", flush=True)
            results.append({"dtype": str(dtype), "shape": [T, B, N], "floor_ms": floor, "rows": rows})
    json.dump({"copy_gbs": bw, "device": torch.cuda.get_device_name(), "results": results},
              open(out_path, "w"), indent=1)
    if table_path:
        rules = {name.replace("torch.", ""): choose_rules([r for r in results if r["dtype"] == name])
                 for name in ("torch.float32", "torch.bfloat16")}
        rules["float16"] = rules["bfloat16"]
        json.dump({"device": torch.cuda.get_device_name(), "measured_by": "benchmarks/tune_lif.py",
                   "rules": rules}, open(table_path, "w"), indent=1)


def choose_rules(cases):
    """Rules [min_neurons, BLOCK, K, warps], largest N first: for each neuron count N among
    the shapes, the configuration with the best geometric mean of (fwd + bwd) / floor over
    the shapes with that N; it holds from N up to the next larger N measured."""
    by_n = {}
    for case in cases:
        by_n.setdefault(case["shape"][1] * case["shape"][2], []).append(case)
    rules = []
    for n in sorted(by_n, reverse=True):
        score = {tuple(row["cfg"]): 1.0 for row in by_n[n][0]["rows"]}
        for case in by_n[n]:
            for row in case["rows"]:
                score[tuple(row["cfg"])] *= (row["fwd_ms"] + row["bwd_ms"]) / case["floor_ms"]
        best = min(score, key=score.get)
        print(f"{cases[0]['dtype']} N >= {n}: {best}, geometric mean "
              f"{score[best] ** (1 / len(by_n[n])):.2f}x floor", flush=True)
        if rules and tuple(rules[-1][1:]) == best:
            rules[-1][0] = n  # same choice as for more neurons: one rule
        else:
            rules.append([n, *best])
    rules[-1][0] = 0  # the smallest measured N's choice holds below it too
    return rules


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
