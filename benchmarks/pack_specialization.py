"""Kernel GPU time of spike_pack's pack and unpack with n_bytes unspecialized (the library's,
since a last smaller batch otherwise compiles variants of its own) against the same kernels
jitted with Triton's default specialization on n_bytes (divisible by 16 here), at ipu-shd's
input (T=100, B=48, 700 inputs): the profiler's kernel GPU time, mean over 50 calls after warm-up, in 5 alternating rounds
(the median round). On a GPU.

    python benchmarks/pack_specialization.py
"""
import statistics

import torch
import triton

from spikefuse.ops import spike_pack


# the library's kernels compiled again with Triton's default specialization (n_bytes included)
pack_specialized = triton.jit(spike_pack._pack_kernel.kernel.fn)
unpack_specialized = triton.jit(spike_pack._unpack_kernel.kernel.fn)


def kernel_us(fn, name, calls=50):
    """Mean GPU time of the kernels whose name holds `name`, over `calls` calls of fn."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if name in e.key)
    return total / calls


def main():
    s = (torch.rand(100, 48, 700, device="cuda") < 0.05).float()
    n = s.numel()
    n_bytes = (n + 7) // 8
    packed = spike_pack.pack(s)
    out = torch.empty_like(s)
    block = spike_pack.BLOCK
    grid = (triton.cdiv(n_bytes, block),)
    cases = {
        "pack, library": ("_pack_kernel", lambda: spike_pack.pack(s)),
        "pack, specialized": ("_pack_kernel", lambda: pack_specialized[grid](s, packed, n, n_bytes, BLOCK=block)),
        "unpack, library": ("_unpack_kernel", lambda: spike_pack.unpack(packed, s.shape)),
        "unpack, specialized": ("_unpack_kernel",
                                lambda: unpack_specialized[grid](packed, out, n, n_bytes, BLOCK=block)),
    }
    assert torch.equal(spike_pack.unpack(packed, s.shape), s)
    times = {name: [] for name in cases}
    for _ in range(5):
        for name, (kernel, fn) in cases.items():
            times[name].append(kernel_us(fn, kernel))
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}, n = {n} spikes, n_bytes = {n_bytes}\n")
    print("| kernel | us per call (median of 5 rounds) |\n|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.2f} |")


if __name__ == "__main__":
    main()
