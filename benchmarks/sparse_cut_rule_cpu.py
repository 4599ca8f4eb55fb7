"""Produces benchmarks/results/sparse-cut-rule-cpu.txt (stdout; on the CPU).

Issue 16's randman accuracy gap: is it the cut's rule? A CPU experiment, no kernels.

The secondary threshold zeroes the surrogate wherever h[t] < grad_threshold, step by step
("step", what spikefuse does). The sparse Linear backward only exploits columns (neurons)
with no gradient at any step and batch row, so a rule that keeps a neuron's whole surrogate
over the sequence once it reached grad_threshold at any step ("neuron") lists exactly the
same carrying columns, costs the sparse kernels nothing, and passes more gradient; so does
"column": a feature that reached grad_threshold at any step of any sample of the batch keeps
its whole surrogate (built since as grad_scope "batch", IPUNet(sparse=True)'s default;
"neuron" is grad_scope "sequence").

This script trains benchmarks/sparse_accuracy.py's randman setting (IPU network x1, 30
epochs, sigma_u 1) on the CPU through the torch paths (the loop LIF, the sparse layer's
dense backward, LazyAdam's torch twin: the same arithmetic as the kernels), with the loop
LIF's cut patched to the chosen rule. Only the loop backend is patched, so it runs on the
CPU only.

    python benchmarks/sparse_cut_rule_cpu.py RULE SEED RUNS [THREADS] [EPOCHS]
    e.g. python benchmarks/sparse_cut_rule_cpu.py neuron 0 dense,sparse 1 30
"""
import inspect
import os
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import sparse_accuracy as sa  # noqa: E402
import spikefuse.ops.sparse_linear as sparse_linear  # noqa: E402
import spikefuse.ops.spike_index as spike_index  # noqa: E402
import spikefuse.ops.spike_pack as spike_pack  # noqa: E402
import spikefuse.optim as optim  # noqa: E402
from spikefuse.ops import lif_loop  # noqa: E402

STEP_CUT = "sg.masked_fill_(H < grad_threshold, 0.0)"
NEURON_CUT = "sg.masked_fill_(~(H >= grad_threshold).any(0, keepdim=True), 0.0)"
# a feature that reached the cut at any step in any sample of the batch: the sparse Linear's column
COLUMN_CUT = "sg.masked_fill_(~(H >= grad_threshold).flatten(0, -2).any(0), 0.0)"


def use_rule(rule: str) -> None:
    """Swap the loop LIF backward's per-step cut for another rule (the step rule is the code as is)."""
    if rule == "step":
        return
    cut = {"neuron": NEURON_CUT, "column": COLUMN_CUT}[rule]
    code = textwrap.dedent(inspect.getsource(lif_loop._backward))
    assert STEP_CUT in code, "the loop backward's cut changed: update this experiment"
    namespace = {}
    exec(compile(code.replace(STEP_CUT, cut), lif_loop.__file__, "exec"), lif_loop.__dict__, namespace)
    lif_loop._backward = namespace["_backward"]


def main():
    rule, seed, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    epochs = sys.argv[5] if len(sys.argv) > 5 else "30"
    if rule not in ("step", "neuron", "column"):
        sys.exit("RULE: step, neuron or column")
    for module in (spike_pack, spike_index, sparse_linear, optim):  # torch paths, not the interpreter
        module.use_triton = lambda t: False
    use_rule(rule)
    a = sa.options(["unused.json", "--datasets", "randman", "--seed", str(seed), "--sigma-u", "1", "--epochs", epochs])
    a.seed = seed
    splits, _ = sa.make_splits("randman", a, "cpu")
    for run in runs:
        t0 = time.time()
        r = sa.train(run, splits, a, 1.0, "cpu")
        print(f"rule={rule} seed={seed} {run}: acc {[round(100 * x, 2) for x in r['test_acc']]} "
              f"final {100 * r['final']:.2f} last3 {100 * r['last_mean']:.2f} "
              f"carrying {[round(c, 3) for c in r['carrying_share'] if c is not None]} ({time.time() - t0:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
