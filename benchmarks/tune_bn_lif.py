"""Produces benchmarks/results/tune-bn-lif-<gpu>.json (argv[1]; on a GPU).

Sweep the fused BatchNorm+LIF kernels' BLOCK (neurons per one-warp program) on a GPU.

Times forward+backward of spikefuse.nn.BNLIF at the CIFAR-medium layers' shapes (T=10,
B=64, channels-last) in float32 and bfloat16, for each BLOCK, back to back (the kernels'
own time). Prints a table; the JSON goes to argv[1].
"""
import json
import sys

import torch

import spikefuse.ops.bn_lif as bn_lif_ops
from spikefuse.bench.timing import median_ms
from spikefuse.nn import BNLIF

SHAPES = [(10, 64, 128, 32, 32), (10, 64, 256, 16, 16), (10, 64, 512, 8, 8)]
BLOCKS = [32, 64, 128, 256]


def main(out_path):
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for shape in SHAPES:
            T, B, C, H, W = shape
            layer = BNLIF(C, decay=0.25, threshold=0.25).cuda()
            x = torch.randn(T * B, C, H, W, device="cuda", dtype=dtype)
            x = x.contiguous(memory_format=torch.channels_last).view(T, B, C, H, W).requires_grad_()
            g = torch.randn_like(x)
            row = {"dtype": str(dtype), "shape": shape}
            for block in BLOCKS:
                bn_lif_ops._config = lambda n, dtype, block=block: (block, 1)
                ms, _ = median_ms(lambda: torch.autograd.grad(layer(x), (x, layer.weight), g),
                                  budget_s=0.3, back_to_back=5)
                row[block] = ms
            best = min(BLOCKS, key=row.get)
            print(f"{dtype} {shape}: " + " ".join(f"BLOCK {b}: {row[b]:.3f} ms" for b in BLOCKS)
                  + f" -> best {best}", flush=True)
            results.append(row)
    json.dump({"device": torch.cuda.get_device_name(), "results": results}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
