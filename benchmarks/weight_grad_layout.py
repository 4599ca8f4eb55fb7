"""Produces benchmarks/results/s25-2026-11-28/weight-grad-layout-products-<gpu>.txt (stdout; on a GPU).

The weight gradient of a Linear over spikes, gy^T @ s, sums over the rows M (time x batch),
which neither gy [M, OUT] nor s [M, IN] holds contiguously. Hopper's TF32 instructions read
32-bit operands only along the sum, so this times the product with each operand laid out
either way (CUDA events per call, medians; each figure includes the call's launch), in bf16,
TF32 and strict fp32, and the two unpack kernels that give s or s^T from the saved bits.

    python benchmarks/weight_grad_layout.py
"""
import torch

from spikefuse.ops.spike_pack import pack, unpack, unpack_transposed

SHAPES = [(2048, 2048, 2048), (16384, 2048, 2048), (4800, 1472, 1472), (4800, 1472, 700), (800, 1472, 1472)]


def median_us(fn, reps=30):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main():
    for dtype, tf32 in ((torch.float32, True), (torch.float32, False), (torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        name = {torch.bfloat16: "bf16"}.get(dtype, "tf32" if tf32 else "fp32-strict")
        for M, OUT, IN in SHAPES:
            gy = torch.randn(M, OUT, device="cuda", dtype=dtype)
            s = (torch.rand(M, IN, device="cuda") < 0.1).to(dtype)
            gyT, sT = gy.t().contiguous(), s.t().contiguous()
            cases = {"gy^T @ s (as saved)": lambda: gy.t() @ s, "with s^T contiguous": lambda: gy.t() @ sT.t(),
                     "with gy^T contiguous": lambda: gyT @ s, "both": lambda: gyT @ sT.t()}
            print(f"{name:11s} M={M:5d} OUT={OUT} IN={IN}: "
                  + "  ".join(f"{k} {median_us(f):7.1f} us" for k, f in cases.items()), flush=True)
    for M, IN in ((2048, 2048), (16384, 2048), (4800, 1472), (4800, 700), (77, 1470)):
        s = (torch.rand(M, IN, device="cuda") < 0.1).float()
        bits = pack(s)
        assert torch.equal(unpack_transposed(bits, M, IN), s.t())
        print(f"unpack M={M} IN={IN}: s {median_us(lambda: unpack(bits, (M, IN))):6.1f} us, "
              f"s^T {median_us(lambda: unpack_transposed(bits, M, IN)):6.1f} us", flush=True)


if __name__ == "__main__":
    main()
