"""Produces benchmarks/results/tune-sparse-linear-<gpu>.json (argv[1]; on a GPU).

Tiles of the sparse Linear backward's two matmuls (spikefuse.ops.sparse_linear): the GPU
time of each candidate at the IPU layer-2 shapes (x4: 5880 x 5888, x1: 1470 x 1472) with the
rows of batch 8 and 64 (T = 100) and the carrying shares met in training (2-30 %, issue 32:
17-25 % at x4 batch 8), captured in a CUDA graph and replayed 10 times back to back
(medians), each output checked against torch's float64 product.
    python3 benchmarks/tune_sparse_linear.py OUT.json

Tried and measured (benchmarks/results/s29-2026-11-28/tune-sparse-linear-kmajor-*, at 7464736):
the input gradient with W's carrying rows gathered transposed first, so that both operands
are contiguous along the carrying columns (the layout Hopper's TF32 wgmma reads): 1.3-1.6x
slower at 800 rows, 0.94-0.97x at 6400, the gather included."""
import json
import sys

import torch

from spikefuse.bench.timing import captured, median_ms
from spikefuse.ops import sparse_linear as sl
from spikefuse.ops.spike_pack import pack

# (rows, inputs, carrying columns, warps, stages)
INPUT_GRAD = [(32, 128, 32, 4, 3), (32, 128, 32, 4, 4), (32, 256, 32, 8, 3), (64, 128, 32, 4, 3),
              (64, 128, 32, 4, 4), (64, 256, 32, 8, 3), (128, 128, 32, 4, 3), (128, 128, 32, 8, 3),
              (128, 256, 32, 8, 3), (64, 64, 32, 4, 4), (128, 64, 32, 4, 4)]
# (carrying columns, inputs, rows, warps, stages)
WEIGHT_GRAD = [(64, 128, 32, 4, 3), (64, 128, 32, 4, 4), (64, 128, 64, 4, 3), (128, 128, 32, 8, 3),
               (64, 256, 32, 8, 3), (128, 64, 32, 4, 3), (32, 128, 32, 4, 3), (64, 64, 32, 4, 4),
               (128, 128, 64, 8, 3), (128, 256, 32, 8, 3)]
SHAPES = [(5880, 5888, 800), (5880, 5888, 6400), (1470, 1472, 800)]  # (OUT, IN, R)
SHARES = (0.02, 0.1, 0.2, 0.3)


def timed(fn):
    return median_ms(captured(fn)[0], back_to_back=10, warmup=3, min_reps=5, max_reps=40, budget_s=0.3)[0]


rows = []
torch.backends.cuda.matmul.allow_tf32 = True
for out_f, in_f, R in SHAPES:
    gen = torch.Generator(device="cuda").manual_seed(0)
    s = (torch.rand(R, in_f, device="cuda", generator=gen) < 0.02).float()
    w = torch.randn(out_f, in_f, device="cuda", generator=gen) / in_f ** 0.5
    bits = pack(s)
    gw = torch.zeros(out_f, in_f, device="cuda")
    for share in SHARES:
        carrying = torch.rand(out_f, device="cuda", generator=gen) < share
        gy = torch.randn(R, out_f, device="cuda", generator=gen) * carrying
        gyt, cols, count = sl.gather_carrying(gy)
        want_gs = (gy.double() @ w.double()).float()
        want_gw = (gy.double().t() @ s.double()).float()
        row = {"OUT": out_f, "IN": in_f, "R": R, "share": float(carrying.float().mean()),
               "input_grad": {}, "weight_grad": {},
               "dense_input_grad_ms": timed(lambda: gy @ w), "dense_weight_grad_ms": timed(lambda: gy.t() @ s)}
        for tiles in INPUT_GRAD:
            sl.INPUT_GRAD_TILES = tiles
            gs = sl.input_grad(gyt, w, cols, count, "tf32")
            err = float((gs - want_gs).norm() / want_gs.norm())
            row["input_grad"][str(tiles)] = (timed(lambda: sl.input_grad(gyt, w, cols, count, "tf32")), err)
        for tiles in WEIGHT_GRAD:
            sl.WEIGHT_GRAD_TILES = tiles
            gw.zero_()
            sl.weight_grad(gyt, bits, cols, count, gw, "tf32")
            err = float((gw - want_gw).norm() / want_gw.norm())
            row["weight_grad"][str(tiles)] = (timed(lambda: sl.weight_grad(gyt, bits, cols, count, gw, "tf32")), err)
        rows.append(row)
        print(f"{out_f}x{in_f} R={R} share={row['share']:.3f}: dense input grad {row['dense_input_grad_ms']:.4f} ms, "
              f"weight grad {row['dense_weight_grad_ms']:.4f}", flush=True)
        for part in ("input_grad", "weight_grad"):
            best = sorted(row[part].items(), key=lambda kv: kv[1][0])
            print("  ", part, "; ".join(f"{k} {v[0]:.4f} ({v[1]:.0e})" for k, v in best), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
