"""Produces benchmarks/results/kernel-variants-<gpu>.md (stdout; on a GPU).

Issue 38: a cold Triton cache made ipu-shd's first epoch ~20 s, 8 LIF compiles of 1.4-4.6 s.
The census (launch_config, BLOCK 64): the second hidden layer's 1470 x 48 neurons are not a
multiple of BLOCK (EVEN_N False where the first layer's 1472 x 48 are: two variants), and the
last training batch's 1470 x 44 is not a multiple of 16 (Triton specializes integers on that:
a third). Three modes of the same LIF kernels: "library" (EVEN_N always False, since this
benchmark's second run), "even" (EVEN_N = N % BLOCK == 0, the library before it) and "coarse"
(EVEN_N False and Triton's integer specialization off: do_not_specialize on T, N, inner, C, so
one variant serves every size).

    python benchmarks/kernel_variants.py                    # every mode: cold epochs, kernel times
    TRITON_INTERPRET=1 python benchmarks/kernel_variants.py --check   # same spikes and gradients

Cold epochs: each mode in a fresh process with an empty TRITON_CACHE_DIR, Trainer.fit's first
and second epoch (captured, fp32, background_compile=False) on shd-synthetic:ipu-shd at batch
48, every compile timed. Kernel times: the profiler's GPU time of the forward and backward
kernel per call, at the three hidden-layer sizes, median of alternating rounds. Runs so far
(kernel-variants-*.md): coarse's forward is 8 us slower at 70560 neurons, where N is a multiple
of 16, and equal at 64680, where it is not (the specialization costs it, not EVEN_N); EVEN_N
off alone held the GPU time (H200: forward 18.5 against 21.0 us, backward equal) with 5
compiles instead of 8, so the library took it.
"""
import argparse
import json

import torch

import cold_epochs
from spikefuse import functional as F
from spikefuse.ops import lif
from spikefuse.ops.launch import CachedLaunch
from spikefuse.ops.triton_or_stub import triton

LIBRARY = {"forward": lif._lif_forward_kernel, "backward": lif._lif_backward_kernel}
INTEGERS = ["T", "N", "inner", "C"]
SIZES = (("hidden 1, B=48", 48 * 1472), ("hidden 2, B=48", 48 * 1470), ("hidden 2, B=44", 44 * 1470))


class Variant(CachedLaunch):
    """A LIF kernel launched with EVEN_N = N % BLOCK == 0 (`even`), or with EVEN_N False and
    without Triton's integer specialization."""

    def __init__(self, library: CachedLaunch, even: bool):
        self.even = even
        super().__init__(library.kernel if even else triton.jit(do_not_specialize=INTEGERS)(library.kernel.fn))

    def _launch(self, grid, args, meta):
        N, BLOCK = args[self._names.index("N")], meta["BLOCK"]
        return super()._launch(grid, args, {**meta, "EVEN_N": self.even and N % BLOCK == 0})


MODES = {"library": LIBRARY,
         "even": {name: Variant(kernel, even=True) for name, kernel in LIBRARY.items()},
         "coarse": {name: Variant(kernel, even=False) for name, kernel in LIBRARY.items()}}


def use(mode: str) -> None:
    lif._lif_forward_kernel, lif._lif_backward_kernel = MODES[mode]["forward"], MODES[mode]["backward"]


def lif_call(x, g):
    s = F.lif(x, decay=0.95, threshold=1.0, detach_reset=True, surrogate="fast_sigmoid", backend="fused")
    return s, torch.autograd.grad(s, x, g)[0]


def check() -> None:
    """Spikes and dL/dx of both modes, through the interpreter, at EVEN and ragged sizes."""
    for T, N in ((21, 128), (16, 100), (1, 7), (37, 64 * 3 + 5)):
        gen = torch.Generator().manual_seed(T + N)
        x = (torch.rand(T, N, generator=gen) * 0.3).requires_grad_()
        g = torch.randn(T, N, generator=gen)
        results = []
        for mode in MODES:
            use(mode)
            results.append(lif_call(x, g))
        use("library")
        (s1, g1), *others = results
        print(f"T={T} N={N}: spikes equal {all(torch.equal(s1, s) for s, _ in others)}, "
              f"dL/dx equal {all(torch.equal(g1, g) for _, g in others)}")


def kernel_times(rounds: int = 7, calls: int = 20) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile
    rows = []
    for name, N in SIZES:
        x = (torch.rand(100, N, device="cuda") * 0.3).requires_grad_()
        g = torch.randn(100, N, device="cuda")
        times = {(m, k): [] for m in MODES for k in ("forward", "backward")}
        for r in range(rounds + 1):  # round 0 compiles
            for mode in MODES:
                use(mode)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(calls):
                        lif_call(x, g)
                    torch.cuda.synchronize()
                if r:
                    for kind, kernel in (("forward", "_lif_forward_kernel"), ("backward", "_lif_backward_kernel")):
                        us = sum(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
                                 for e in prof.key_averages() if kernel in e.key)
                        times[mode, kind].append(us / calls)
        use("library")
        med = {key: sorted(v)[len(v) // 2] for key, v in times.items()}
        rows.append({"size": name, "N": N, **{f"{m}_{k}_us": round(v, 2) for (m, k), v in med.items()}})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare the modes through the interpreter")
    parser.add_argument("--cold", choices=list(MODES), help=argparse.SUPPRESS)  # a child's cold epochs
    args = parser.parse_args()
    if args.check:
        return check()
    if args.cold:
        use(args.cold)
        return print(json.dumps({"mode": args.cold, **cold_epochs.first_two_epochs()}))
    cold_epochs.table("mode", list(MODES), lambda mode: ([__file__, "--cold", mode], {}),
                      lambda name: name.startswith("_lif"))
    columns = [f"{kind} {mode} us" for kind in ("forward", "backward") for mode in MODES]
    print("\n## Kernel GPU time per call (profiler), T=100, median of 7 alternating rounds\n\n| size | N | "
          + " | ".join(columns) + " |\n|---|---|" + "---|" * len(columns))
    for row in kernel_times():
        cells = [str(row[f"{mode}_{kind}_us"]) for kind in ("forward", "backward") for mode in MODES]
        print(f"| {row['size']} | {row['N']} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
