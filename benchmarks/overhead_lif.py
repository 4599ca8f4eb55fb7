"""Host time per call of the fused LIF, on a shape so small that the GPU never limits.

Separates what a call costs on the CPU: torch's own elementwise op (a floor for one
launch), the bare Triton launch, spikefuse.ops.lif._forward (allocations + launch),
functional.lif (checks + autograd.Function), and forward + backward through autograd.
Writes one JSON line per item to argv[1] (default stdout).
"""
import json
import sys
import time

import torch

import spikefuse.functional as F
import spikefuse.ops.lif as lif_ops


def host_us(fn, reps=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def main(out=None):
    x = torch.randn(4, 2, 64, device="cuda", requires_grad=True)
    g = torch.randn_like(x)
    xd = x.detach()
    spikes = torch.empty_like(xd)
    vT = torch.empty(128, device="cuda")
    ckpt = torch.empty(1, 128, device="cuda")
    BLOCK, K, warps = lif_ops._launch_config(128, torch.float32)

    def bare_launch():
        lif_ops._lif_forward_kernel[(1,)](
            xd, spikes, ckpt, xd, vT, xd, 0.5, 1.0, 0.0, 4, 128, 1, 1, RESET=0, DECAY=0,
            HAS_V0=False, SAVE_CKPT=True, BLOCK=BLOCK, K=K, EVEN_N=True, num_warps=warps,
            enable_fp_fusion=False)

    def fwd_and_bwd():
        torch.autograd.grad(F.lif(x), x, g)

    items = {
        "torch add (one launch)": lambda: xd.add(1.0),
        "bare triton launch": bare_launch,
        "ops.lif._forward": lambda: lif_ops._forward(xd, 0.5, None, None, 1.0, "hard", 0.0, True),
        "functional.lif no_grad": torch.no_grad()(lambda: F.lif(xd)),
        "functional.lif forward (grad)": lambda: F.lif(x),
        "functional.lif forward+backward": fwd_and_bwd,
    }
    lines = [json.dumps({"item": k, "host_us_per_call": round(host_us(fn), 2)}) for k, fn in items.items()]
    text = "\n".join(lines) + "\n"
    (open(out, "w").write(text) if out else None)
    print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
