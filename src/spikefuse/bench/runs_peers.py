"""spikefuse's networks rebuilt in SpikingJelly, snnTorch and Norse for `spikefuse bench runs`:
the same layers, the same neuron equations and the same initial weights.

`network_ops(model)` reads a spikefuse model (shd, ipu-shd, mlp, cifar-*) into the list of
what its forward does, in order: repeat the static image over T, flatten, Linear, Conv2d,
temporal BatchNorm, LIF, mean over time. `PeerNet(ops, library)` runs that list with the
library's own modules, and `copy_weights` loads the spikefuse model's weights and batch-norm
statistics into it, layer by layer (shapes asserted), returning the pairs of tensors that
correspond (the cross-check compares their gradients).

Every library runs these equations (spikefuse's LIF, docs/benchmarks.md):

    h[t] = decay v[t-1] + x[t]; s[t] = 1 if h[t] >= threshold; v[t] = h[t] (1 - s[t])
    (hard reset to 0, detached where the model detaches it), ds/dh = 1 / (|h - threshold| + 1)^2

The surrogate is SuperSpike at slope 1: the one all four run natively (Norse's "super" has no
slope parameter; SpikingJelly's fused SuperSpike multiplies by alpha instead of sloping), so the
spikefuse models are built with surrogate="fast_sigmoid", alpha=1 (`SURROGATE`).
- SpikingJelly: its multi-step layers (layer.Linear / Conv2d / BatchNorm, step_mode "m") and
  LIFNode (tau = 1 / (1 - decay), decay_input=False; bench.spikingjelly.lif), one call over all
  T steps, its implementation chosen by itself (Triton/CuPy on CUDA for float32).
- snnTorch: `Leaky` stepped in a Python loop over time; reset_mechanism "zero" with
  reset_delay=False resets in the step that fires, not detached; with reset_delay=True it
  resets at the next step by a detached H(h[t-1] - threshold): the same spikes with the reset
  detached. Fires at h > threshold (differs only where h equals it exactly).
- Norse: `LIFBoxCell` (no synaptic current) stepped in a Python loop over time, dt = 1,
  tau_mem_inv = 1 - decay and the input divided by it: v + (1 - decay)(x / (1 - decay) - v) =
  decay v + x up to rounding in the last bit; its reset_method detaches the spike where the
  model does. Fires at h > threshold.
In snnTorch's and Norse's networks the stateless layers (Linear, Conv2d, BatchNorm) run once
over all T steps folded into the batch, as spikefuse's do: batch norm over T x B needs it, and
it is faster than a call per step.
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.cifar import CifarNet
from ..models.ipu import IPUNet
from ..models.mlp import SpikingMLP
from ..models.shd import SHDNet
from ..nn import BNLIF, LIF
from ..surrogates import resolve
from . import spikingjelly

LIBRARIES = ("spikingjelly", "snntorch", "norse")
EQUATIONS = ("h[t] = decay v[t-1] + x[t] (v[-1] = 0); s[t] = 1 if h[t] >= threshold else 0 (snnTorch and Norse: "
             "h[t] > threshold); v[t] = h[t] (1 - s[t]) (hard reset to 0 in the step that fires; the spike "
             "detached in it where the model sets detach_reset); backward ds/dh = 1/(|h - threshold| + 1)^2 "
             "(SuperSpike, slope 1) in every library; decay, threshold and detach_reset per layer as the "
             "spikefuse model sets them; Linear, Conv2d and batch norm (statistics over T x B) as its layers")
SURROGATE = {"surrogate": "fast_sigmoid", "alpha": 1.0}  # SuperSpike at slope 1: what every library runs


# ---- what a spikefuse model does, in order ----

def _neuron(module) -> dict:
    """The LIF options of a spikefuse LIF or BNLIF, refused (ValueError) where a peer could not
    run the same equations."""
    surrogate = resolve(module.surrogate, module.alpha) if isinstance(module.surrogate, str) else None
    decay = module.decay
    learned = getattr(module, "decay_logit", None) is not None or isinstance(getattr(module, "threshold"), torch.Tensor)
    if (module.reset != "hard" or module.v_reset != 0.0 or learned or not isinstance(decay, float)
            or surrogate != (SURROGATE["surrogate"], SURROGATE["alpha"])
            or getattr(module, "grad_threshold", float("-inf")) > float("-inf")):
        raise ValueError(f"{type(module).__name__}: the peers run a hard reset to 0, a fixed decay and threshold "
                         "and SuperSpike at slope 1 (surrogate='fast_sigmoid', alpha=1), no gradient cut; got "
                         f"reset={module.reset!r}, v_reset={module.v_reset}, surrogate={surrogate}")
    return {"decay": decay, "threshold": float(module.threshold), "detach_reset": bool(module.detach_reset)}


def _bn_blocks(blocks, kind: str) -> list[tuple]:
    ops = []
    for block in blocks:
        if not isinstance(block.bn, BNLIF):
            raise ValueError("the peers rebuild the fused form (fused=True) of a BN-LIF block")
        # a BNLIF after a Conv2d normalises [T, B, C, H, W] (BatchNorm2d), after a Linear [T, B, C]
        ops += [(kind, block.layer), ("bn", block.bn, 2 if kind == "conv" else 1), ("lif", _neuron(block.bn))]
    return ops


def _sequential(layers) -> list[tuple]:
    ops = []
    for m in layers:
        if isinstance(m, nn.Flatten):
            ops.append(("flatten",))
        elif isinstance(m, nn.Linear):
            ops.append(("linear", m))
        elif type(m) is LIF:
            ops.append(("lif", _neuron(m)))
        else:
            raise ValueError(f"{type(m).__name__}: no peer form (the peers rebuild Linear and LIF layers)")
    return ops


def network_ops(model: nn.Module) -> list[tuple]:
    """The model's forward as a list of ops: ("repeat", T), ("flatten",), ("linear", module),
    ("conv", module), ("bn", BNLIF module, 1 or 2 spatial dims: BatchNorm1d or 2d), ("lif",
    options), ("mean",). ValueError for a model the peers cannot rebuild."""
    if isinstance(model, SHDNet):
        return [("flatten",), *_bn_blocks(model.hidden, "linear"), ("mean",), ("linear", model.readout)]
    if isinstance(model, CifarNet):
        return [("repeat", model.time_steps), *_bn_blocks(model.features, "conv"), ("flatten",),
                *_bn_blocks(model.classifier, "linear"), ("mean",), ("linear", model.readout)]
    if isinstance(model, IPUNet) and model.readout == "mean":
        return [*_sequential(model.layers), ("mean",)]
    if isinstance(model, SpikingMLP):
        return [*_sequential(model.layers), ("mean",)]
    raise ValueError(f"{type(model).__name__}: the peers rebuild SHDNet, CifarNet, SpikingMLP and the "
                     "feed-forward IPUNet with its mean readout")


def equations(ops) -> list[dict]:
    """Each LIF layer's options, in order (for the results file)."""
    return [op[1] for op in ops if op[0] == "lif"]


# ---- the same network in each peer ----

def _stateless(op: tuple, library: str) -> nn.Module:
    """The Linear, Conv2d or BatchNorm of `op`, shaped as its spikefuse module: SpikingJelly's
    multi-step layer, or torch's own (folded over T by PeerNet)."""
    kind, source = op[0], op[1]
    if library == "spikingjelly":
        from spikingjelly.activation_based import layer
        extra = {"step_mode": "m"}
    else:
        layer, extra = nn, {}
    if kind == "linear":
        return layer.Linear(source.in_features, source.out_features, bias=source.bias is not None, **extra)
    if kind == "conv":
        return layer.Conv2d(source.in_channels, source.out_channels, source.kernel_size, stride=source.stride,
                            padding=source.padding, dilation=source.dilation, groups=source.groups,
                            bias=source.bias is not None, **extra)
    bn = layer.BatchNorm2d if op[2] == 2 else layer.BatchNorm1d
    return bn(source.num_features, eps=source.eps, momentum=source.momentum, **extra)


class SnnTorchLIF(nn.Module):
    """snnTorch's Leaky over [T, B, ...], stepped in a Python loop."""

    def __init__(self, decay: float, threshold: float, detach_reset: bool):
        super().__init__()
        import snntorch
        from snntorch import surrogate
        # reset_delay=True: reset at the next step by a detached spike (module docstring)
        self.leaky = snntorch.Leaky(beta=decay, threshold=threshold, spike_grad=surrogate.fast_sigmoid(slope=1),
                                    reset_mechanism="zero", reset_delay=detach_reset)

    def forward(self, x):
        mem, out = torch.zeros_like(x[0]), []
        for xt in x:
            spk, mem = self.leaky(xt, mem)
            out.append(spk)
        return torch.stack(out).to(x.dtype)  # its spikes are float32 whatever x's dtype (float64 cross-check)


def _detached_reset(z, v, reset, threshold):
    """Norse's reset_value with the spike detached (spikefuse's detach_reset=True)."""
    z = z.detach()
    return (1 - z) * v + z * reset


class NorseLIF(nn.Module):
    """Norse's LIFBoxCell over [T, B, ...], stepped in a Python loop."""

    def __init__(self, decay: float, threshold: float, detach_reset: bool):
        super().__init__()
        from norse.torch import LIFBoxCell, LIFBoxParameters
        from norse.torch.functional.reset import reset_value
        self.keep = 1 - decay  # v += dt tau_mem_inv (x' - v) with x' = x / keep: v = decay v + x
        p = LIFBoxParameters(tau_mem_inv=torch.as_tensor(self.keep), v_leak=torch.as_tensor(0.0),
                             v_th=torch.as_tensor(threshold), v_reset=torch.as_tensor(0.0), method="super",
                             alpha=torch.as_tensor(1.0), reset_method=_detached_reset if detach_reset else reset_value)
        self.cell = LIFBoxCell(p, dt=1.0)

    def forward(self, x):
        state, out = None, []
        for xt in x:
            z, state = self.cell(xt / self.keep, state)
            out.append(z)
        return torch.stack(out)


def _neuron_module(options: dict, library: str) -> nn.Module:
    if library == "spikingjelly":
        from spikingjelly.activation_based import surrogate
        return spikingjelly.lif(options["decay"], options["threshold"], options["detach_reset"],
                                surrogate.SuperSpike(alpha=1.0))
    return {"snntorch": SnnTorchLIF, "norse": NorseLIF}[library](**options)


class PeerNet(nn.Module):
    """`ops` (network_ops) run by `library`'s modules: time-major input [T, B, ...] (or a static
    image [B, C, H, W] where the ops repeat it) -> logits [B, classes]. With `record` set, the
    spikes of each LIF layer of the last forward are kept in `recorded`, in order."""

    def __init__(self, ops, library: str):
        super().__init__()
        if library not in LIBRARIES:
            raise ValueError(f"library: unknown {library!r}; expected one of {list(LIBRARIES)}")
        self.library, self.kinds = library, [op[0] for op in ops]
        self.time_steps = next((op[1] for op in ops if op[0] == "repeat"), None)
        modules = []
        for op in ops:
            if op[0] == "lif":
                modules.append(_neuron_module(op[1], library))
            elif op[0] in ("linear", "conv", "bn"):
                modules.append(_stateless(op, library))
            else:
                modules.append(nn.Identity())
        self.layers = nn.ModuleList(modules)
        self.record, self.recorded = False, []

    def forward(self, x):
        if self.library == "spikingjelly":  # its neurons keep v between calls: each batch is new
            from spikingjelly.activation_based import functional
            functional.reset_net(self)
        self.recorded = []
        for kind, module in zip(self.kinds, self.layers):
            if kind == "repeat":
                if x.dim() == 4:  # a static image: the same input at every step (direct encoding)
                    x = x.unsqueeze(0).repeat(self.time_steps, 1, 1, 1, 1)
            elif kind == "flatten":
                x = x.flatten(2)
            elif kind == "mean":
                x = x.mean(0)
            elif kind == "lif":
                x = module(x)
                if self.record:
                    self.recorded.append(x.detach())
            elif x.dim() == 2 or self.library == "spikingjelly":  # a readout, or its multi-step layer
                x = module(x)
            else:  # once over all steps: [T, B, ...] -> [T * B, ...] -> [T, B, ...]
                x = module(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        return x


_COPIED = {"linear": ("weight", "bias"), "conv": ("weight", "bias"),
           "bn": ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}


@torch.no_grad()
def copy_weights(ops, peer: PeerNet) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Load every weight, bias and batch-norm statistic of the spikefuse modules in `ops` into
    `peer`'s corresponding modules (AssertionError on a shape that differs); the (name, spikefuse
    parameter, peer parameter) pairs of the trained parameters."""
    pairs = []
    for i, (op, target) in enumerate(zip(ops, peer.layers)):
        for name in _COPIED.get(op[0], ()):
            source, dest = getattr(op[1], name, None), getattr(target, name, None)
            if source is None and dest is None:
                continue
            assert source is not None and dest is not None and source.shape == dest.shape, (
                f"layer {i} ({op[0]}) {name}: spikefuse {None if source is None else tuple(source.shape)}, "
                f"{peer.library} {None if dest is None else tuple(dest.shape)}")
            dest.copy_(source)
            if isinstance(dest, nn.Parameter):
                pairs.append((f"{i}.{op[0]}.{name}", source, dest))
    return pairs


def implementation(peer: PeerNet, device: torch.device) -> str:
    """What runs the peer's neurons (SpikingJelly picks its own implementation)."""
    if peer.library == "spikingjelly":
        if device.type != "cuda":
            return "SpikingJelly's torch implementation (CPU)"
        from spikingjelly.activation_based import functional
        return "SpikingJelly " + str(functional.neuron_implementation("lif", device)["implementation"])
    return {"snntorch": "snnTorch Leaky, Python loop over time",
            "norse": "Norse LIFBoxCell, Python loop over time"}[peer.library]
