"""Produces benchmarks/results/tune-sparse-linear-<gpu>.json (argv[1]; on a GPU).

Tiles of the sparse Linear backward's two matmuls (spikefuse.ops.sparse_linear): the GPU
time of each candidate at the IPU x4 layer-2 shape (5880 x 5888) with R = 100 and 800 rows
and 1-5 % carrying columns, captured in a CUDA graph and replayed 10 times back to back
(medians), each output checked against torch's float64 product.
    python3 benchmarks/tune_sparse_linear.py OUT.json"""
import json
import sys

import torch

from spikefuse.bench.timing import captured, median_ms
from spikefuse.ops import sparse_linear as sl
from spikefuse.ops.spike_pack import pack

INPUT_GRAD = [(64, 64, 32, 4), (64, 128, 32, 4), (128, 64, 32, 4), (128, 128, 32, 8), (64, 128, 64, 4),
              (32, 128, 32, 4), (128, 128, 64, 8)]
WEIGHT_GRAD = [(32, 64, 32, 4), (32, 128, 32, 4), (64, 64, 32, 4), (64, 128, 32, 4), (32, 128, 64, 4),
               (64, 128, 64, 8), (16, 128, 64, 4)]
OUT_F, IN_F = 5880, 5888
rows = []
torch.backends.cuda.matmul.allow_tf32 = True
for R in (100, 800):
    for share in (0.01, 0.027, 0.05):
        gen = torch.Generator(device="cuda").manual_seed(0)
        carrying = torch.rand(OUT_F, device="cuda", generator=gen) < share
        gy = torch.randn(R, OUT_F, device="cuda", generator=gen) * carrying
        s = (torch.rand(R, IN_F, device="cuda", generator=gen) < 0.02).float()
        w = torch.randn(OUT_F, IN_F, device="cuda", generator=gen) / IN_F ** 0.5
        bits = pack(s)
        gw = torch.zeros(OUT_F, IN_F, device="cuda")
        gyt, cols, count = sl.gather_carrying(gy)
        want_gs = (gy.double() @ w.double()).float()
        want_gw = (gy.double().t() @ s.double()).float()
        kw = dict(warmup=3, min_reps=5, max_reps=40, budget_s=0.4)
        row = {"R": R, "share": float(carrying.float().mean()), "input_grad": {}, "weight_grad": {}}
        row["gather_ms"] = median_ms(captured(lambda: sl.gather_carrying(gy))[0], back_to_back=10, **kw)[0]
        row["dense_input_grad_ms"] = median_ms(captured(lambda: gy @ w)[0], back_to_back=10, **kw)[0]
        row["dense_weight_grad_ms"] = median_ms(captured(lambda: gy.t() @ s)[0], back_to_back=10, **kw)[0]
        for tiles in INPUT_GRAD:
            sl.INPUT_GRAD_TILES = tiles
            gs = sl.input_grad(gyt, w, cols, count, "tf32")
            err = float((gs - want_gs).norm() / want_gs.norm())
            ms = median_ms(captured(lambda: sl.input_grad(gyt, w, cols, count, "tf32"))[0], back_to_back=10, **kw)[0]
            row["input_grad"][str(tiles)] = (ms, err)
        for tiles in WEIGHT_GRAD:
            sl.WEIGHT_GRAD_TILES = tiles
            gw.zero_()
            sl.weight_grad(gyt, bits, cols, count, gw, "tf32")
            err = float((gw - want_gw).norm() / want_gw.norm())
            ms = median_ms(captured(lambda: sl.weight_grad(gyt, bits, cols, count, gw, "tf32"))[0],
                           back_to_back=10, **kw)[0]
            row["weight_grad"][str(tiles)] = (ms, err)
        rows.append(row)
        print(f"R={R} share={row['share']:.3f} gather {row['gather_ms']:.4f} ms; dense input grad "
              f"{row['dense_input_grad_ms']:.4f}, weight grad {row['dense_weight_grad_ms']:.4f}", flush=True)
        for part in ("input_grad", "weight_grad"):
            print("  ", part, {k: f"{v[0]:.4f} ({v[1]:.1e})" for k, v in row[part].items()}, flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
