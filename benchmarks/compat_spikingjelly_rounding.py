"""Produces benchmarks/results/compat-spikingjelly-rounding-cpu.json (argv[1]; on the CPU).

How often spikefuse.compat.spikingjelly.LIFNode's spikes differ from SpikingJelly 2.0's where
the two orders of float32 operations differ (SpikingJelly: v + (x - (v - v_reset)) / tau or
v - (v - v_reset) / tau + x; spikefuse: (1 - 1/tau) * v + input): random input, T=50 steps of
200,000 neurons (10 million neuron-steps) per setting, over decay_input, the resets, tau and the
threshold, step mode "m". A spike can differ only where h lies within rounding of the threshold;
after such a step that neuron's later spikes may differ too (they are counted).
"""
import json
import sys

import torch
from spikingjelly.activation_based import neuron as sj_neuron

from spikefuse.compat.spikingjelly import neuron

T, N = 50, 200_000


def main(out):
    torch.manual_seed(0)
    rows = []
    for decay_input in (True, False):
        for v_reset in (0.0, None, -0.3):
            for tau in (2.0, 3.7, 10.0):
                for v_threshold in (1.0, 0.75):
                    x = torch.randn(T, N) * 0.8 + 0.4
                    kw = dict(tau=tau, decay_input=decay_input, v_reset=v_reset, v_threshold=v_threshold,
                              step_mode="m")
                    with torch.no_grad():
                        theirs, mine = sj_neuron.LIFNode(**kw)(x), neuron.LIFNode(**kw)(x)
                    rows.append(dict(kw, neuron_steps=T * N, spikes=int(theirs.sum()),
                                     differing=int((theirs != mine).sum())))
                    print(rows[-1], flush=True)
    total = dict(settings=len(rows), neuron_steps=sum(r["neuron_steps"] for r in rows),
                 differing=sum(r["differing"] for r in rows))
    print(total)
    with open(out, "w") as f:
        json.dump(dict(torch=torch.__version__, spikingjelly="2.0.0", device="cpu", total=total, rows=rows), f,
                  indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/compat-spikingjelly-rounding-cpu.json")
