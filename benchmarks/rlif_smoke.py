"""Quick GPU check of the fused recurrent LIF: fwd+bwd time at T=100, B=32, N=1024 against
SpikingJelly's LinearRecurrentContainer(LIFNode) and the PyTorch loop (spikes cross-checked).
    python3 benchmarks/rlif_smoke.py"""
import torch
import spikefuse.functional as F
from spikefuse import reference
from spikefuse.bench.timing import median_ms

torch.manual_seed(0)
dev = "cuda"
T, B, N = 100, 32, 1024
x = (torch.randn(T, B, N, device=dev) * 0.5 + 0.3)
w = torch.randn(N, N, device=dev) / N ** 0.5 * 0.5
g = torch.randn(T, B, N, device=dev)


def step(fn):
    xi = x.clone().requires_grad_(True)
    wi = w.clone().requires_grad_(True)
    s = fn(xi, wi)
    (s * g).sum().backward()
    return s, xi.grad, wi.grad


fused = lambda xi, wi: F.rlif(xi, wi, backend="fused")
loop = lambda xi, wi: reference.rlif(xi, wi)
runs = {"fused": fused, "pytorch-loop": loop}
try:
    from spikingjelly.activation_based import layer, neuron, functional as sjf
    node = neuron.LIFNode(tau=2.0, decay_input=False, v_threshold=1.0, v_reset=0.0)
    rc = layer.LinearRecurrentContainer(node, in_features=N, out_features=N, bias=False).to(dev)

    def sj(xi, wi):
        with torch.no_grad():
            rc.rc.weight.copy_(torch.cat([torch.eye(N, device=dev), w], 1))
        sjf.reset_net(rc)
        out = []
        for t in range(T):
            out.append(rc(xi[t]))
        return torch.stack(out)
    runs["spikingjelly"] = sj
except ImportError as e:
    print("no spikingjelly:", e)

ref = step(fused)
print(torch.cuda.get_device_name(), "spike rate", ref[0].mean().item())
for name, fn in runs.items():
    s, gx, gw = step(fn)
    mism = (s != ref[0]).float().mean().item()
    gxe = ((gx - ref[1]).norm() / ref[1].norm()).item()
    ms, _ = median_ms(lambda: step(fn), warmup=2, max_reps=20, budget_s=3)
    print(f"{name:14s} fwd+bwd {ms:8.3f} ms  spike mismatch {mism:.2e}  grad x rel err {gxe:.2e}")
