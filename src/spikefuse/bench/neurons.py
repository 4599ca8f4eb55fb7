"""`spikefuse bench neurons`: ALIF, CUBA, recurrent LIF, recurrent ALIF and the LIF with a learnable
per-neuron decay and threshold forward+backward against their peers.

Each neuron runs in spikefuse's fused kernels and in every library that can be set to the
same equations (spikefuse.reference; the plain PyTorch loop is that reference with
autograd). One call is a forward and a backward: loss = sum(spikes * g) for a fixed random
g, gradients with respect to x, to the recurrent weight W for the recurrent neurons, and
to the per-neuron decay and threshold for the learnable LIF ("plif").
Before a library is timed, its spikes and gradients are compared with spikefuse's (the
figures go into the results); one outside the tolerances is marked failed but still
timed, so that a GPU run is never wasted.

Shared settings, so that the gradients compare too:
- hard reset to 0, not detached; threshold 1;
- surrogate SuperSpike ds/du = 1/(|u| + 1)^2: the one surrogate all four libraries write
  with the same formula (spikefuse fast_sigmoid alpha 1, snnTorch fast_sigmoid slope 1,
  SpikingJelly SuperSpike alpha 1, Norse "super", whose backward ignores its alpha);
- inputs on a dyadic grid: x an odd multiple of 2^-11, W a multiple of 2^-10. The sums
  the neurons form are then (nearly always) exact in float32, whatever the order of the
  additions, and the potential almost never lands exactly on the threshold (where snnTorch
  and Norse, firing on h > threshold, differ from h >= threshold): on CPU at the default
  shapes SpikingJelly matched bit for bit, snnTorch and Norse differ in ~5 spikes per
  million (CUBA; ties after many steps of the undecayed current), moving gradients ~2e-3.
"""
from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass

import torch

from .options import names
from .report import environment, table, write_results
from .timing import median_ms, peak_extra_mib

SURROGATE, ALPHA = "fast_sigmoid", 1.0
ALIF = {"decay": 0.5, "adapt_decay": 0.9, "beta": 0.5, "threshold": 1.0}
CUBA = {"decay": 0.5, "syn_decay": 0.5, "threshold": 1.0}
RLIF = {"decay": 0.5, "threshold": 1.0}
RALIF = dict(ALIF)  # ALIF's neuron with rlif's recurrent input
# plif: per-neuron decay and threshold, both learned; values on a 1/16 grid (exact products)
PLIF_DECAYS, PLIF_THRESHOLDS = (0.25, 0.5, 0.75, 0.875), (0.75, 1.0, 1.25)
EQUATIONS = {
    "alif": "h = decay v + x; theta = threshold + beta a; s = h >= theta; v = 0 where s; "
            "a = adapt_decay a + s (" + ", ".join(f"{k} {v}" for k, v in ALIF.items()) + ")",
    "cuba": "i = syn_decay i + x; h = decay v + i; s = h >= threshold; v = 0 where s ("
            + ", ".join(f"{k} {v}" for k, v in CUBA.items()) + ")",
    "rlif": "h = decay v + x + s[t-1] @ W^T; s = h >= threshold; v = 0 where s ("
            + ", ".join(f"{k} {v}" for k, v in RLIF.items()) + ")",
    "ralif": "h = decay v + x + s[t-1] @ W^T; theta = threshold + beta a; s = h >= theta; v = 0 where s; "
             "a = adapt_decay a + s (" + ", ".join(f"{k} {v}" for k, v in RALIF.items()) + ")",
    "plif": "h = decay[n] v + x; s = h >= threshold[n]; v = 0 where s; decay[n] and threshold[n] per neuron, "
            f"both learned (decays cycling through {PLIF_DECAYS}, thresholds through {PLIF_THRESHOLDS})",
}

SHAPES = {  # (T, B, N)
    "alif": [(100, 32, 1024), (100, 128, 4096)],
    "cuba": [(100, 32, 1024), (100, 128, 4096)],
    "rlif": [(100, 32, 1024), (100, 8, 1024), (100, 32, 2048)],
    "ralif": [(100, 32, 1024), (100, 32, 2048)],
    "plif": [(100, 32, 1024), (100, 128, 4096)],
}
QUICK_SHAPES = {name: [(4, 2, 8)] for name in SHAPES}  # CPU smoke test
# the figure the recurrent kernel is held to: forward+backward at least 3x SpikingJelly's
ACCEPTANCE = {"neuron": "rlif", "shape": (100, 32, 1024), "peer": "spikingjelly", "min_ratio": 3.0}

MAX_SPIKE_MISMATCH = 1e-4  # fraction of spikes that may differ (threshold ties, see above)
MAX_GRAD_REL_ERR = 1e-2  # |g - g_spikefuse| / |g_spikefuse|; a 20 % other surrogate slope gives ~8e-2
BACK_TO_BACK = 10  # calls queued per timing in the streamed measurement (loop libraries: 2)

# peers that exist but cannot be set to our equations (checked in their source)
EXCLUDED = {
    "alif": {
        "snntorch": "no adaptive-threshold neuron (Leaky's learn_threshold learns a fixed threshold)",
        "spikingjelly": "no adaptive-threshold neuron in 2.0 (AdaptBaseNode/IzhikevichNode adapt a "
                        "current w fed into v, not the threshold)",
    },
    "cuba": {},
    "rlif": {
        "norse": "LIFRecurrentCell detaches the reset from the spike (other gradients) and always "
                 "applies input weights",
    },
    # so the recurrent ALIF is measured against the PyTorch loop only
    "ralif": {
        "norse": "LSNNRecurrent (lsnn_step) adds the recurrent spikes to the synaptic current after the "
                 "voltage update, so s[t-1] reaches v two steps after it fired, not one (the shift that "
                 "matches the alif case moves x only); it also detaches both the reset and the threshold "
                 "jump from the spike (other gradients)",
        "snntorch": "no adaptive-threshold neuron (RLeaky and RSynaptic have fixed thresholds)",
        "spikingjelly": "no adaptive-threshold neuron in 2.0 (AdaptBaseNode/IzhikevichNode adapt a "
                        "current w fed into v, not the threshold)",
    },
    "plif": {
        "spikingjelly": "ParametricLIFNode learns one decay per layer (through a sigmoid of its own "
                        "parameter) and no threshold",
        "norse": "not adapted: its LIF feeds x through a synaptic current (a one-step shift) and takes "
                 "the decay as dt * tau_mem_inv, so a cross-check would test the adapter more than the neuron",
    },
}


@dataclass
class Problem:
    """One case's tensors, shared by every library."""
    x: torch.Tensor  # [T, B, N] input, a leaf that requires grad
    g: torch.Tensor  # [T, B, N] fixed weights of the loss sum(spikes * g)
    weight: torch.Tensor | None = None  # [N, N] recurrent weight (rlif, ralif), a leaf that requires grad
    decay: torch.Tensor | None = None  # [N] learned decay (plif), a leaf that requires grad
    threshold: torch.Tensor | None = None  # [N] learned threshold (plif), a leaf that requires grad

    @property
    def leaves(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of every leaf the loss is differentiated against, in order."""
        named = (("x", self.x), ("weight", self.weight), ("decay", self.decay), ("threshold", self.threshold))
        return [(name, t) for name, t in named if t is not None]

    @property
    def wrt(self) -> list[torch.Tensor]:
        return [t for _, t in self.leaves]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.leaves]


def on_grid(t: torch.Tensor, step: float) -> torch.Tensor:
    return torch.round(t / step) * step


def make_problem(neuron: str, T: int, B: int, N: int, device: str, seed: int = 0) -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    x = on_grid(torch.randn(T, B, N, generator=gen, device=device) * 0.6 + 0.3, 2**-10) + 2**-11
    g = torch.randn(T, B, N, generator=gen, device=device)
    weight = None
    if neuron in ("rlif", "ralif"):
        weight = on_grid(torch.randn(N, N, generator=gen, device=device) * (0.5 / N**0.5), 2**-10)
        weight.requires_grad_(True)
    decay = threshold = None
    if neuron == "plif":
        n = torch.arange(N, device=device)
        decay = torch.tensor(PLIF_DECAYS, device=device)[n % len(PLIF_DECAYS)].requires_grad_(True)
        threshold = torch.tensor(PLIF_THRESHOLDS, device=device)[n % len(PLIF_THRESHOLDS)].requires_grad_(True)
    return Problem(x.requires_grad_(True), g, weight, decay, threshold)


def loss_grads(spikes: torch.Tensor, p: Problem, wrt: list[torch.Tensor] | None = None):
    """(spikes, gradients of sum(spikes * g)): what every library's call returns."""
    return spikes, torch.autograd.grad((spikes * p.g).sum(), p.wrt if wrt is None else wrt)


# ---- the libraries: each make(problem) builds its module once (as a user would) and
# returns a call () -> (spikes, gradients), gradients in the order of Problem.wrt ----

def alif_spikefuse(p):
    import spikefuse.functional as F
    return lambda: loss_grads(F.alif(p.x, **ALIF, surrogate=SURROGATE, alpha=ALPHA, backend="fused"), p)


def alif_loop(p):
    from spikefuse import reference
    return lambda: loss_grads(reference.alif(p.x, **ALIF, surrogate=SURROGATE, alpha=ALPHA), p)


def alif_norse(p):
    """Norse's LSNN (feed-forward) is our ALIF, with two shifts of convention:
    - its input joins the current after the voltage update, so x[t] reaches v at step t+1:
      one zero step is appended and the first output step dropped;
    - its threshold b decays before it is compared: theta = v_th + d (b - v_th), so its
      beta is ours / d (d = adapt_decay).
    The current is emptied every step (dt tau_syn_inv = 1) and v += dt tau_mem_inv (i - v):
    with dt tau_mem_inv = 1 - decay and an input x / (1 - decay), v = decay v + x."""
    from norse.torch import LSNN, LSNNParameters
    d, keep = ALIF["adapt_decay"], 1 - ALIF["decay"]
    params = LSNNParameters(tau_syn_inv=torch.as_tensor(1.0), tau_mem_inv=torch.as_tensor(keep),
                            tau_adapt_inv=torch.as_tensor(1 - d), v_leak=torch.as_tensor(0.0),
                            v_th=torch.as_tensor(ALIF["threshold"]), v_reset=torch.as_tensor(0.0),
                            beta=torch.as_tensor(ALIF["beta"] / d), method="super", alpha=ALPHA)
    layer = LSNN(params, dt=1.0)

    def call():
        spikes, _ = layer(torch.cat([p.x / keep, torch.zeros_like(p.x[:1])]))
        return loss_grads(spikes[1:], p)
    return call


def cuba_spikefuse(p):
    import spikefuse.functional as F
    return lambda: loss_grads(F.cuba(p.x, **CUBA, surrogate=SURROGATE, alpha=ALPHA, backend="fused"), p)


def cuba_loop(p):
    from spikefuse import reference
    return lambda: loss_grads(reference.cuba(p.x, **CUBA, surrogate=SURROGATE, alpha=ALPHA), p)


def cuba_snntorch(p):
    import snntorch
    from snntorch import surrogate
    # reset_delay=False: the reset happens in the step that fires, as in our equations
    neuron = snntorch.Synaptic(alpha=CUBA["syn_decay"], beta=CUBA["decay"], threshold=CUBA["threshold"],
                               spike_grad=surrogate.fast_sigmoid(slope=ALPHA), reset_mechanism="zero",
                               reset_delay=False).to(p.x.device)

    def call():
        syn, mem, out = torch.zeros_like(p.x[0]), torch.zeros_like(p.x[0]), []
        for xt in p.x:
            spk, syn, mem = neuron(xt, syn, mem)
            out.append(spk)
        return loss_grads(torch.stack(out), p)
    return call


def cuba_norse(p):
    """Norse's LIF is current-based: i += input, v += dt tau_mem_inv (i - v), then i decays
    by 1 - dt tau_syn_inv. With dt tau_mem_inv = 1 - decay and an input x / (1 - decay):
    our i = syn_decay i + x, h = decay v + i."""
    from norse.torch import LIF, LIFParameters
    keep = 1 - CUBA["decay"]
    params = LIFParameters(tau_syn_inv=torch.as_tensor(1 - CUBA["syn_decay"]), tau_mem_inv=torch.as_tensor(keep),
                           v_leak=torch.as_tensor(0.0), v_th=torch.as_tensor(CUBA["threshold"]),
                           v_reset=torch.as_tensor(0.0), method="super", alpha=torch.as_tensor(ALPHA))
    layer = LIF(params, dt=1.0)

    def call():
        spikes, _ = layer(p.x / keep)
        return loss_grads(spikes, p)
    return call


def cuba_spikingjelly(p):
    from spikingjelly.activation_based import functional, neuron, surrogate
    node = neuron.CUBALIFNode(c_decay=CUBA["syn_decay"], v_decay=CUBA["decay"], v_threshold=CUBA["threshold"],
                              v_reset=0.0, surrogate_function=surrogate.SuperSpike(alpha=ALPHA)).to(p.x.device)
    functional.set_step_mode(node, "m")  # whole sequences [T, B, N], as an SJ network runs it

    def call():
        functional.reset_net(node)  # the module keeps its state between calls: each call is a new sequence
        return loss_grads(node(p.x), p)
    return call


def rlif_spikefuse(p):
    import spikefuse.functional as F
    return lambda: loss_grads(F.rlif(p.x, p.weight, **RLIF, surrogate=SURROGATE, alpha=ALPHA, backend="fused"), p)


def rlif_loop(p):
    from spikefuse import reference
    return lambda: loss_grads(reference.rlif(p.x, p.weight, **RLIF, surrogate=SURROGATE, alpha=ALPHA), p)


def rlif_spikingjelly(p):
    """SpikingJelly's LinearRecurrentContainer feeds [x[t], s[t-1]] through one Linear layer
    into a single-step LIFNode; with that layer's weight [I, W] the node gets x[t] +
    s[t-1] @ W^T. LIFNode(tau, decay_input=False) charges v + (0 - v) / tau + x: decay 1 - 1/tau."""
    from spikingjelly.activation_based import functional, layer, neuron, surrogate
    n = p.weight.shape[0]
    lif = neuron.LIFNode(tau=1 / (1 - RLIF["decay"]), decay_input=False, v_threshold=RLIF["threshold"],
                         v_reset=0.0, surrogate_function=surrogate.SuperSpike(alpha=ALPHA))
    net = layer.LinearRecurrentContainer(lif, in_features=n, out_features=n, bias=False,
                                         step_mode="m").to(p.x.device)  # loops over T itself
    with torch.no_grad():
        net.rc.weight.copy_(torch.cat([torch.eye(n, device=p.x.device), p.weight], dim=1))

    def call():
        functional.reset_net(net)  # clears the container's y and the node's v
        spikes, (gx, gw) = loss_grads(net(p.x), p, [p.x, net.rc.weight])
        return spikes, (gx, gw[:, n:])  # the recurrent half is W's gradient
    return call


def rlif_snntorch(p):
    """snnTorch's RLeaky: mem = beta mem + x + Linear(spk[t-1]), its bias zeroed."""
    import snntorch
    from snntorch import surrogate
    neuron = snntorch.RLeaky(beta=RLIF["decay"], threshold=RLIF["threshold"], linear_features=p.weight.shape[0],
                             spike_grad=surrogate.fast_sigmoid(slope=ALPHA), reset_mechanism="zero",
                             reset_delay=False).to(p.x.device)
    with torch.no_grad():
        neuron.recurrent.weight.copy_(p.weight)
        neuron.recurrent.bias.zero_()

    def call():
        spk, mem, out = torch.zeros_like(p.x[0]), torch.zeros_like(p.x[0]), []
        for xt in p.x:
            spk, mem = neuron(xt, spk, mem)
            out.append(spk)
        return loss_grads(torch.stack(out), p, [p.x, neuron.recurrent.weight])
    return call


def ralif_spikefuse(p):
    import spikefuse.functional as F
    return lambda: loss_grads(F.ralif(p.x, p.weight, **RALIF, surrogate=SURROGATE, alpha=ALPHA, backend="fused"), p)


def ralif_loop(p):
    from spikefuse import reference
    return lambda: loss_grads(reference.ralif(p.x, p.weight, **RALIF, surrogate=SURROGATE, alpha=ALPHA), p)


def plif_spikefuse(p):
    import spikefuse.functional as F
    return lambda: loss_grads(F.plif(p.x, decay=p.decay, threshold=p.threshold, surrogate=SURROGATE, alpha=ALPHA,
                                     backend="fused"), p)


def plif_loop(p):
    from spikefuse import reference
    return lambda: loss_grads(reference.lif(p.x, decay=p.decay, threshold=p.threshold, surrogate=SURROGATE,
                                            alpha=ALPHA), p)


def plif_snntorch(p):
    """snnTorch's Leaky with a learned per-neuron beta and threshold (learn_beta, learn_threshold)."""
    import snntorch
    from snntorch import surrogate
    neuron = snntorch.Leaky(beta=p.decay.detach().clone(), threshold=p.threshold.detach().clone(), learn_beta=True,
                            learn_threshold=True, spike_grad=surrogate.fast_sigmoid(slope=ALPHA),
                            reset_mechanism="zero", reset_delay=False).to(p.x.device)

    def call():
        mem, out = torch.zeros_like(p.x[0]), []
        for xt in p.x:
            spk, mem = neuron(xt, mem)
            out.append(spk)
        return loss_grads(torch.stack(out), p, [p.x, neuron.beta, neuron.threshold])
    return call


ADAPTERS = {  # spikefuse first: the others are checked against it
    "alif": {"spikefuse": alif_spikefuse, "pytorch-loop": alif_loop, "norse": alif_norse},
    "cuba": {"spikefuse": cuba_spikefuse, "pytorch-loop": cuba_loop, "snntorch": cuba_snntorch,
             "norse": cuba_norse, "spikingjelly": cuba_spikingjelly},
    "rlif": {"spikefuse": rlif_spikefuse, "pytorch-loop": rlif_loop, "spikingjelly": rlif_spikingjelly,
             "snntorch": rlif_snntorch},
    "ralif": {"spikefuse": ralif_spikefuse, "pytorch-loop": ralif_loop},
    "plif": {"spikefuse": plif_spikefuse, "pytorch-loop": plif_loop, "snntorch": plif_snntorch},
}
LIBRARIES = ("spikefuse", "pytorch-loop", "snntorch", "norse", "spikingjelly")


def rlif_missing() -> str | None:
    """Why the recurrent LIF cannot run yet (its functions are being written), or None."""
    import spikefuse.functional as F
    from spikefuse import reference
    for module, name in ((F, "spikefuse.functional.rlif"), (reference, "spikefuse.reference.rlif")):
        if not hasattr(module, "rlif"):
            return f"{name} does not exist yet"
    return None


# ---- measuring ----

def compare(result, base, names) -> dict:
    """Spike mismatch and gradient errors of one library's (spikes, grads) against spikefuse's."""
    (spikes, grads), (base_spikes, base_grads) = result, base
    mismatch = (spikes.float() != base_spikes.float()).float().mean().item()
    errors = {name: ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
              for name, a, b in zip(names, grads, base_grads)}
    passed = mismatch <= MAX_SPIKE_MISMATCH and all(e <= MAX_GRAD_REL_ERR for e in errors.values())
    return {"spike_mismatch": mismatch, "grad_rel_err": errors, "check_passed": passed}


def time_call(call, fused: bool, quick: bool) -> tuple[float, float]:
    """(one call, streamed per call) in ms, as bench lif times them."""
    budget = {"warmup": 1, "min_reps": 1, "budget_s": 0.0} if quick else {"budget_s": 2.0 if fused else 1.0}
    queued = BACK_TO_BACK if fused and not quick else 2  # a loop library's queue is its host
    ms, _ = median_ms(call, **budget)
    stream_ms, _ = median_ms(call, back_to_back=queued, **budget)
    return ms, stream_ms


def measure_case(neuron, adapters, T, B, N, device, quick, skipped) -> dict:
    problem = make_problem(neuron, T, B, N, device)
    names = problem.names
    base = None
    rows = {}
    for name, make in adapters.items():
        try:
            call = make(problem)
        except ImportError as error:  # recorded once per neuron, the others still run
            skipped[name] = f"not importable here: {error}"
            continue
        if base is None:  # spikefuse: its first call is what the others must match
            base = call()
            rate = base[0].float().mean().item()
        rows[name] = compare(call(), base, names)  # spikefuse: run to run
        ms, stream_ms = time_call(call, fused=name == "spikefuse", quick=quick)
        rows[name].update(ms=ms, stream_ms=stream_ms, peak_extra_mib=peak_extra_mib(call))
        del call
        gc.collect()
    ours = rows["spikefuse"]
    for r in rows.values():
        r["ratio_to_spikefuse"] = r["ms"] / ours["ms"]
        r["stream_ratio_to_spikefuse"] = r["stream_ms"] / ours["stream_ms"]
    return {"neuron": neuron, "T": T, "B": B, "N": N, "dtype": "float32", "firing_rate": rate,
            "libraries": rows}


def acceptance(cases) -> dict | None:
    """The recurrent kernel's target (ACCEPTANCE), from the measured case; None if not run."""
    T, B, N = ACCEPTANCE["shape"]
    for case in cases:
        if (case["neuron"], case["T"], case["B"], case["N"]) == (ACCEPTANCE["neuron"], T, B, N):
            peer = case["libraries"].get(ACCEPTANCE["peer"])
            if peer is None:
                return None
            return {**ACCEPTANCE, "ratio": peer["ratio_to_spikefuse"],
                    "stream_ratio": peer["stream_ratio_to_spikefuse"],
                    "met": peer["check_passed"] and peer["ratio_to_spikefuse"] >= ACCEPTANCE["min_ratio"]}
    return None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, few repetitions: a smoke test (CPU too), written as neurons-quick-<device>")
    parser.add_argument("--neurons", default=",".join(ADAPTERS),
                        help="comma-separated subset of " + ",".join(ADAPTERS))
    parser.add_argument("--libraries", default=",".join(LIBRARIES),
                        help="comma-separated subset of " + ",".join(LIBRARIES) + " (spikefuse always runs)")


def run(args) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # "--neurons ," wrote a results file of no cases; "--libraries ," named no option
    neurons = names("--neurons", args.neurons, ADAPTERS)
    wanted = set(names("--libraries", args.libraries, LIBRARIES)) | {"spikefuse"}
    cases, skipped, skipped_neurons = [], {}, {}
    for neuron in neurons:
        missing = rlif_missing() if neuron == "rlif" else None
        if missing:
            skipped_neurons[neuron] = missing
            print(f"rlif: skipped, {missing}", flush=True)
            continue
        adapters = {k: v for k, v in ADAPTERS[neuron].items() if k in wanted}
        skipped[neuron] = {}
        for T, B, N in (QUICK_SHAPES if args.quick else SHAPES)[neuron]:
            case = measure_case(neuron, adapters, T, B, N, device, args.quick, skipped[neuron])
            cases.append(case)
            print(summary_line(case), flush=True)
    target = acceptance(cases)
    if target:
        T, B, N = target["shape"]
        print(f"acceptance: {target['neuron']} T={T} B={B} N={N}, {target['peer']} takes {target['ratio']:.2f}x "
              f"spikefuse's time (streamed {target['stream_ratio']:.2f}x), needed {target['min_ratio']}x: "
              f"{'met' if target['met'] else 'NOT met'}", flush=True)
    failed = [(c["neuron"], c["T"], c["B"], c["N"], name) for c in cases
              for name, r in c["libraries"].items() if not r["check_passed"]]
    for f in failed:
        print("cross-check FAILED: {} T={} B={} N={} {}".format(*f), flush=True)
    payload = {
        "benchmark": "neurons", "environment": environment(), "device_type": device, "quick": args.quick,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "equations": EQUATIONS, "reset": "hard to 0, not detached",
        "surrogate": f"{SURROGATE} alpha {ALPHA} (SuperSpike 1/(|u|+1)^2) in every library",
        "inputs": "x = N(0.3, 0.6) on odd multiples of 2^-11; W = N(0, 0.5/sqrt(N)) on multiples of 2^-10; "
                  "loss = sum(spikes * g), g = N(0, 1)",
        "tolerances": {"spike_mismatch": MAX_SPIKE_MISMATCH, "grad_rel_err": MAX_GRAD_REL_ERR},
        "all_checks_passed": not failed,
        "cases": cases, "acceptance": target,
        "excluded": {n: EXCLUDED[n] for n in neurons if n in EXCLUDED},
        "skipped_libraries": skipped, "skipped_neurons": skipped_neurons,
    }
    paths = write_results("neurons", payload, markdown(payload), args.out)
    print("wrote", *paths)
    return 0


def summary_line(case) -> str:
    parts = [f"{case['neuron']} T={case['T']} B={case['B']} N={case['N']} rate={case['firing_rate']:.3f}:"]
    for name, r in case["libraries"].items():
        check = "" if r["check_passed"] else " CHECK FAILED"
        parts.append(f"{name} {r['ms']:.3f} ms ({r['ratio_to_spikefuse']:.2f}x) "
                     f"mismatch={r['spike_mismatch']:.1e}{check}")
    return " | ".join(parts)


def markdown(payload) -> str:
    env = payload["environment"]
    out = [f"# Neurons forward+backward: ALIF, CUBA, recurrent LIF, recurrent ALIF\n\n{env['device']}, {env['date']}, "
           f"versions {env['versions']}\n"]
    out.append("Equations (float32):\n")
    out += [f"- {name}: {eq}" for name, eq in payload["equations"].items()]
    out.append(f"\nReset {payload['reset']}; surrogate {payload['surrogate']}. Inputs: {payload['inputs']}. "
               "One call is the forward and the backward (gradients of x, and of W for rlif and ralif). "
               "*call*: the median of one call timed alone; *streamed*: calls queued back to back, "
               f"per call ({BACK_TO_BACK} for spikefuse, 2 for the loop libraries), as in `bench lif`. "
               "*x spikefuse*: the library's time over spikefuse's. Before timing, each library's spikes "
               "and gradients are compared with spikefuse's (spikefuse: one call against the next): "
               f"*check* passes with at most {MAX_SPIKE_MISMATCH:g} of the spikes differing and every "
               f"gradient within {MAX_GRAD_REL_ERR:g} relative (L2) error.\n")
    header = ["neuron", "T", "B", "N", "library", "call ms", "x spikefuse", "streamed ms", "x spikefuse",
              "peak extra MiB", "spike mismatch", "grad rel err", "check"]
    rows = []
    for case in payload["cases"]:
        for name, r in case["libraries"].items():
            rows.append([case["neuron"], case["T"], case["B"], case["N"], name, r["ms"], r["ratio_to_spikefuse"],
                         r["stream_ms"], r["stream_ratio_to_spikefuse"], r["peak_extra_mib"], r["spike_mismatch"],
                         max(r["grad_rel_err"].values()), "pass" if r["check_passed"] else "FAILED"])
    out.append(table(header, rows))
    target = payload["acceptance"]
    if target:
        out.append(f"Target: rlif at T={target['shape'][0]}, B={target['shape'][1]}, N={target['shape'][2]} "
                   f"at least {target['min_ratio']}x {target['peer']}: {target['ratio']:.2f}x "
                   f"(streamed {target['stream_ratio']:.2f}x), {'met' if target['met'] else 'NOT met'}.\n")
    notes = [f"- {neuron}, {lib}: {why}" for neuron, libs in payload["excluded"].items() for lib, why in libs.items()]
    notes += [f"- {neuron}, {lib}: {why}" for neuron, libs in payload["skipped_libraries"].items()
              for lib, why in libs.items()]
    notes += [f"- {neuron}: {why}" for neuron, why in payload["skipped_neurons"].items()]
    if notes:
        out.append("Not measured:\n\n" + "\n".join(notes) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(p)
    raise SystemExit(run(p.parse_args()))
