"""Produces benchmarks/results/compile-time-lif-<gpu>.md (stdout; the compile times need
Triton only, the rest a CUDA GPU).

Issue 38's cold-cache first epochs are mostly Triton compiling the LIF kernels. Up to
b7f16d4 both LIF kernels walked time in two unrolled copies of their chunk step: the full
chunks, and the partial one with its steps past T masked. One walk, every chunk in the masked
form, compiles faster; the backward kernel now walks once, the forward still twice (one walk
cost it GPU time). This benchmark keeps the other form of each (`one_walk_forward` and
`two_walk_backward` below; the latter is b7f16d4's kernel, calling the library's chunk step)
and compares them as pairs: "one walk" (one_walk_forward + the library's backward) and "two
walks" (the library's forward + two_walk_backward, the library of b7f16d4):

    python benchmarks/compile_time_lif.py [--k 16 8 4 1]  # compile times, sm_90 target, no GPU needed
    TRITON_INTERPRET=1 python benchmarks/compile_time_lif.py --check   # same spikes, same dL/dx
    python benchmarks/compile_time_lif.py --gpu-time  # kernel GPU time (profiler), on a GPU
    python benchmarks/compile_time_lif.py --beside-python  # a compile beside a busy thread, no GPU
    python benchmarks/compile_time_lif.py --cold [PAIR ...]  # ipu-shd's first epochs, empty cache
    python benchmarks/compile_time_lif.py --cold library "library speculative" "library background"

Compile times: each kernel for the ipu nets' training variant (hard reset, detached,
fast_sigmoid, float32, BLOCK 64, one warp) at K = 16 and 8, one fresh process and empty
cache per compile. --cold: Trainer.fit's first and second epoch (captured, fp32, batch 48)
of shd-synthetic:ipu-shd, each pair of kernels in a fresh process with an empty
TRITON_CACHE_DIR, alternating, every LIF compile timed; "speculative": the backward and the
evaluation forward compile in threads after a forward compiled; "background": fit's background
compiles (the layers' torch twins train while their kernels compile).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import torch
import triton
import triton.language as tl

import cold_epochs
from spikefuse import functional as F
from spikefuse.ops import kernel_base, launch, lif
from spikefuse.ops.kernel_base import (f32, load_chunk, load_earlier_chunks, load_per_neuron, program_neurons,
                                       spike_adjoint, store_bits, store_chunk, store_outputs)
from spikefuse.ops.launch import cached_launch
from spikefuse.ops.lif import backward_chunk, cut_surrogate, forward_chunk, lif_surrogate_grad


@triton.jit
def one_walk_forward(
    x_ptr, s_ptr, ckpt_ptr, v0_ptr, vT_ptr, decay_ptr, h_ptr, thr_ptr, bits_ptr,
    decay, threshold, v_reset, grad_floor, T, N, inner, C,
    RESET: tl.constexpr, DECAY: tl.constexpr, THRESHOLD: tl.constexpr, HAS_V0: tl.constexpr,
    SAVE_CKPT: tl.constexpr, STORE_VT: tl.constexpr, STORE_H: tl.constexpr, TRACK: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """spikefuse.ops.lif._lif_forward_kernel with one walk over all chunks, each in
    forward_chunk's TAIL form (its steps past T masked): one unrolled copy of the chunk step."""
    decay, threshold, v_reset, grad_floor = f32(decay), f32(threshold), f32(v_reset), f32(grad_floor)
    n = program_neurons(BLOCK)
    n_mask = n < N
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    threshold = load_per_neuron(thr_ptr, threshold, n, n_mask, inner, C, THRESHOLD)
    if HAS_V0:
        v = tl.load(v0_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK], tl.float32)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    reached = tl.zeros([BLOCK], tl.float32)
    X = load_chunk(x_ptr, 0, offs, k, n_mask, T, N, EVEN_N)
    for c in range(0, tl.cdiv(T, K)):
        t0 = c * K
        X_next = load_chunk(x_ptr, t0 + K, offs, k, n_mask, T, N, EVEN_N)  # prefetch (nothing read past T)
        if SAVE_CKPT:
            tl.store(ckpt_ptr + tl.cast(c, tl.int64) * N + n, v, mask=n_mask)
        S, H, v, reached = forward_chunk(X, v, d, t0, T, threshold, v_reset, RESET, True, STORE_H,
                                         reached, grad_floor, TRACK)
        store_outputs(s_ptr, h_ptr, t0, offs, k, n_mask, T, N, S, H, EVEN_N, STORE_H)
        if BITS:
            store_bits(bits_ptr, S, t0 + k, T, N)
        X = X_next
    if STORE_VT:
        tl.store(vT_ptr + n, v, mask=n_mask)
    if TRACK:
        tl.store(ckpt_ptr + tl.cast(tl.cdiv(T, K), tl.int64) * N + n, reached, mask=n_mask)


@triton.jit
def two_walk_backward(
    gs_ptr, x_ptr, ckpt_ptr, gvT_ptr, gx_ptr, gv0_ptr, gd_ptr, decay_ptr, gh_ptr, thr_ptr, gthr_ptr, keep_ptr,
    decay, threshold, v_reset, alpha, grad_floor, T, N, inner, C, KEEP_N,
    RESET: tl.constexpr, DETACH: tl.constexpr, SURROGATE: tl.constexpr, CUSTOM_FN: tl.constexpr,
    DECAY: tl.constexpr, THRESHOLD: tl.constexpr, HAS_GVT: tl.constexpr, NEED_GV0: tl.constexpr,
    NEED_GD: tl.constexpr, HAS_GH: tl.constexpr, NEED_GTHR: tl.constexpr, KEEP: tl.constexpr, BLOCK: tl.constexpr,
    K: tl.constexpr, EVEN_N: tl.constexpr,
):
    """spikefuse.ops.lif._lif_backward_kernel up to b7f16d4: the partial chunk, then the full
    ones, in two unrolled copies of backward_chunk."""
    decay, threshold, v_reset, alpha = f32(decay), f32(threshold), f32(v_reset), f32(alpha)
    grad_floor = f32(grad_floor)
    n = program_neurons(BLOCK)
    n_mask = n < N
    d = load_per_neuron(decay_ptr, decay, n, n_mask, inner, C, DECAY)
    threshold = load_per_neuron(thr_ptr, threshold, n, n_mask, inner, C, THRESHOLD)
    if HAS_GVT:  # dL/dv[T-1] when the final state was used downstream
        gv = tl.load(gvT_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros([BLOCK], tl.float32)
    gd = tl.zeros([BLOCK], tl.float32)
    gthr = tl.zeros([BLOCK], tl.float32)
    gp = gthr  # dL/dh[t+1]: none after the last step
    keep = gthr
    if KEEP:
        keep = tl.load(keep_ptr + n % KEEP_N, mask=n_mask, other=0.0)
    k = tl.arange(0, K)
    offs = k[:, None] * N + n[None, :]
    full = T // K
    last = tl.cdiv(T, K) - 1
    X = load_chunk(x_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GS = load_chunk(gs_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    GH = GS  # stands in (unread) unless HAS_GH
    if HAS_GH:
        GH = load_chunk(gh_ptr, last * K, offs, k, n_mask, T, N, EVEN_N)
    v = tl.load(ckpt_ptr + tl.cast(last, tl.int64) * N + n, mask=n_mask, other=0.0)
    if full * K < T:  # the partial chunk first
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, (last - 1) * K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + tl.cast(tl.maximum(last - 1, 0), tl.int64) * N + n, mask=n_mask, other=0.0)
        GX, gv, gp, gd, gthr = backward_chunk(X, GS, v, gv, gp, gd, gthr, d, last * K, T, threshold, v_reset, alpha,
                                              grad_floor, keep, RESET, DETACH, SURROGATE, CUSTOM_FN, NEED_GD, True,
                                              GH, HAS_GH, NEED_GTHR, KEEP)
        store_chunk(gx_ptr, last * K, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v = X_prev, GS_prev, GH_prev, v_prev
    for i in range(0, full):
        c = full - 1 - i
        t0 = c * K
        # prefetch the chunk before (nothing is read when c == 0)
        X_prev, GS_prev, GH_prev = load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0 - K, offs, n_mask, N, EVEN_N,
                                                           HAS_GH)
        v_prev = tl.load(ckpt_ptr + tl.cast(tl.maximum(c - 1, 0), tl.int64) * N + n, mask=n_mask, other=0.0)
        GX, gv, gp, gd, gthr = backward_chunk(X, GS, v, gv, gp, gd, gthr, d, t0, T, threshold, v_reset, alpha,
                                              grad_floor, keep, RESET, DETACH, SURROGATE, CUSTOM_FN, NEED_GD, False,
                                              GH, HAS_GH, NEED_GTHR, KEEP)
        store_chunk(gx_ptr, t0, offs, k, n_mask, T, N, GX, EVEN_N)
        X, GS, GH, v = X_prev, GS_prev, GH_prev, v_prev
    if RESET == 3 and not DETACH:  # s[-1] = H(v0 - threshold) (v: the first checkpoint) resets step 0
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


# each kernel with one walk and with two: the library's (forward two, backward one) and the others
KERNELS = {"one walk": {"forward": cached_launch(one_walk_forward), "backward": lif._lif_backward_kernel},
           "two walks": {"forward": lif._lif_forward_kernel, "backward": cached_launch(two_walk_backward)}}
NAMES = {"one walk": ("one_walk_forward", "_lif_backward_kernel"),
         "two walks": ("_lif_forward_kernel", "two_walk_backward")}


def use(which: str) -> None:
    """Make the library launch the forward and backward kernel that walk `which` ("library":
    its own pair)."""
    if which == "library":
        which = {"forward": "two walks", "backward": "one walk"}
    else:
        which = {"forward": which, "backward": which}
    lif._lif_forward_kernel = KERNELS[which["forward"]]["forward"]
    lif._lif_backward_kernel = KERNELS[which["backward"]]["backward"]


def use_library() -> None:
    use("library")


def compile_once(which: str, kind: str, K: int, busy: float | None = None) -> None:
    """Compile one kernel for sm_90 and print a table row with the seconds; with `busy`, in a
    thread beside a Python loop at that GIL switch interval (s)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = KERNELS[which][kind].kernel
    if kind == "backward":
        pointers = ("gs_ptr", "x_ptr", "ckpt_ptr", "gvT_ptr", "gx_ptr", "gv0_ptr", "gd_ptr", "decay_ptr", "gh_ptr",
                    "thr_ptr", "gthr_ptr", "keep_ptr")
        floats, ints = ("decay", "threshold", "v_reset", "alpha", "grad_floor"), ("T", "N", "inner", "C", "KEEP_N")
        constants = dict(RESET=0, DETACH=True, SURROGATE=2, CUSTOM_FN=None, DECAY=0, THRESHOLD=0, HAS_GVT=False,
                         NEED_GV0=False, NEED_GD=False, HAS_GH=False, NEED_GTHR=False, KEEP=False)
    else:
        pointers = ("x_ptr", "s_ptr", "ckpt_ptr", "v0_ptr", "vT_ptr", "decay_ptr", "h_ptr", "thr_ptr", "bits_ptr")
        floats, ints = ("decay", "threshold", "v_reset", "grad_floor"), ("T", "N", "inner", "C")
        constants = dict(RESET=0, DECAY=0, THRESHOLD=0, HAS_V0=False, SAVE_CKPT=True, STORE_VT=False, STORE_H=False,
                         TRACK=False, BITS=True)
    constants.update(BLOCK=64, K=K, EVEN_N=True)
    signature = {**{p: "*u8" if p == "bits_ptr" else "*fp32" for p in pointers}, **{f: "fp32" for f in floats},
                 **{i: "i32" for i in ints}}
    signature.update({name: "constexpr" for name in constants})
    source = ASTSource(kernel, signature, constexprs={(list(signature).index(n),): v for n, v in constants.items()},
                       attrs={})
    compiled, seconds = [], []

    def run():
        start = time.perf_counter()
        compiled.append(triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                       options={"num_warps": 1, "enable_fp_fusion": False}))
        seconds.append(time.perf_counter() - start)
    if busy is None:
        run()
        return print(f"| {which} | {kind} | {K} | {seconds[0]:.2f} | {len(compiled[0].asm['ptx'])} |", flush=True)
    # as under background compiles: the compile in a thread, this thread busy in Python meanwhile
    sys.setswitchinterval(busy)
    thread, loops, start = threading.Thread(target=run), 0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        loops += 1
    rate = loops / (time.perf_counter() - start)
    print(f"| beside a Python loop, switch interval {busy * 1e3:g} ms | {seconds[0]:.2f} | {rate / 1e6:.2f} |",
          flush=True)


def beside_python() -> None:
    """The library's backward (K 8) compiled alone, then in a thread beside a busy Python loop
    (background compiles beside training) at Python's default GIL switch interval and at the
    library's SWITCH_INTERVAL_S; each in a fresh process with an empty cache."""
    print(f"Triton {triton.__version__}, torch {torch.__version__}, target sm_90, {os.cpu_count()} CPUs\n\n"
          "| compile | s | loop iterations / s (millions) |\n|---|---|---|", flush=True)
    for busy in (None, 0.005, launch.SWITCH_INTERVAL_S):
        with tempfile.TemporaryDirectory() as cache:
            extra = [] if busy is None else ["--busy", str(busy)]
            out = subprocess.run([sys.executable, __file__, "--one", "one walk", "backward", "8", *extra], check=True,
                                 env={**os.environ, "TRITON_CACHE_DIR": cache}, capture_output=True, text=True)
        row = out.stdout.strip().splitlines()[-1]
        print(row if busy else "| alone | " + row.split("|")[4].strip() + " | |", flush=True)


def check() -> None:
    """Spikes and input gradients of F.lif(backend="fused") with each pair of kernels."""
    for T, N, options in ((21, 100, dict(decay=0.8, threshold=0.5)), (16, 64, dict(decay=0.9, threshold=0.3, reset="soft")),
                          (1, 7, dict(decay=0.5)),
                          (37, 33, dict(decay=0.7, threshold=0.4, reset="subtract", detach_reset=False))):
        x = torch.rand(T, N, generator=torch.Generator().manual_seed(T)) * 0.8
        results = []
        for which in KERNELS:
            use(which)
            xg = x.clone().requires_grad_()
            s = F.lif(xg, backend="fused", **options)
            (s * torch.randn(s.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
            results.append((s.detach(), xg.grad))
        use_library()
        (s1, g1), (s2, g2) = results
        print(f"T={T} N={N} {options}: spikes equal {torch.equal(s1, s2)}, dL/dx equal {torch.equal(g1, g2)}")


# (name, T, neurons): the bench runs tasks' hidden LIF layers at their batch (time steps, batch x width)
GPU_SHAPES = (("ipu-shd hidden, B=48", 100, 48 * 1472), ("ipu-shd hidden 2, B=44", 100, 44 * 1470),
              ("shd hidden, B=64", 100, 64 * 256), ("randman hidden, B=64", 20, 64 * 256),
              ("T=1000, 4096", 1000, 4096))


def kernel_us(prof, names) -> float:
    """The profiler's summed GPU time (us) of the kernels whose name contains one of `names`."""
    total = 0.0
    for e in prof.key_averages():
        if any(n in e.key for n in names):
            total += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    return total


def gpu_time(rounds: int = 7, calls: int = 20) -> None:
    """Each pair's forward and backward GPU time per call (the profiler's) at K = 16 and 8,
    median of alternating rounds after a compiling round; float32. Event timing of the whole
    call is launch-bound at these sizes (a 7M-element backward moves ~85 MB, ~30 us at HBM
    speed), so it is kept only as a last column."""
    from torch.profiler import ProfilerActivity, profile

    rules = kernel_base._RULES_BY_DTYPE[torch.float32]
    saved_rules = list(rules)
    variants = [(w, K) for K in (16, 8) for w in KERNELS]
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, torch {torch.__version__}; each kernel's "
          f"GPU time per call (profiler), median of {rounds} rounds x {calls} calls; wall: CUDA events around "
          "the whole forward + autograd call\n\n| shape | T | N | kernels | K | forward us | backward us | "
          "wall us |\n|---|---|---|---|---|---|---|---|", flush=True)
    try:
        for name, T, N in GPU_SHAPES:
            x = (torch.rand(T, N, device="cuda") * 0.3).requires_grad_()
            g = torch.randn(T, N, device="cuda")
            fwd, bwd, wall = ({v: [] for v in variants} for _ in range(3))
            for r in range(rounds + 1):  # round 0 compiles and warms
                for which, K in variants:
                    use(which)
                    rules[:] = [(0, 64, K, 1)]
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        start.record()
                        for _ in range(calls):
                            s = F.lif(x, decay=0.95, threshold=1.0, detach_reset=True, surrogate="fast_sigmoid",
                                      backend="fused")
                            torch.autograd.grad(s, x, g)
                        end.record()
                        torch.cuda.synchronize()
                    if r:
                        fwd[which, K].append(kernel_us(prof, NAMES[which][:1]) / calls)
                        bwd[which, K].append(kernel_us(prof, NAMES[which][1:]) / calls)
                        wall[which, K].append(start.elapsed_time(end) * 1e3 / calls)
            for v in variants:
                med = [sorted(m[v])[len(m[v]) // 2] for m in (fwd, bwd, wall)]
                print(f"| {name} | {T} | {N} | {v[0]} | {v[1]} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} |",
                      flush=True)
    finally:
        use_library()
        rules[:] = saved_rules


MODES = ("speculative", "background", "background-5ms")


def cold(pairs: list[str]) -> None:
    def child(which):  # "<pair> speculative": SPIKEFUSE_SPECULATIVE_COMPILE=1; "<pair> background": fit's
        # background compiles; "<pair> background-5ms": the same at Python's default GIL switch interval
        base, mode = which.rsplit(" ", 1) if which.split(" ")[-1] in MODES else (which, "")
        return [__file__, "--cold-child", base], {"SPIKEFUSE_SPECULATIVE_COMPILE": "1" if mode == "speculative" else "0",
                                                  "COLD_EPOCHS_BACKGROUND": "1" if mode.startswith("background") else "0",
                                                  "COLD_EPOCHS_SWITCH_S": "0.005" if mode == "background-5ms" else ""}
    cold_epochs.table("kernels", pairs, child, lambda name: "lif" in name or "walk" in name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the kernels through the interpreter")
    parser.add_argument("--gpu-time", action="store_true", help="time the kernels on a GPU")
    pairs = ["library", *KERNELS]
    parser.add_argument("--cold", nargs="*", choices=pairs + [f"{p} {m}" for p in pairs for m in MODES], metavar="PAIR",
                        help="ipu-shd's first epochs from an empty cache, on a GPU, with these pairs of kernels "
                             "('... speculative': with SPIKEFUSE_SPECULATIVE_COMPILE=1; '... background': with "
                             "fit's background compiles; '... background-5ms': the same at Python's default GIL "
                             "switch interval; default: two walks, one walk)")
    parser.add_argument("--cold-child", choices=["library", *KERNELS], help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, nargs="+", default=[16, 8], metavar="K",
                        help="chunk lengths whose compile times the default mode prints (default: 16 8)")
    parser.add_argument("--beside-python", action="store_true",
                        help="a compile alone and beside a busy Python thread (no GPU needed)")
    parser.add_argument("--one", nargs=3, metavar=("KERNELS", "KIND", "K"), help=argparse.SUPPRESS)  # a child's compile
    parser.add_argument("--busy", type=float, help=argparse.SUPPRESS)  # ... beside a Python loop at this interval
    args = parser.parse_args()
    if args.check:
        return check()
    if args.gpu_time:
        return gpu_time()
    if args.cold is not None:
        return cold(args.cold or ["two walks", "one walk"])
    if args.cold_child:
        use(args.cold_child)
        return print(json.dumps({"kernels": args.cold_child, **cold_epochs.first_two_epochs()}))
    if args.beside_python:
        return beside_python()
    if args.one:
        return compile_once(args.one[0], args.one[1], int(args.one[2]), args.busy)
    print(f"Triton {triton.__version__}, torch {torch.__version__}, target sm_90, one fresh process and empty cache "
          "per compile\n\n| kernels | kind | K | compile s | PTX chars |\n|---|---|---|---|---|", flush=True)
    for kind in ("forward", "backward"):
        for K in args.k:
            for which in KERNELS:
                with tempfile.TemporaryDirectory() as cache:
                    subprocess.run([sys.executable, __file__, "--one", which, kind, str(K)], check=True,
                                   env={**os.environ, "TRITON_CACHE_DIR": cache})


if __name__ == "__main__":
    main()
