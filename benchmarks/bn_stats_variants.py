"""Produces benchmarks/results/bf16-regression-2026-11-27/bn-stats-variants-<gpu>.json and .txt
(stdout; on a GPU; $OUT sets the JSON's folder).

The batch-statistics pass of the fused BN+LIF layers in isolation (not a training step):
the library's kernel (spikefuse.ops.bn_lif._batch_partials) against variants on CIFAR-medium's
layer shapes (T=10, B=64), float32 and bfloat16, channels-last and NCHW: "old" (683b86d, Chan's
merge in float32), "sums" (float32 two-pass per tile, float64 sums) at 64/128/256 rows, each
with its largest relative error in mean and variance against float64. At commit 8862b0f's
parent the library's kernel was Chan's merge in float64; 8862b0f adopted "sums" (256 rows
channels-last, 64 otherwise)."""
import json
import os

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from spikefuse.ops import bn_lif
from spikefuse.ops.kernel_base import cdiv

@triton.jit
def _tile(x_ptr, p, i, tiles_per_program, ROWS: tl.constexpr, r, c, c_mask, shift, M, C, inner):
    first = (p * tiles_per_program + i).to(tl.int64) * ROWS
    q0 = first // inner
    rr = (first - q0 * inner).to(tl.int32) + r
    row_mask = r < M - first
    mask = row_mask[:, None] & c_mask[None, :]
    offs = ((q0 + rr // inner) * (C * inner) + rr % inner)[:, None] + (c * inner)[None, :]
    X = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    X = tl.where(mask, X - shift[None, :], 0.0)
    n = tl.sum(row_mask.to(tl.float32), axis=0)
    return X, mask, n

@triton.jit
def v_old(x_ptr, part_ptr, M, C, inner, tiles_per_program, P, ROWS: tl.constexpr, CB: tl.constexpr):
    c = tl.program_id(0) * CB + tl.arange(0, CB); c_mask = c < C
    shift = tl.load(x_ptr + c * inner, mask=c_mask, other=0.0).to(tl.float32)
    p = tl.program_id(1); r = tl.arange(0, ROWS)
    count = tl.zeros([CB], tl.float32); mean = tl.zeros([CB], tl.float32); m2 = tl.zeros([CB], tl.float32)
    for i in range(0, tiles_per_program):
        X, mask, n = _tile(x_ptr, p, i, tiles_per_program, ROWS, r, c, c_mask, shift, M, C, inner)
        tile_mean = tl.sum(X, axis=0) / tl.maximum(n, 1.0)
        D = tl.where(mask, X - tile_mean[None, :], 0.0)
        total = count + n; share = n / tl.maximum(total, 1.0); delta = tile_mean - mean
        mean += delta * share; m2 += tl.sum(D * D, axis=0) + delta * delta * (count * share); count = total
    tl.store(part_ptr + p * C + c, mean.to(tl.float64), mask=c_mask)
    tl.store(part_ptr + (P + p) * C + c, m2.to(tl.float64), mask=c_mask)

@triton.jit
def v_sums(x_ptr, part_ptr, M, C, inner, tiles_per_program, P, ROWS: tl.constexpr, CB: tl.constexpr):
    """corrected two-pass per tile in float32; tiles merged by float64 sums (no float64 division in the loop)"""
    c = tl.program_id(0) * CB + tl.arange(0, CB); c_mask = c < C
    shift = tl.load(x_ptr + c * inner, mask=c_mask, other=0.0).to(tl.float32)
    p = tl.program_id(1); r = tl.arange(0, ROWS)
    count = tl.zeros([CB], tl.float32)
    s1 = tl.zeros([CB], tl.float64); s2 = tl.zeros([CB], tl.float64); m2 = tl.zeros([CB], tl.float64)
    for i in range(0, tiles_per_program):
        X, mask, n = _tile(x_ptr, p, i, tiles_per_program, ROWS, r, c, c_mask, shift, M, C, inner)
        inv = 1.0 / tl.maximum(n, 1.0)
        rough = tl.sum(X, axis=0) * inv
        D = tl.where(mask, X - rough[None, :], 0.0)
        residue = tl.sum(D, axis=0)
        residue = tl.where(residue == residue, residue, 0.0)
        correction = residue * inv
        tile_m2 = tl.sum(D * D, axis=0) - residue * correction
        tmean = rough.to(tl.float64) + correction.to(tl.float64)
        weighted = n.to(tl.float64) * tmean
        s1 += weighted; s2 += weighted * tmean; m2 += tile_m2.to(tl.float64)
        count += n
    n64 = tl.maximum(count, 1.0).to(tl.float64)
    mean = s1 / n64
    tl.store(part_ptr + p * C + c, mean, mask=c_mask)
    tl.store(part_ptr + (P + p) * C + c, m2 + (s2 - s1 * mean), mask=c_mask)

def launch(kernel, x, ROWS, CB=64, programs=512):
    C = x.shape[2]
    CB = min(CB, triton.next_power_of_2(C)); blocks = cdiv(C, CB)
    M = x.numel() // C
    tiles = cdiv(M, ROWS)
    tpp = max(1, cdiv(tiles, min(tiles, max(1, programs // blocks))))
    P = cdiv(tiles, tpp)
    inner = bn_lif._geometry(x)[3]
    part = torch.empty((2, P, C), device=x.device, dtype=torch.float64)
    def go():
        kernel[(blocks, P)](x, part, M, C, inner, tpp, P, ROWS=ROWS, CB=CB, num_warps=4)
    return go, part, P, tpp * ROWS

def combine(part, P, rpp, x):
    C = x.shape[2]; M = x.numel() // C
    n = torch.clamp(M - torch.arange(P, device=x.device, dtype=torch.float64) * rpp, max=rpp)[:, None]
    mp, m2p = part[0], part[1]
    mean = (mp * n).sum(0) / M
    m2 = (m2p + n * (mp - mean) ** 2).sum(0)
    shift = x.movedim(2, -1).reshape(-1, C)[0].double()
    return mean + shift, m2 / M

rows = []
torch.manual_seed(0)
shapes = [(10, 64, 128, 32, 32), (10, 64, 128, 16, 16), (10, 64, 256, 16, 16), (10, 64, 256, 8, 8), (10, 64, 512, 8, 8), (10, 64, 512, 4, 4)]
for dtype in (torch.float32, torch.bfloat16):
    for shape in shapes:
        for layout in ("cl", "nchw"):
            x = (torch.randn(shape, device="cuda") * 2 + 0.3).to(dtype)
            if layout == "cl":
                x = x.movedim(2, -1).contiguous().movedim(-1, 2)
            ref = x.double().transpose(0, 2).reshape(shape[2], -1)
            rmean, rvar = ref.mean(1), ref.var(1, unbiased=False)
            cur = lambda: bn_lif._batch_partials(x)
            res = {"dtype": str(dtype), "shape": shape, "layout": layout, "current_us": do_bench(cur, rep=200) * 1e3}
            bp = cur(); torch.cuda.synchronize()
            m, v = combine(bp.part, bp.P, bp.rows_per_program, x)
            res["current_err"] = [float(((m - rmean).abs() / rmean.abs().clamp_min(1e-30)).max()), float(((v - rvar).abs() / rvar).max())]
            for name, k, R in (("old", v_old, 64), ("sums64", v_sums, 64), ("sums128", v_sums, 128), ("sums256", v_sums, 256), ("old128", v_old, 128)):
                go, part, P, rpp = launch(k, x, R)
                res[name + "_us"] = do_bench(go, rep=200) * 1e3
                go(); torch.cuda.synchronize()
                m, v = combine(part, P, rpp, x)
                res[name + "_err"] = [float(((m - rmean).abs() / rmean.abs().clamp_min(1e-30)).max()), float(((v - rvar).abs() / rvar).max())]
            rows.append(res)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items() if not k.endswith("err")}, flush=True)
            print("   errs", {k: [f"{e:.1e}" for e in v] for k, v in res.items() if k.endswith("err")}, flush=True)
try:
    c = bn_lif._stats_partial_kernel
    print("regs/spills of current kernel cache:", [(k.n_regs, k.n_spills) for d in c.fn.device_caches.values() for k in d[0].values()] if hasattr(c, "fn") else "n/a")
except Exception as e:
    print("regs n/a", e)
for k in (v_old, v_sums):
    try:
        print(k.fn.__name__ if hasattr(k, "fn") else k, [(kk.n_regs, kk.n_spills) for d in k.device_caches.values() for kk in d[0].values()])
    except Exception as e:
        print("regs n/a", e)
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/stats_bench.json", "w"), indent=1)
