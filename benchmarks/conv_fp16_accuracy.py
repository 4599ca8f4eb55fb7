"""Produces benchmarks/results/conv-fp16-accuracy-<gpu>.json (argv[1]; on a GPU).

Could the fp32 step run its spike-input convolutions on fp16 tensor cores (issue 13, item 4)?

One fp32 training step of CIFAR-medium (T=10, B=64) records, for every spike-input conv, its
spikes s, weight W and output gradient gy. For each, the forward, the weight gradient and
the input gradient are computed three ways and compared with float64:
  tf32: float32 tensors, cuDNN TF32 math (what the fp32 step does today);
  fp16: s exact in fp16; W scaled per output channel by a power of two into fp16's range,
        gy scaled likewise (per output channel for the weight gradient, per tensor for the
        input gradient); results unscaled in float32. Accumulation is fp32 in both; fp16
        also rounds each result to 11 significant bits, TF32 does not.
Errors: ||r - r64|| / ||r64|| (relative Frobenius) and max |r - r64| / max |r64|.
Times: CUDA events, medians, the fp16 path with its casts and scalings. JSON to argv[1].
"""
import json
import sys
from datetime import datetime, timezone

import torch
import torch.nn.functional as F

import spikefuse.nn.spiking_layers as layers
from spikefuse.bench.timing import median_ms
from spikefuse.models import build_model


def record_step(T=10, B=64):
    """[(s, W, gy, stride, padding)] of the spike-input convs of one fp32 training step."""
    torch.manual_seed(0)
    model = build_model("cifar-medium", (3, 32, 32), 10, T).cuda()
    seen, original = [], layers.spike_conv2d

    def recording(x, weight, bias, stride, padding, dilation, groups, bits=None):
        y = original(x, weight, bias, stride, padding, dilation, groups, bits)
        entry = [x.detach().clone(), weight.detach().clone(), None, tuple(stride), tuple(padding)]
        seen.append(entry)
        y.register_hook(lambda g: entry.__setitem__(2, g.detach().clone()))
        return y
    layers.spike_conv2d = recording
    try:
        x = torch.rand(B, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (B,), device="cuda")
        F.cross_entropy(model(x), y).backward()
    finally:
        layers.spike_conv2d = original
    return seen


def pow2_scale(t, dims, target):
    """Per-slice powers of two (over `dims` kept) bringing max |t| near `target`."""
    m = t.abs().amax(dim=dims, keepdim=True).float().clamp_min(1e-30)
    return torch.exp2(torch.floor(torch.log2(target / m)))


def ops(s, W, gy, stride, padding, how):
    """(forward, weight gradient, input gradient) of conv2d(s, W), float32 results."""
    conv = dict(stride=stride, padding=padding)
    if how == "fp64":
        s, W, gy = s.double(), W.double(), gy.double()
    if how in ("fp64", "tf32"):
        out = F.conv2d(s, W, **conv)
        gs, gw, _ = torch.ops.aten.convolution_backward(gy, s, W, None, list(stride), list(padding), [1, 1],
                                                        False, [0, 0], 1, [True, True, False])
        return out, gw, gs
    # fp16: W per output channel (max |W| -> 2^8), gy per output channel for the weight
    # gradient (its sum over N*H*W must stay under 65504) and per tensor for the input gradient
    w_scale = pow2_scale(W, (1, 2, 3), 2.0 ** 8)
    Wh = (W * w_scale).half()
    sh = s.half()
    out = F.conv2d(sh, Wh, **conv).float() / w_scale.view(1, -1, 1, 1)
    g_sum = gy.abs().sum(dim=(0, 2, 3), keepdim=True).float().clamp_min(1e-30)
    gw_scale = torch.exp2(torch.floor(torch.log2(2.0 ** 14 / g_sum)))
    _, gw, _ = torch.ops.aten.convolution_backward((gy * gw_scale).half(), sh, Wh, None, list(stride),
                                                   list(padding), [1, 1], False, [0, 0], 1, [False, True, False])
    gw = gw.float() / gw_scale.view(-1, 1, 1, 1)
    # the input gradient: one scale for gy, W's per-channel scales folded back into gy first
    gy_w = gy / w_scale.view(1, -1, 1, 1)
    gs_scale = pow2_scale(gy_w, (0, 1, 2, 3), 2.0 ** 4)
    gs, _, _ = torch.ops.aten.convolution_backward((gy_w * gs_scale).half(), sh, Wh, None, list(stride),
                                                   list(padding), [1, 1], False, [0, 0], 1, [True, False, False])
    return out, gw, gs.float() / gs_scale


def errors(r, ref):
    d = (r.double() - ref)
    return {"rel_fro": (d.norm() / ref.norm().clamp_min(1e-300)).item(),
            "rel_max": (d.abs().max() / ref.abs().max().clamp_min(1e-300)).item()}


def main(out_path):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    rows, totals = [], {"tf32": 0.0, "fp16": 0.0}
    for s, W, gy, stride, padding in record_step():
        ref = ops(s, W, gy, stride, padding, "fp64")
        row = {"s": list(s.shape), "W": list(W.shape), "density": s.float().mean().item()}
        for how in ("tf32", "fp16"):
            res = ops(s, W, gy, stride, padding, how)
            row[how] = {name: errors(r, q) for name, r, q in zip(("forward", "wgrad", "dgrad"), res, ref)}
            ms = median_ms(lambda: ops(s, W, gy, stride, padding, how), warmup=5, min_reps=20, back_to_back=5)[0]
            row[how]["ms"] = ms
            totals[how] += ms
        rows.append(row)
        print(row["s"], row["W"], {h: {k: (round(v["rel_fro"], 8), round(v["rel_max"], 8)) if isinstance(v, dict) else round(v, 3)
                                     for k, v in row[h].items()} for h in ("tf32", "fp16")}, flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows,
              "totals_ms (forward + both gradients, fp16 with its casts)": totals}
    print(result["totals_ms (forward + both gradients, fp16 with its casts)"])
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
