"""Produces benchmarks/results/overhead-lif-<gpu>.jsonl (argv[1]; on a GPU).

Host time per call of the fused LIF, on a shape so small that the GPU never limits.

Separates what a call costs on the CPU: torch's own elementwise op (a floor for one
launch), a bare Triton launch (through Triton's JIT and through spikefuse's cached
launcher), a do-nothing autograd.Function (PyTorch's floor for any custom op),
spikefuse.ops.lif._forward (allocations + launch), functional.lif (checks +
autograd.Function), and forward + backward through autograd.
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
    BLOCK, K, warps = lif_ops.launch_config(128, torch.float32)

    def bare_launch(kernel):
        kernel[(1,)](
            xd, spikes, ckpt, xd, vT, xd, xd, xd, xd, 0.5, 1.0, 0.0, 0.0, 4, 128, 1, 1, RESET=0, DECAY=0,
            THRESHOLD=0, HAS_V0=False, SAVE_CKPT=True, STORE_VT=True, STORE_H=False, TRACK=False, BITS=False,
            BLOCK=BLOCK, K=K, EVEN_N=True,
            num_warps=warps, enable_fp_fusion=False)

    class Identity(torch.autograd.Function):  # PyTorch's own cost of a custom op's autograd
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    def fwd_and_bwd():
        torch.autograd.grad(F.lif(x), x, g)

    items = {
        "torch add (one launch)": lambda: xd.add(1.0),
        "triton launch (Triton's JIT path)": lambda: bare_launch(lif_ops._lif_forward_kernel.kernel),
        "triton launch (spikefuse cached)": lambda: bare_launch(lif_ops._lif_forward_kernel),
        "identity autograd.Function forward+backward": lambda: torch.autograd.grad(Identity.apply(x), x, g),
        "ops.lif._forward": lambda: lif_ops._forward(xd, 0.5, None, None, 1.0, "hard", 0.0, True),
        "functional.lif no_grad": torch.no_grad()(lambda: F.lif(xd)),
        "functional.lif forward (grad)": lambda: F.lif(x),
        "functional.lif forward+backward": fwd_and_bwd,
    }
    lines = [json.dumps({"item": k, "host_us_per_call": round(host_us(fn), 2)}) for k, fn in items.items()]
    lines += [json.dumps(item) for item in per_dtype_at_benchmark_shape()]
    text = "\n".join(lines) + "\n"
    (open(out, "w").write(text) if out else None)
    print(text, end="")


def per_dtype_at_benchmark_shape(shape=(100, 64, 4096), calls=20):
    """At the benchmark's first shape, per dtype: the host's time to issue one forward+backward
    (20 calls queued without a sync) against the GPU's time per call over the same calls."""
    from spikefuse.bench.lif import forward_backward, make_inputs
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x, grad = make_inputs(*shape, dtype, "cuda")
        run = lambda: forward_backward(F.lif, x, grad)  # noqa: E731
        for _ in range(5):
            run()
        host, gpu = [], []
        for _ in range(10):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(calls):
                run()
            end.record()
            host.append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
            gpu.append(start.elapsed_time(end) / calls * 1e3)
        rows.append({"item": f"forward+backward {shape} {dtype}", "host_us_per_call": sorted(host)[5],
                     "gpu_us_per_call": sorted(gpu)[5]})
    return rows


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
