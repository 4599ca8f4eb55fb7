"""Produces benchmarks/results/check-bn-lif-gpu-<gpu>.jsonl (stdout; on a GPU).

Fused BN+LIF gradients on a GPU against a float64 reference.

The CPU tests compare the fused kernels (Triton interpreter) with the float32 reference at
1e-5. On a GPU the float32 reference itself sums in another order, so here both float32
forms are measured against the reference run in float64: per gradient, the largest error
relative to the gradient's largest magnitude (the tests' tolerance scale), for the test
suite's conv-shaped cases in training and eval mode. One JSON line per case to stdout.
"""
import copy
import json

import torch

from spikefuse.nn import BNLIF

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [("hard", "rectangular", False), ("hard", "atan", True), ("soft", "triangle", False),
         ("soft", "sigmoid", True), ("none", "fast_sigmoid", False)]


def grads(module, x, g):
    x = x.detach().clone().requires_grad_(True)
    spikes = module(x)
    (spikes.to(g.dtype) * g).sum().backward()
    out = {"x": x.grad}
    out.update({name: p.grad for name, p in module.named_parameters()})
    return spikes, out


def main():
    rows = []
    for training in (True, False):
        for reset, surrogate, detach in CASES:
            torch.manual_seed(0)
            fused = BNLIF(5, decay=0.6, threshold=0.4, reset=reset, v_reset=-0.1, detach_reset=detach,
                          surrogate=surrogate, backend="fused").to(DEVICE)
            with torch.no_grad():
                fused.weight.uniform_(0.5, 1.5), fused.bias.uniform_(-0.3, 0.3)
                fused.running_mean.uniform_(-0.3, 0.3), fused.running_var.uniform_(0.5, 2.0)
            ref32 = copy.deepcopy(fused)
            ref32.backend = "reference"
            ref64 = copy.deepcopy(ref32).double()
            for m in (fused, ref32, ref64):
                m.train(training)
            x = torch.randn(11, 3, 5, 3, 2, device=DEVICE) + 0.2
            g = torch.randn(x.shape, device=DEVICE)
            s64, g64 = grads(ref64, x.double(), g.double())
            row = {"training": training, "reset": reset, "surrogate": surrogate, "detach": detach}
            for name, module in (("fused", fused), ("reference_fp32", ref32)):
                s, gr = grads(module, x, g)
                row[name] = {"spikes_equal_fp64": bool(torch.equal(s.double(), s64)),
                             **{k: ((v.double() - g64[k]).abs().max() / g64[k].abs().max()).item()
                                for k, v in gr.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
