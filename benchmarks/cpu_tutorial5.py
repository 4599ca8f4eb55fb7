"""Produces benchmarks/results/cpu-tutorial5.json and .md, and with --inputs 64
cpu-tutorial5-64.json and .md (--out; on the CPU).

CPU training speed: snnTorch tutorial 5's network against the same network in spikefuse.

    python benchmarks/cpu_tutorial5.py [--epochs 3] [--batches 20] [--inputs 784|64]

Network (snnTorch tutorial 5): 784 -> Linear -> 1000 LIF -> Linear -> 10 LIF, T = 25 steps,
batch 128, Adam lr 5e-4, beta = decay = 0.95; --inputs 64 gives the smaller 64-1000-10 (the
digits' 8x8 inputs). Data: random MNIST-shaped images (uniform [0, 1], [B, 1, 28, 28]; [B, 64]
with --inputs 64) and random labels, rate-coded once up front with
spikefuse.encode.rate (the same spike trains for every library; encoding is not timed);
`--batches` batches per epoch. One epoch is timed as a whole (forward, loss, backward,
Adam step for every batch), wall clock; after a warm-up epoch, the median over `--epochs`
epochs. The libraries run interleaved (one epoch each per round) so that load from other
processes on the machine falls on all of them alike. Each is timed with torch's default
thread count (what either library gets by default: both run on torch's intra-op pool) and
with 1 thread.

What is computed (the same function in both, but for the firing comparison):
  snnTorch   their per-step loop as in the tutorial: for t: cur1 = fc1(x[t]);
             spk1, mem1 = lif1(cur1, mem1); cur2 = fc2(spk1); spk2, mem2 = lif2(cur2, mem2),
             snntorch.Leaky(beta=0.95, reset_mechanism="zero") (reset to zero, the reset
             detached, its default surrogate atan with alpha 2)
  spikefuse  time-major: fc1 over all T*B rows at once, spikefuse.nn.LIF(decay=0.95,
             reset="hard", v_reset=0, detach_reset=True, surrogate="atan") (alpha 2), fc2
             folded the same way, second LIF; backend "auto" (on the CPU: spikefuse.ops.lif_loop)
  loss       cross-entropy of the output spike counts (summed over T) in both: the tutorial's
             loss is on the output membrane potential at every step, which spikefuse.nn.LIF
             does not return, so it is also timed as a separate snnTorch row ("tutorial loss",
             with the tutorial's default subtract reset), for reference.
  Differences: snnTorch fires at mem > threshold, spikefuse at h >= threshold (equal only
  when a potential is exactly 1.0); snnTorch's "subtract" reset subtracts the threshold
  from the next step's potential (spikefuse's soft reset from this one, so it differs by a
  factor beta), hence "zero" for the comparison. The "agreement" section of the results
  checks the two on one batch with the same weights.
Writes benchmarks/results/cpu-tutorial5.json and .md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch
from torch import nn

import spikefuse
from spikefuse import encode
from spikefuse.nn import LIF

T, BATCH, BETA, LR = 25, 128, 0.95, 5e-4
HERE = os.path.dirname(os.path.abspath(__file__))


class SnnTorchNet(nn.Module):
    """Tutorial 5's Net with the input read per step (rate-coded)."""

    def __init__(self, reset_mechanism, inputs=784):
        super().__init__()
        import snntorch as snn
        self.fc1 = nn.Linear(inputs, 1000)
        self.lif1 = snn.Leaky(beta=BETA, reset_mechanism=reset_mechanism)
        self.fc2 = nn.Linear(1000, 10)
        self.lif2 = snn.Leaky(beta=BETA, reset_mechanism=reset_mechanism)

    def forward(self, x):
        mem1 = self.lif1.reset_mem()
        mem2 = self.lif2.reset_mem()
        spk2_rec, mem2_rec = [], []
        for step in range(x.shape[0]):
            cur1 = self.fc1(x[step])
            spk1, mem1 = self.lif1(cur1, mem1)
            cur2 = self.fc2(spk1)
            spk2, mem2 = self.lif2(cur2, mem2)
            spk2_rec.append(spk2)
            mem2_rec.append(mem2)
        return torch.stack(spk2_rec, dim=0), torch.stack(mem2_rec, dim=0)


class SpikefuseNet(nn.Module):
    def __init__(self, backend="auto", inputs=784):
        super().__init__()
        self.fc1 = nn.Linear(inputs, 1000)
        self.lif1 = LIF(decay=BETA, reset="hard", v_reset=0.0, detach_reset=True, surrogate="atan", backend=backend)
        self.fc2 = nn.Linear(1000, 10)
        self.lif2 = LIF(decay=BETA, reset="hard", v_reset=0.0, detach_reset=True, surrogate="atan", backend=backend)

    def forward(self, x):  # x [T, B, 784]
        steps, batch = x.shape[:2]
        s1 = self.lif1(self.fc1(x.reshape(steps * batch, -1)).view(steps, batch, -1))
        return self.lif2(self.fc2(s1.reshape(steps * batch, -1)).view(steps, batch, -1))


def count_loss(spikes, targets):
    return nn.functional.cross_entropy(spikes.sum(0), targets)


def tutorial_loss(mem_rec, targets):  # snnTorch tutorial 5: sum over steps of CE(mem2[t])
    loss_val = torch.zeros(1)
    for step in range(mem_rec.shape[0]):
        loss_val += nn.functional.cross_entropy(mem_rec[step], targets)
    return loss_val


def make_runner(name, init_state, inputs):
    """(model, one-batch training step) for a configuration."""
    if name.startswith("snntorch"):
        model = SnnTorchNet("subtract" if "tutorial" in name else "zero", inputs)
    else:
        model = SpikefuseNet("reference" if "reference" in name else "auto", inputs)
    model.load_state_dict(init_state, strict=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.999))

    def step(x, targets):
        model.train()
        out = model(x)
        if name == "snntorch (tutorial loss)":
            loss = tutorial_loss(out[1], targets)
        else:
            loss = count_loss(out[0] if isinstance(out, tuple) else out, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def epoch_time(step, data):
    start = time.perf_counter()
    for x, targets in data:
        step(x, targets)
    return time.perf_counter() - start


def agreement(init_state, x, targets, inputs):
    """One batch, the same weights: output spikes and gradients of both networks."""
    results = {}
    for name in ("snntorch", "spikefuse"):
        model = SnnTorchNet("zero", inputs) if name == "snntorch" else SpikefuseNet(inputs=inputs)
        model.load_state_dict(init_state, strict=False)
        out = model(x)
        spikes = out[0] if isinstance(out, tuple) else out
        count_loss(spikes, targets).backward()
        results[name] = (spikes.detach(), model.fc1.weight.grad, model.fc2.weight.grad)
    (s1, a1, b1), (s2, a2, b2) = results["snntorch"], results["spikefuse"]

    def rel(a, b):
        return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    return {"output_spikes_equal_fraction": (s1 == s2).float().mean().item(),
            "output_spike_rate": s2.mean().item(),
            "fc1_weight_grad_rel_diff": rel(a2, a1), "fc2_weight_grad_rel_diff": rel(b2, b1)}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (after one warm-up epoch)")
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    parser.add_argument("--inputs", type=int, default=784, choices=(784, 64),
                        help="input features: 784 (tutorial 5's MNIST) or 64 (the digits' 8x8)")
    parser.add_argument("--out", default=None, help="path without suffix (default results/cpu-tutorial5[-64])")
    parser.add_argument("--no-reference", action="store_true", help="skip spikefuse backend='reference'")
    args = parser.parse_args()
    if args.out is None:
        args.out = os.path.join(HERE, "results", "cpu-tutorial5" + ("" if args.inputs == 784 else f"-{args.inputs}"))
    import snntorch

    default_threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    images = torch.rand(args.batches, BATCH, *((1, 28, 28) if args.inputs == 784 else (args.inputs,)), generator=g)
    labels = torch.randint(0, 10, (args.batches, BATCH), generator=g)
    data = [(encode.rate(images[i], T, generator=g).view(T, BATCH, -1), labels[i]) for i in range(args.batches)]
    torch.manual_seed(0)
    init_state = SpikefuseNet(inputs=args.inputs).state_dict()
    names = ["snntorch", "snntorch (tutorial loss)", "spikefuse"]
    if not args.no_reference:
        names.append("spikefuse (backend=reference)")
    runs = {}
    for threads in sorted({default_threads, 1}, reverse=True):
        torch.set_num_threads(threads)
        steps = {name: make_runner(name, init_state, args.inputs) for name in names}
        times = {name: [] for name in names}
        for round_ in range(args.epochs + 1):
            for name in names:
                seconds = epoch_time(steps[name], data)
                if round_ > 0:  # round 0: warm-up
                    times[name].append(seconds)
                print(f"threads {threads} round {round_} {name}: {seconds:.2f} s", flush=True)
        runs[str(threads)] = {name: {"epoch_s": times[name], "median_epoch_s": statistics.median(times[name])}
                              for name in names}
    torch.set_num_threads(default_threads)
    result = {
        "benchmark": "snnTorch tutorial 5 network, CPU training epoch",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                    "torch_default_threads": default_threads},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "snntorch": snntorch.__version__, "spikefuse": getattr(spikefuse, "__version__", "dev")},
        "setup": {"inputs": args.inputs, "T": T, "batch": BATCH, "batches_per_epoch": args.batches, "timed_epochs": args.epochs,
                  "warmup_epochs": 1, "lr": LR, "beta": BETA,
                  "data": ("random MNIST-shaped images" if args.inputs == 784 else f"random {args.inputs}-feature inputs")
                  + " and labels, rate-coded once (spikefuse.encode.rate), not timed"},
        "agreement": agreement(init_state, data[0][0], data[0][1], args.inputs),
        "runs": runs,
    }
    for threads, rows in runs.items():
        base = rows["snntorch"]["median_epoch_s"]
        for row in rows.values():
            row["speedup_vs_snntorch"] = base / row["median_epoch_s"]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))


def markdown(r):
    m, v, s = r["machine"], r["versions"], r["setup"]
    lines = [
        "# CPU training: snnTorch tutorial 5 network",
        "",
        f"{r['date']}; {m['cpu']}, nproc {m['nproc']} (torch default threads {m['torch_default_threads']}); "
        f"Python {v['python']}, torch {v['torch']}, snnTorch {v['snntorch']}, spikefuse {v['spikefuse']}.",
        "",
        f"{s.get('inputs', 784)}-1000-10, T = {s['T']}, batch {s['batch']}, Adam lr {s['lr']}, beta/decay {s['beta']}; "
        f"{s['data']}; {s['batches_per_epoch']} batches per epoch; wall clock of a whole training epoch, "
        f"median of {s['timed_epochs']} epochs after {s['warmup_epochs']} warm-up epoch, libraries interleaved. "
        "Written by benchmarks/cpu_tutorial5.py (its docstring says what each row computes).",
        "",
        "| threads | configuration | median epoch (s) | per batch (ms) | speedup vs snnTorch |",
        "|--:|---|--:|--:|--:|",
    ]
    for threads, rows in r["runs"].items():
        for name, row in rows.items():
            lines.append(f"| {threads} | {name} | {row['median_epoch_s']:.2f} | "
                         f"{1e3 * row['median_epoch_s'] / s['batches_per_epoch']:.0f} | "
                         f"{row['speedup_vs_snntorch']:.2f}x |")
    a = r["agreement"]
    lines += ["", "Agreement on one batch, same initial weights (snnTorch Leaky reset 'zero' vs spikefuse "
              "LIF hard reset, detach_reset): output spikes equal at "
              f"{100 * a['output_spikes_equal_fraction']:.3f}% of places (output rate {a['output_spike_rate']:.3f}); "
              f"relative difference of the weight gradients: fc1 {a['fc1_weight_grad_rel_diff']:.2e}, "
              f"fc2 {a['fc2_weight_grad_rel_diff']:.2e} (float32 summation order; firing at > vs >=).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
