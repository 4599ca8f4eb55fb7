"""Produces benchmarks/results/conv-precision-<gpu>.json (argv[1]; on a GPU).

How much of the CIFAR-medium step's convolution time lower-precision inputs would save.

For every Conv2d of the medium network (T=10, B=64, channels-last), times cuDNN's
forward, input gradient and weight gradient with float32 inputs (TF32 math, as in the
fp32 step) and with float16 inputs (fp32 accumulation; the same 10-bit mantissa as TF32,
and spikes are exact), back to back. Prints per layer and totals; JSON to argv[1].
"""
import json
import sys

import torch

from spikefuse.bench.timing import median_ms
from spikefuse.bench.train import build


def conv_shapes(T=10, B=64, device="cuda"):
    """(conv, input shape [T*B, C, H, W]) per Conv2d, from the vanilla form's per-step calls."""
    model = build("spikefuse-vanilla", "medium", 1.0, T, "auto").to(device)
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o: [seen.setdefault(m, (T * i[0].shape[0], *i[0].shape[1:]))] and None)
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(torch.randn(B, 3, 32, 32, device=device))
    for h in hooks:
        h.remove()
    return list(seen.items())


def main(out_path):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    rows = []
    for conv, shape in conv_shapes():
        row = {"in": shape, "out_channels": conv.out_channels}
        for name, dtype in (("tf32", torch.float32), ("fp16", torch.float16)):
            x = (torch.rand(shape, device="cuda") < 0.2).to(dtype).contiguous(memory_format=torch.channels_last)
            w = conv.weight.detach().to(dtype).contiguous(memory_format=torch.channels_last)
            y = torch.nn.functional.conv2d(x, w, None, conv.stride, conv.padding)
            gy = torch.randn_like(y)
            args = (None, list(conv.stride), list(conv.padding), [1, 1], False, [0, 0], 1)
            row[name] = {
                "fwd": median_ms(lambda: torch.nn.functional.conv2d(x, w, None, conv.stride, conv.padding),
                                 budget_s=0.2, back_to_back=5)[0],
                "dgrad": median_ms(lambda: torch.ops.aten.convolution_backward(gy, x, w, *args, [True, False, False]),
                                   budget_s=0.2, back_to_back=5)[0],
                "wgrad": median_ms(lambda: torch.ops.aten.convolution_backward(gy, x, w, *args, [False, True, False]),
                                   budget_s=0.2, back_to_back=5)[0]}
        print(shape, conv.out_channels, {k: {p: round(v, 3) for p, v in row[k].items()} for k in ("tf32", "fp16")},
              flush=True)
        rows.append(row)
    totals = {p: {k: sum(r[p][k] for r in rows) for k in ("fwd", "dgrad", "wgrad")} for p in ("tf32", "fp16")}
    print("totals ms:", {p: {k: round(v, 3) for k, v in t.items()} | {"sum": round(sum(t.values()), 3)}
                         for p, t in totals.items()})
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "totals_ms": totals}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
