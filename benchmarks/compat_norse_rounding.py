"""Produces benchmarks/results/compat-norse-rounding-cpu.json (argv[1]; on the CPU).

How often spikefuse.compat.norse's LIFBox and LIF spikes differ from Norse 1.1.0's where they
run folded on the fused kernels (h = (1 - a) v + a (x + v_leak), a = dt * tau_mem_inv; LIF on
spikefuse's CUBA with the current scaled by a), another order of float32 operations than
Norse's v + a ((x + v_leak) - v). Norse's cells (LIFBoxCell, LIFCell) step T=100 steps of
100,000 neurons (10 million neuron-steps) per setting, over Norse's default parameters and
others (leak, threshold, reset, dt, time constants); the compat module's folded sequence runs
the same arithmetic as the fused kernels (which run without FMA contraction) on the PyTorch
reference, so this needs no GPU. A spike can differ only where v lies within rounding of v_th;
after such a step that neuron's later spikes may differ too: both are counted ("differing"
neuron-steps, and "neurons" with any difference). The per-step cells and the PyTorch path
compute Norse's operations and are exact (tests/test_compat_norse.py).
"""
import json
import sys

import norse
import norse.torch as peer
import torch

from spikefuse.compat import norse as compat

T, N = 100, 100_000
t = torch.tensor
BOX = [  # (label, parameters, dt, input mean, input std)
    ("defaults", {}, 1e-3, 1.2, 1.0),
    ("defaults, strong input", {}, 1e-3, 2.0, 2.0),
    ("tau_mem_inv 1/3.7ms", dict(tau_mem_inv=t(1 / 3.7e-3)), 1e-3, 1.2, 1.0),
    ("leak -0.3, v_th 0.75, v_reset -0.1", dict(v_leak=t(-0.3), v_th=t(0.75), v_reset=t(-0.1)), 1e-3, 1.3, 1.0),
    ("dt 5ms, tau_mem_inv 50", dict(tau_mem_inv=t(50.0)), 5e-3, 1.2, 1.0),
    ("dt 0.1ms", {}, 1e-4, 3.0, 3.0),
    ("v_th 0.3, float tau 77", dict(tau_mem_inv=77.0, v_th=t(0.3)), 1e-3, 0.5, 0.5),
    ("mV: leak -65, v_th -50, reset -65", dict(tau_mem_inv=t(50.0), v_leak=t(-65.0), v_th=t(-50.0),
                                               v_reset=t(-65.0)), 1e-3, 20.0, 10.0),
]
LIF = [
    ("defaults", {}, 1e-3, 0.3, 1.0),
    ("defaults, strong input", {}, 1e-3, 0.6, 2.0),
    ("tau_syn_inv 1/dt", dict(tau_syn_inv=t(1e3)), 1e-3, 1.2, 1.0),
    ("leak -0.3, v_th 0.75, v_reset -0.1", dict(v_leak=t(-0.3), v_th=t(0.75), v_reset=t(-0.1)), 1e-3, 0.4, 1.0),
    ("dt 2ms, tau_syn_inv 100, tau_mem_inv 50", dict(tau_syn_inv=t(100.0), tau_mem_inv=t(50.0)), 2e-3, 0.4, 1.0),
    ("tau_syn_inv 500", dict(tau_syn_inv=t(500.0)), 1e-3, 0.6, 1.0),
    ("v_th 0.3", dict(v_th=t(0.3)), 1e-3, 0.15, 0.5),
    ("mV: leak -65, v_th -50, reset -65", dict(tau_mem_inv=t(50.0), v_leak=t(-65.0), v_th=t(-50.0),
                                               v_reset=t(-65.0)), 1e-3, 5.0, 3.0),
]


def norse_steps(cell, x):
    state, zs = None, []
    for step in x:
        z, state = cell(step, state)
        zs.append(z)
    return torch.stack(zs), state


def measure(kind, label, fields, dt, mean, std):
    x = torch.randn(T, N) * std + mean
    if kind == "LIFBox":
        theirs_cell, mine = peer.LIFBoxCell(peer.LIFBoxParameters(**fields), dt=dt), compat.LIFBox(
            compat.LIFBoxParameters(**fields), dt, backend="reference")
    else:
        theirs_cell, mine = peer.LIFCell(peer.LIFParameters(**fields), dt=dt), compat.LIF(
            compat.LIFParameters(**fields), dt=dt, backend="reference")
    with torch.no_grad():
        theirs, their_state = norse_steps(theirs_cell, x)
        ours, our_state = mine._sequence(x, mine._initial(x.shape[1:], x), False)  # the fused path's arithmetic
    differ = theirs != ours
    agree = ~differ.any(0)
    row = dict(neuron=kind, setting=label, dt=dt, input=f"randn * {std} + {mean}", neuron_steps=T * N,
               spike_rate=round(theirs.mean().item(), 4), differing=int(differ.sum()), neurons=int((~agree).sum()),
               max_v_difference=(their_state.v - our_state.v)[agree].abs().max().item())
    if kind == "LIF":
        row["max_i_difference"] = (their_state.i - our_state.i)[agree].abs().max().item()
    return row


def main(out):
    torch.manual_seed(0)
    rows = []
    for kind, settings in (("LIFBox", BOX), ("LIF", LIF)):
        for setting in settings:
            rows.append(measure(kind, *setting))
            print(rows[-1], flush=True)
    total = {kind: dict(settings=sum(r["neuron"] == kind for r in rows),
                        neuron_steps=sum(r["neuron_steps"] for r in rows if r["neuron"] == kind),
                        differing=sum(r["differing"] for r in rows if r["neuron"] == kind),
                        neurons=sum(r["neurons"] for r in rows if r["neuron"] == kind)) for kind in ("LIFBox", "LIF")}
    print(total)
    with open(out, "w") as f:
        json.dump(dict(torch=torch.__version__, norse=norse.__version__, device="cpu", total=total, rows=rows), f,
                  indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/compat-norse-rounding-cpu.json")
