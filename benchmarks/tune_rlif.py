"""Produces benchmarks/results/tune-rlif-<gpu>.json (argv[1]) and .txt (stdout); on a GPU.

Tile sizes of the fused recurrent LIF's per-step kernels: fwd+bwd time per candidate
(BLOCK_M, BLOCK_N, num_warps) at a few shapes, dense and sparse paths (CUDA events, medians).
    python3 benchmarks/tune_rlif.py OUT.json"""
import json
import sys

import torch

import spikefuse.functional as F
from spikefuse.bench.timing import median_ms
from spikefuse.ops import recurrent_lif, sparse_recurrent_lif

SHAPES = [(100, 32, 1024), (100, 8, 5888), (100, 32, 2048), (100, 1, 1472)]
CANDIDATES = [(16, 16, 2), (16, 16, 4), (16, 32, 4), (32, 32, 4), (64, 64, 4)]
original = recurrent_lif._tiles
rows = []
for T, B, N in SHAPES:
    torch.manual_seed(0)
    x = torch.randn(T, B, N, device="cuda") * 0.5 + 0.3
    w = torch.randn(N, N, device="cuda") / N ** 0.5 * 0.5
    g = torch.randn(T, B, N, device="cuda")
    for sparse in (False, True):
        results = {}
        for cand in [None] + CANDIDATES:
            tiles = original if cand is None else (lambda M, N, c=cand: (c[0], c[1], 32, c[2]))
            recurrent_lif._tiles = sparse_recurrent_lif._tiles = tiles

            def step():
                xi = x.clone().requires_grad_(True)
                wi = w.clone().requires_grad_(True)
                s = F.rlif(xi, wi, backend="fused", sparse=sparse, grad_threshold=0.9)
                (s * g).sum().backward()
            try:
                ms, _ = median_ms(step, warmup=2, max_reps=15, budget_s=1.0, back_to_back=3)
            except Exception as e:  # noqa: BLE001
                ms = None
                print("failed", cand, e)
            results["default" if cand is None else str(cand)] = ms
        recurrent_lif._tiles = sparse_recurrent_lif._tiles = original
        best = min((v, k) for k, v in results.items() if v is not None)
        row = {"T": T, "B": B, "N": N, "sparse": sparse, "ms": results, "best": best[1]}
        rows.append(row)
        print(T, B, N, "sparse" if sparse else "dense", {k: round(v, 3) for k, v in results.items() if v}, "best", best,
              flush=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
