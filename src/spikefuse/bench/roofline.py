"""The floor of a whole training step, one definition for `bench train` and `bench steps`:

    FLOOR_BYTES per neuron-step (every neuron layer's output elements) / copy bandwidth
  + the step's conv/linear FLOPs (torch's FlopCounterMode) / a matmul rate

both rates measured in the same run (a single stream runs the elementwise and the matmul
kernels one after the other, so the two add). The optimizer's update is not in it.
"""
from __future__ import annotations

import torch

from ..nn.bn_lif import BNLIF
from ..nn.neuron_base import RecordsPotential
from .timing import copy_bandwidth_gbs, median_ms

FLOOR_BYTES = {"fp32": 30, "bf16": 15}  # per neuron-step: ~7.5 accesses in the dtype


def neuron_steps(model, *inputs) -> int:
    """Neuron-steps of one forward: the output elements of every neuron module (the LIF
    family, ALIF, CUBA, the recurrent neurons, BN+LIF), each counted once."""
    counts = []

    def count(module, args, output):
        counts.append((output[0] if isinstance(output, tuple) else output).numel())
    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (RecordsPotential, BNLIF))]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return sum(counts)


def step_flops(step) -> int | None:
    """FLOPs of one call of step() as torch counts them (convolutions and matmuls); None
    when counting fails (printed: a counting failure must not lose a timing)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
        with FlopCounterMode(display=False) as counter:
            step()
        return counter.get_total_flops()
    except Exception as e:  # noqa: BLE001
        print(f"  flop counting failed: {e!r}", flush=True)
        return None


def matmul_tflops(device, precision: str, n: int) -> float:
    """The rate of an n x n x n matmul in the precision's dtype (fp32: as the caller's TF32
    flags say)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms, _ = median_ms(lambda: a @ b, warmup=2, min_reps=5, max_reps=5)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def copy_gbs(device, smoke: bool) -> float:
    """Device-to-device copy bandwidth (read + written bytes per second), in GB/s."""
    if device.type == "cuda":
        return copy_bandwidth_gbs(2**24 if smoke else 2**31)
    src = torch.rand(2**22)
    dst = torch.empty_like(src)
    ms, _ = median_ms(lambda: dst.copy_(src), warmup=2, min_reps=5, max_reps=5)
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def rates(device, smoke: bool) -> dict:
    """The floor's two rates, measured now: copy_gbs, matmul_tflops per precision."""
    n = 256 if smoke else 8192
    return {"copy_gbs": copy_gbs(device, smoke),
            "matmul_tflops": {p: matmul_tflops(device, p, n) for p in FLOOR_BYTES}}


def floor_ms(precision: str, steps: int, flops: int | None, measured: dict) -> tuple[float, float, float]:
    """(floor, its memory part, its compute part) in ms for `steps` neuron-steps and `flops`."""
    memory = FLOOR_BYTES[precision] * steps / (measured["copy_gbs"] * 1e9) * 1e3
    compute = flops / (measured["matmul_tflops"][precision] * 1e12) * 1e3 if flops else 0.0
    return memory + compute, memory, compute
