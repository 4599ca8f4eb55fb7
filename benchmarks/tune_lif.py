"""Sweep the fused LIF's launch configuration (BLOCK, K, num_warps) per shape on a GPU.

Prints, per shape, forward and backward times of each configuration and the best, as
bytes moved over time (GB/s) next to the copy bandwidth. Used to choose
spikefuse.ops.lif._launch_config; results go to the JSON file given as argv[1].
"""
import itertools
import json
import sys

import torch

import spikefuse.ops.lif as lif_ops
from spikefuse.bench.timing import copy_bandwidth_gbs, median_ms

SHAPES = [(100, 64, 4096), (500, 16, 4096), (1000, 8, 8192)]  # the benchmark's main shapes
CONFIGS = [(128, 8, 1), (128, 16, 1), (256, 4, 1), (256, 8, 1), (256, 16, 1), (512, 4, 1), (512, 8, 1)]


def main(out_path, table_path=None):
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for T, B, N in SHAPES:
            x = (torch.randn(T, B, N, device="cuda") * 0.6 + 0.4).to(dtype)
            gs = torch.randn_like(x)
            esize = x.element_size()
            rows = []
            for cfg in CONFIGS:
                lif_ops._launch_config = lambda n, dtype, cfg=cfg: cfg
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
    if table_path:  # the configuration with the best geometric mean of fwd+bwd over the shapes
        configs = {}
        for dtype in ("torch.float32", "torch.bfloat16"):
            cases = [r for r in results if r["dtype"] == dtype]
            score = {cfg: 1.0 for cfg in CONFIGS}
            for case in cases:
                for row in case["rows"]:
                    score[tuple(row["cfg"])] *= (row["fwd_ms"] + row["bwd_ms"]) / case["floor_ms"]
            best = min(score, key=score.get)
            name = dtype.replace("torch.", "")
            configs[name] = list(best)
            print(f"{name}: chosen {best}, geometric mean {score[best] ** (1 / len(cases)):.2f}x floor")
        configs["float16"] = configs["bfloat16"]
        json.dump({"device": torch.cuda.get_device_name(), "measured_by": "benchmarks/tune_lif.py",
                   "configs": configs}, open(table_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
