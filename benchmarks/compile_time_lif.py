"""Produces benchmarks/results/compile-time-lif-backward-cpu.md (stdout; on any machine with
Triton, no GPU needed).

Issue 38's cold-cache first epochs are mostly Triton compiling the LIF kernels (4.2-5.4 s per
backward variant on the H100 host). An experiment, not the library's kernel: the LIF
backward compiled for an sm_90 (H100) target on the CPU, spikefuse's kernel against
`single_walk` below, which sends every chunk through backward_chunk's TAIL form (the kernel
walks the partial chunk and the full chunks in two unrolled copies), at K = 16 and 8 steps
per chunk. Each compile runs in a fresh process with an empty cache. With --check, both
kernels' spikes and input gradients are compared through Triton's interpreter
(TRITON_INTERPRET=1). With --gpu-time, both backward kernels are timed on a CUDA GPU.

    python benchmarks/compile_time_lif.py            # the compile times
    TRITON_INTERPRET=1 python benchmarks/compile_time_lif.py --check
    python benchmarks/compile_time_lif.py --gpu-time # on a GPU
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

from spikefuse import functional as F
from spikefuse.ops import lif
from spikefuse.ops.kernel_base import (f32, load_chunk, load_earlier_chunks, load_per_neuron, program_neurons,
                                       spike_adjoint, store_chunk)
from spikefuse.ops.launch import cached_launch
from spikefuse.ops.lif import backward_chunk, cut_surrogate, lif_surrogate_grad


@triton.jit
def single_walk(
    gs_ptr, x_ptr, ckpt_ptr, gvT_ptr, gx_ptr, gv0_ptr, gd_ptr, decay_ptr, gh_ptr, thr_ptr, gthr_ptr, keep_ptr,
    decay, threshold, v_reset, alpha, grad_floor, T, N, inner, C, KEEP_N,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, CUSTOM_FN: tl.constexpr,
    DECAY: tl.constexpr, THRESHOLD: tl.constexpr, HAS_GVT: tl.constexpr, NEED_GV0: tl.constexpr,
    NEED_GD: tl.constexpr, HAS_GH: tl.constexpr, NEED_GTHR: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr,
    K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """spikefuse.ops.lif._lif_backward_kernel with one reverse walk over all chunks, each in
    backward_chunk's TAIL form (its steps past T masked): one unrolled copy of the chunk."""
    decay, threshold, v_reset, alpha = f32(decay), f32(threshold), f32(v_reset), f32(alpha)
    grad_floor = f32(grad_floor)
    n = program_neurons(BLOCK)
    n_mask = n < N
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    threshold = load_per_neuron(thr_ptr, threshold, n, n_mask, inner, C, THRESHOLD)
    if HAS_GVT:
        gv = tl.load(gvT_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros([BLOCK], tl.float32)
    gd = tl.zeros([BLOCK], tl.float32)
    gthr = tl.zeros([BLOCK], tl.float32)
    gp = gthr
    keep = gthr
    if KEEP:
        keep = tl.load(keep_ptr + n % KEEP_N, mask=n_mask, other=0.0)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    last = tl.cdiv(T, K) - 1
    X = load_chunk(x_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GS = load_chunk(gs_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GH = GS
    if HAS_GH:
        GH = load_chunk(gh_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    v = tl.load(ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    for i in range(0, last + 1):
        c = last - i
        t0 = c * K
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0 - K, offs, n_mask, N, EVEN_N, HAS_GH)
        v_prev = tl.load(ckpt_ptr + tl.cast(tl.maximum(c - 1, 0), tl.int64) * N + n, mask=n_mask, other=0.0)
        GX, gv, gp, gd, gthr = backward_chunk(X, GS, v, gv, gp, gd, gthr, d, t0, T, threshold, v_reset, alpha,
                                              grad_floor, keep, RESET, DETACH, SURROGATE, CUSTOM_FN, NEED_GD, True,
                                              GH, HAS_GH, NEED_GTHR, KEEP)
        store_chunk(gx_ptr, t0, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v = X_prev, GS_prev, GH_prev, v_prev
    if RESET == 3 and not DETACH:
        u0 = v - threshold
        g0 = spike_adjoint(0.0, gp, -threshold, RESET, DETACH) * cut_surrogate(
            lif_surrogate_grad(u0, SURROGATE, alpha, CUSTOM_FN), v, keep, grad_floor, KEEP)
        gv += g0
        gthr -= g0
    if NEED_GV0:
        tl.store(gv0_ptr + n, gv, mask=n_mask)
    if NEED_GD:
        tl.store(gd_ptr + n, gd, mask=n_mask)
    if NEED_GTHR:
        tl.store(gthr_ptr + n, gthr, mask=n_mask)


def compile_once(which: str, K: int) -> None:
    """Compile one kernel for sm_90 (the ipu nets' training variant: hard reset, detached,
    fast_sigmoid, float32, BLOCK 64, one warp) and print the seconds."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = lif._lif_backward_kernel.kernel if which == "library" else single_walk
    signature = {name: "*fp32" for name in ("gs_ptr", "x_ptr", "ckpt_ptr", "gvT_ptr", "gx_ptr", "gv0_ptr", "gd_ptr",
                                            "decay_ptr", "gh_ptr", "thr_ptr", "gthr_ptr", "keep_ptr")}
    signature.update({name: "fp32" for name in ("decay", "threshold", "v_reset", "alpha", "grad_floor")})
    signature.update({name: "i32" for name in ("T", "N", "inner", "C", "KEEP_N")})
    constants = dict(RESET=0, DETACH=True, SURROGATE=2, CUSTOM_FN=None, DECAY=0, THRESHOLD=0, HAS_GVT=False,
                     NEED_GV0=False, NEED_GD=False, HAS_GH=False, NEED_GTHR=False, KEEP=False, BLOCK=64, K=K,
                     EVEN_N=True)
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(kernel, signature, constexprs={(list(signature).index(n),): v for n, v in constants.items()},
                       attrs={})
    start = time.perf_counter()
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 1, "enable_fp_fusion": False})
    print(f"| {which} | {K} | {time.perf_counter() - start:.2f} | {len(compiled.asm['ptx'])} |", flush=True)


def check() -> None:
    """Spikes and input gradients of F.lif(backend="fused") with each backward kernel."""
    library = lif._lif_backward_kernel
    for T, N, options in ((21, 100, dict(decay=0.8, threshold=0.5)), (16, 64, dict(decay=0.9, threshold=0.3, reset="soft")),
                          (1, 7, dict(decay=0.5)),
                          (37, 33, dict(decay=0.7, threshold=0.4, reset="subtract", detach_reset=False))):
        x = torch.rand(T, N, generator=torch.Generator().manual_seed(T)) * 0.8
        results = []
        for kernel in (library, cached_launch(single_walk)):
            lif._lif_backward_kernel = kernel
            xg = x.clone().requires_grad_()
            s = F.lif(xg, backend="fused", **options)
            (s * torch.randn(s.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
            results.append((s.detach(), xg.grad))
        lif._lif_backward_kernel = library
        (s1, g1), (s2, g2) = results
        print(f"T={T} N={N} {options}: spikes equal {torch.equal(s1, s2)}, dL/dx equal {torch.equal(g1, g2)}")


# (name, T, neurons): the bench runs tasks' hidden LIF layers at their batch (time steps, batch x width)
GPU_SHAPES = (("ipu-shd hidden, B=48", 100, 48 * 1472), ("shd hidden, B=64", 100, 64 * 256),
              ("randman hidden, B=64", 20, 64 * 256), ("T=1000, 4096", 1000, 4096))


def kernel_us(prof, names) -> float:
    """The profiler's summed GPU time (us) of the kernels whose name contains one of `names`."""
    total = 0.0
    for e in prof.key_averages():
        if any(n in e.key for n in names):
            total += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    return total


def gpu_time(rounds: int = 7, calls: int = 20) -> None:
    """The backward kernel's own GPU time (the profiler's, per call) with each kernel, median of
    alternating rounds after a compiling round; the ipu nets' training variant, float32. Event
    timing of the whole call is launch-bound at these sizes (a 7M-element backward moves ~85 MB,
    ~30 us at HBM speed), so it is kept only as a second column."""
    from torch.profiler import ProfilerActivity, profile

    library = lif._lif_backward_kernel
    kernels = {"library": library, "single_walk": cached_launch(single_walk)}
    names = {"library": ("_lif_backward_kernel",), "single_walk": ("single_walk",)}
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, torch {torch.__version__}; the backward "
          f"kernel's GPU time per call (profiler), median of {rounds} rounds x {calls} calls; wall: CUDA events "
          "around the whole autograd call\n\n| shape | T | N | library us | single_walk us | ratio | library wall us | "
          "single_walk wall us |\n|---|---|---|---|---|---|---|---|", flush=True)
    for name, T, N in GPU_SHAPES:
        x = (torch.rand(T, N, device="cuda") * 0.3).requires_grad_()
        g = torch.randn(T, N, device="cuda")
        gpu, wall = {k: [] for k in kernels}, {k: [] for k in kernels}
        for r in range(rounds + 1):  # round 0 compiles and warms
            for k, kernel in kernels.items():
                lif._lif_backward_kernel = kernel
                s = F.lif(x, decay=0.95, threshold=1.0, detach_reset=True, surrogate="fast_sigmoid", backend="fused")
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    start.record()
                    for _ in range(calls):
                        torch.autograd.grad(s, x, g, retain_graph=True)
                    end.record()
                    torch.cuda.synchronize()
                if r:
                    gpu[k].append(kernel_us(prof, names[k]) / calls)
                    wall[k].append(start.elapsed_time(end) * 1e3 / calls)
        lif._lif_backward_kernel = library
        med = {k: sorted(v)[len(v) // 2] for k, v in gpu.items()}
        mwall = {k: sorted(v)[len(v) // 2] for k, v in wall.items()}
        print(f"| {name} | {T} | {N} | {med['library']:.1f} | {med['single_walk']:.1f} | "
              f"{med['single_walk'] / max(med['library'], 1e-9):.3f} | {mwall['library']:.1f} | "
              f"{mwall['single_walk']:.1f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the kernels through the interpreter")
    parser.add_argument("--gpu-time", action="store_true", help="time both backward kernels on the GPU")
    parser.add_argument("--one", nargs=2, metavar=("KERNEL", "K"), help=argparse.SUPPRESS)  # a child's compile
    args = parser.parse_args()
    if args.check:
        return check()
    if args.gpu_time:
        return gpu_time()
    if args.one:
        return compile_once(args.one[0], int(args.one[1]))
    print(f"Triton {triton.__version__}, torch {torch.__version__}, target sm_90, one fresh process and empty cache "
          "per compile\n\n| kernel | K | compile s | PTX chars |\n|---|---|---|---|", flush=True)
    for which in ("library", "single_walk"):
        for K in (16, 8):
            with tempfile.TemporaryDirectory() as cache:
                subprocess.run([sys.executable, __file__, "--one", which, str(K)], check=True,
                               env={**os.environ, "TRITON_CACHE_DIR": cache})


if __name__ == "__main__":
    main()
