"""NIR export and import: graphs that snnTorch and Norse load, and their graphs loaded here.

Conventions (docs/nir.md has the full table):
- Time. NIR neurons are continuous; one of our steps is one forward-Euler step of `dt`
  seconds: NIR's LIF, tau dv/dt = (v_leak - v) + r I, becomes
  v <- (1 - dt/tau) v + (dt/tau) (r I + v_leak), i.e. our h = decay*v + x with
  decay = 1 - dt/tau and input gain g = r dt / tau. IF (dv/dt = r I) has decay 1, g = r dt.
  The default dt is 1e-4 s because snnTorch's importer hard-codes it; pass the same dt to
  Norse (`norse.torch.from_nir(graph, dt=graph.metadata["dt"])`). dt is in the metadata.
- Gain (form). form="peers" (default) writes r = 1 and folds 1/(1-decay) into the weights and
  bias of the Affine/Linear/Conv2d before each LIF (stored in float64, so our import recovers
  the float32 weights exactly): Norse ignores r, snnTorch rescales its threshold by r dt/tau,
  so both then compute our dynamics (up to float rounding). form="nir" writes the weights
  verbatim and r = 1/(1-decay) (snnTorch's own convention: bit-exact in snnTorch, wrong in
  Norse). IF is written with r = 1/dt, weights verbatim, in both forms.
- Threshold. NIR fires at v > v_threshold, we at h >= threshold. v_threshold is written one
  float32 ulp below our threshold, and read back one ulp up: in float32 `v > nextafter(t, -inf)`
  is `v >= t`, so peers fire exactly where we do, and snnTorch's `>` graphs import exactly.
- Import convention. from_nir(convention="nir") reads a LIF node as NIR says: reset to v_reset
  at once. snnTorch writes every `Leaky` as such a node, whatever its reset; its default Leaky
  (reset_mechanism="subtract", a delayed reset) loads with convention="snntorch": LIF nodes
  become reset="subtract", detach_reset=True (snnTorch's arithmetic, firing at h > v_threshold
  itself), so its spikes are snnTorch's bit for bit. IF nodes read alike in both (snnTorch
  writes none). convention="norse" reads a graph of Norse's `to_nir` as Norse's cells run it:
  Norse writes no dt and tau = export_dt / tau_mem_inv, so LIF nodes (LIFBoxCell) take dt =
  1e-3 (its cells' default; export with dt=1.0 so that tau is 1/tau_mem_inv), IF nodes
  (IAFCell, which adds its input as it is and ignores dt) take dt = 1, and LIF neurons start
  at v_leak (Norse's initial state) rather than 0 (RestingLIF).
- CUBA. Our CUBA (i = syn_decay i + x, h = decay v + i) is NIR's CubaLIF under forward Euler
  with v stepped from the new current (as snnTorch's Synaptic and Norse's LIFCell do):
  tau_syn = dt/(1-syn_decay), tau_mem = dt/(1-decay), written with r = tau_mem/dt and w_in =
  tau_syn/dt (both gains 1, weights verbatim, in either form: snnTorch's importer asserts
  r = tau_mem/dt, Norse's honours r and w_in). Read back, the gains w_in dt/tau_syn and
  r dt/tau_mem fold into the Linear before; a v_leak drive rides on the current (RestingCUBA).
  convention="snntorch" reads CubaLIF as Synaptic's default (reset="subtract"); "norse" as
  LIFCell, which adds its input to the current unscaled (gain w_in, not w_in dt/tau_syn,
  whatever its export says) and starts at v_leak.
- Recurrence. RecurrentLIF is written as the nested graph snnTorch's RLeaky maps to: Input ->
  LIF -> Output, with LIF -> Linear(w_rec) -> LIF. from_nir reads that, or the same loop in the
  graph itself (snnTorch's export_to_nir, which nirtorch flattens), as a RecurrentLIF; the
  loop's Affine bias (RLeaky adds it every step) joins the bias of the Linear before.
  convention="snntorch" (RLeaky's subtract reset, a step late) gives reset="none" with the
  threshold subtracted from w_rec's diagonal: the same spikes (the reset's gradient, which
  snnTorch detaches, then flows). RecurrentCUBA is written and read the same way with a CubaLIF
  in the loop (snnTorch's RSynaptic): the recurrent spikes join the CubaLIF's input current;
  convention="snntorch" reads RSynaptic's own reset (reset="subtract", detach_reset=True).
- Thresholds per channel (a NIR v_threshold that differs between channels) load into LIF/IF
  as a `threshold` buffer and are written back; CUBA and the recurrent neurons take one per layer.
- Readout. A mean-over-time readout is written as its Affine (readout="affine", default; the
  graph's output is the per-step drive, the logits are its mean over T; metadata readout="mean"),
  or as Affine + NIR's integrator I with r = 1/(T dt) (readout="integrator"; needs time_steps;
  snnTorch cannot build I, Norse drops it).
- BatchNorm (eval statistics) is folded into the preceding Linear/Conv2d.
- Shapes. NIR shapes are per sample; our modules are time-major [T, B, ...]: NIR Flatten's
  dims are shifted by 2. Peers map NIR Flatten(start_dim=0) onto torch's Flatten(0), which
  folds their batch in too: feed them one unbatched sample per step when the graph has one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .errors import require
from .neuron_options import check_int
from .nn.cuba import CUBA
from .nn.neurons import LIF

DEFAULT_DT = 1e-4
NORSE_DT = 1e-3  # the dt of Norse's cells and of its from_nir, unless told
FORMS = ("peers", "nir")
CONVENTIONS = ("nir", "snntorch", "norse")
READOUT_NODES = ("affine", "integrator")
UNIT_GAIN_TOLERANCE = 1e-6  # |r dt/tau - 1| below this is float32 rounding of r = tau/dt: taken as 1


# ---------------------------------------------------------------- export

def to_nir(model: nn.Module, input_shape=None, time_steps: int | None = None, dt: float = DEFAULT_DT,
           form: str = "peers", readout: str = "affine"):
    """A nir.NIRGraph of a sequential spiking model: an nn.Sequential, a model with a `.layers`
    Sequential (mlp, ipu-*, deep-lif), SHDNet or CifarNet; built from Flatten, Linear, Conv2d,
    BatchNorm (folded, eval statistics), LIF/IF/PLIF, BNLIF and the *BNLIF blocks, CUBA (as a
    CubaLIF), RecurrentLIF and RecurrentCUBA (as nested recurrent graphs), all with the hard reset.

    input_shape: one sample's shape (default: model.input_shape). time_steps: only needed for
    readout="integrator". dt: seconds per step. form: "peers" or "nir"; readout: "affine" or
    "integrator" (see the module docstring)."""
    nir = require("nir", "NIR export and import")

    dt = _check_dt(dt)
    # one sample's shape and T as ints where they enter (int() truncated 2.5, took "3", raised on NaN)
    time_steps = None if time_steps is None else check_int("time_steps", time_steps)
    if form not in FORMS:
        raise ValueError(f"form: expected one of {list(FORMS)}, got {form!r}")
    if readout not in READOUT_NODES:
        raise ValueError(f"readout: expected one of {list(READOUT_NODES)}, got {readout!r}")
    if input_shape is None:
        input_shape = getattr(model, "input_shape", None)
        if input_shape is None:
            raise ValueError(f"input_shape: {type(model).__name__} has no .input_shape; pass one sample's shape")
    layers, kind = _layers(model)
    if isinstance(input_shape, (str, bytes)) or not hasattr(input_shape, "__iter__") or not len(input_shape):
        raise ValueError(f"input_shape: expected one sample's shape, a non-empty tuple of sizes, got {input_shape!r}")
    shape = tuple(check_int("input_shape", s) for s in input_shape)
    writer = _Writer(shape, dt, form)
    for name, layer in layers:
        writer.add(name, layer)
    writer.flush()
    nodes, shape = writer.nodes, writer.shape
    if kind == "mean" and readout == "integrator":
        if time_steps is None:
            raise ValueError(f"time_steps: readout='integrator' needs the number of steps T > 0, got {time_steps!r}")
        nodes.append(nir.I(r=np.full(shape, 1.0 / (time_steps * dt), np.float64)))
    _check_finite(nodes, dt)
    graph = nir.NIRGraph.from_list(*nodes, nir.Output(output_type=np.array(shape)))
    graph.metadata = {"source": "spikefuse", "dt": float(dt), "form": form, "readout": kind,
                      "readout_node": readout if kind == "mean" else "none",
                      "threshold": "v > v_threshold, written one float32 ulp below spikefuse's h >= threshold"}
    if time_steps is not None:
        graph.metadata["time_steps"] = time_steps
    return graph


def _layers(model: nn.Module):
    """([(name, module), ...] in execution order, readout kind: "mean" | "count" | "none")."""
    from .models.cifar import CifarNet
    from .models.dvs import DVSGestureNet
    from .models.resnet import SpikingResNet
    from .models.shd import SHDNet

    if isinstance(model, (DVSGestureNet, SpikingResNet)):
        why = ("its max pooling (MaxPool2d): NIR has no max-pooling node" if isinstance(model, DVSGestureNet)
               else "its residual connections: spikefuse exports sequential graphs only")
        raise ValueError(f"cannot export {type(model).__name__} to NIR: {why}")
    if isinstance(model, SHDNet):
        head = [("flatten", nn.Flatten(2))] if len(model.input_shape) > 1 else []
        return head + _named(model.hidden, "hidden") + [("readout", model.readout)], "mean"
    if isinstance(model, CifarNet):
        return (_named(model.features, "features") + [("flatten", nn.Flatten(2))]
                + _named(model.classifier, "classifier") + [("readout", model.readout)]), "mean"
    layers = model.layers if isinstance(getattr(model, "layers", None), nn.Sequential) else model
    if not isinstance(layers, nn.Sequential):
        raise ValueError(f"cannot export {type(model).__name__}: expected an nn.Sequential, a .layers Sequential, "
                         "SHDNet or CifarNet")
    kind = getattr(model, "readout", None)
    return _named(layers, "layers" if layers is not model else ""), kind if kind in ("mean", "count") else "none"


def _named(container, prefix):
    out = []
    for key, layer in container.named_children():
        name = f"{prefix}.{key}" if prefix else key
        out += _named(layer, name) if isinstance(layer, nn.Sequential) else [(name, layer)]
    return out


class _Writer:
    """Turns modules into NIR nodes; a Linear/Conv2d is held back (pending) so that a following
    BatchNorm folds into it and, in the peers form, a following LIF scales it by its gain."""

    def __init__(self, shape, dt, form):
        nir = require("nir", "NIR export and import")

        self.nodes, self.shape, self.dt, self.form = [nir.Input(input_type=np.array(shape))], shape, dt, form
        self.pending = None  # dict(kind, weight, bias, name, conv options, in_shape)

    def add(self, name, layer):
        from .nn.bn_lif import BNLIF
        from .nn.cuba import CUBA
        from .nn.layers import Dropout, TimeFolded
        from .nn.neurons import LIF
        from .nn.recurrent_cuba import RecurrentCUBA
        from .nn.recurrent_lif import RecurrentLIF
        from .nn.spiking_layers import _BNLIFBlock

        if isinstance(layer, TimeFolded):
            return self.add(name, layer.module)
        if any(getattr(layer, init, torch.zeros(1)).any() for init in ("v_init", "i_init")):
            raise ValueError(f"{name}: {type(layer).__name__} starts from a state other than 0 (v_init, i_init), "
                             "which a NIR graph cannot say")
        if isinstance(layer, _BNLIFBlock):
            self.add(f"{name}.layer", layer.layer)
            self.add(f"{name}.bn", layer.bn)
            if not layer.fused:
                self.add(f"{name}.lif", layer.lif)
            return
        if isinstance(layer, (nn.Identity, Dropout, nn.Dropout)):
            return  # identities at inference
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            self._fold_bn(name, layer)
            if isinstance(layer, BNLIF):
                _check_hard_reset(name, layer)
                decay = torch.sigmoid(layer.decay_logit) if layer.decay_logit is not None else layer.decay
                self._neuron(name, decay, layer.threshold, layer.v_reset)
            return
        if isinstance(layer, nn.Linear):
            self.flush()
            if len(self.shape) != 1 or self.shape[0] != layer.in_features:
                raise ValueError(f"{name}: Linear({layer.in_features}, ...) gets per-sample shape {self.shape}; "
                                 "flatten first")
            self.pending = dict(kind="linear", name=name, weight=_np64(layer.weight),
                                bias=_np64(layer.bias) if layer.bias is not None else None)
            self.shape = (layer.out_features,)
            return
        if isinstance(layer, nn.Conv2d):
            self.flush()
            if isinstance(layer.padding, str) or layer.padding_mode != "zeros":
                raise ValueError(f"{name}: Conv2d padding={layer.padding!r}, padding_mode={layer.padding_mode!r}; "
                                 "export supports integer zero padding")
            if len(self.shape) != 3 or self.shape[0] != layer.in_channels:
                raise ValueError(f"{name}: Conv2d({layer.in_channels}, ...) gets per-sample shape {self.shape}")
            c, h, w = self.shape
            hw = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in
                  zip((h, w), layer.padding, layer.dilation, layer.kernel_size, layer.stride)]
            self.pending = dict(kind="conv", name=name, weight=_np64(layer.weight),
                                bias=_np64(layer.bias) if layer.bias is not None else None,
                                in_shape=(h, w), stride=tuple(layer.stride), padding=tuple(layer.padding),
                                dilation=tuple(layer.dilation), groups=layer.groups)
            self.shape = (layer.out_channels, *hw)
            return
        if isinstance(layer, nn.Flatten):
            self.flush()
            self._flatten(name, layer)
            return
        if isinstance(layer, LIF):
            _check_hard_reset(name, layer)
            self._neuron(name, layer.decay_value(), layer.threshold, layer.v_reset)
            return
        if isinstance(layer, (RecurrentLIF, RecurrentCUBA)):
            _check_hard_reset(name, layer)
            if len(self.shape) != 1:
                raise ValueError(f"{name}: {type(layer).__name__} gets per-sample shape {self.shape}; NIR's "
                                 "recurrent Linear needs one vector of features per sample")
            if isinstance(layer, RecurrentCUBA):
                self._cuba(name, layer, recurrent=_np64(layer.weight))
            else:
                self._neuron(name, layer.decay, layer.threshold, layer.v_reset, recurrent=_np64(layer.weight))
            return
        if isinstance(layer, CUBA):
            _check_hard_reset(name, layer)
            self._cuba(name, layer)
            return
        raise ValueError(f"cannot export layer {name} ({type(layer).__name__}) to NIR; supported: Flatten, Linear, "
                         "Conv2d, BatchNorm (folded), LIF, IF, PLIF, BNLIF, CUBA, RecurrentLIF, RecurrentCUBA")

    def flush(self):
        nir = require("nir", "NIR export and import")

        p, self.pending = self.pending, None
        if p is None:
            return
        weight, bias = _compact(p["weight"]), None if p["bias"] is None else _compact(p["bias"])
        if p["kind"] == "linear":
            self.nodes.append(nir.Linear(weight=weight) if bias is None else nir.Affine(weight=weight, bias=bias))
        else:
            if bias is None:
                bias = np.zeros(weight.shape[0], weight.dtype)
            self.nodes.append(nir.Conv2d(input_shape=p["in_shape"], weight=weight, stride=p["stride"],
                                         padding=p["padding"], dilation=p["dilation"], groups=p["groups"],
                                         bias=bias))

    def _flatten(self, name, layer):
        nir = require("nir", "NIR export and import")

        start, end = layer.start_dim, layer.end_dim
        if start < 2 or (0 <= end < 2):
            raise ValueError(f"{name}: Flatten(start_dim={start}, end_dim={end}) would mix time or batch into the "
                             "features; time-major models flatten from dim 2")
        if len(self.shape) <= 1:
            return  # a per-step vector needs no flattening
        node = nir.Flatten(input_type={"input": np.array(self.shape)}, start_dim=start - 2,
                           end_dim=end - 2 if end >= 0 else end)
        self.nodes.append(node)
        self.shape = tuple(int(s) for s in node.output_type["output"])

    def _fold_bn(self, name, bn):
        p = self.pending
        if p is None:
            raise ValueError(f"{name}: a BatchNorm must follow a Linear or Conv2d to be folded into it")
        if bn.running_mean is None or bn.running_var is None:
            raise ValueError(f"{name}: track_running_stats=False uses batch statistics at inference; "
                             "NIR has no batch norm and it cannot be folded")
        if bn.num_features != p["weight"].shape[0]:
            raise ValueError(f"{name}: {bn.num_features} channels after {p['name']} with {p['weight'].shape[0]}")
        scale = 1.0 / np.sqrt(_np64(bn.running_var) + bn.eps)
        if bn.affine:
            scale = scale * _np64(bn.weight)
        shift = -_np64(bn.running_mean) * scale + (_np64(bn.bias) if bn.affine else 0.0)
        p["weight"] = p["weight"] * scale.reshape(-1, *[1] * (p["weight"].ndim - 1))
        p["bias"] = shift if p["bias"] is None else p["bias"] * scale + shift

    def _full(self, per_channel, dtype=np.float64):
        """One value per neuron of the current shape, as NIR wants, from one per channel (or one)."""
        shape, channels = self.shape, self.shape[0]
        values = np.broadcast_to(np.asarray(per_channel, np.float64).reshape(-1), (channels,))
        return np.broadcast_to(values.reshape(channels, *[1] * (len(shape) - 1)), shape).astype(dtype)

    def _firing(self, threshold, v_reset):
        """(v_threshold, v_reset) per neuron: the threshold one float32 ulp below ours."""
        threshold = _np64(threshold) if isinstance(threshold, torch.Tensor) else threshold
        below = np.nextafter(np.asarray(threshold, np.float32), np.float32(-np.inf))
        return self._full(below, np.float32), self._full(v_reset, np.float32)

    def _neuron(self, name, decay, threshold, v_reset, recurrent=None):
        """A LIF (IF for decay 1) node; with `recurrent` (a [N, N] weight from the layer's spikes
        of the step before), the subgraph snnTorch's importer runs as a recurrent LIF."""
        nir = require("nir", "NIR export and import")

        channels = self.shape[0]
        decay = np.asarray(_np64(decay) if isinstance(decay, torch.Tensor) else decay, np.float64).reshape(-1)
        if decay.size not in (1, channels):
            raise ValueError(f"{name}: {decay.size} decay values for {channels} channels")
        full = self._full
        thr, reset = self._firing(threshold, v_reset)
        if (decay == 1).all():
            self.flush()
            self._append(nir.IF(r=full(1.0 / self.dt), v_threshold=thr, v_reset=reset), recurrent)
            return
        if (decay >= 1).any() or (decay < 0).any():
            raise ValueError(f"{name}: decay must lie in [0, 1) for a NIR LIF (1 for IF), "
                             f"got {decay.min()}..{decay.max()}")
        gain = 1.0 - decay  # our x is NIR's (dt/tau) r I
        if self.form == "peers":
            p = self.pending
            if p is None:
                raise ValueError(f"{name}: form='peers' folds the neuron's input gain into the Linear/Conv2d "
                                 "before it, and there is none; use form='nir'")
            g = np.broadcast_to(gain, (channels,))
            p["weight"] = p["weight"] / g.reshape(-1, *[1] * (p["weight"].ndim - 1))
            p["bias"] = None if p["bias"] is None else p["bias"] / g
            recurrent = None if recurrent is None else recurrent / g.reshape(-1, 1)
            r = full(1.0)
        else:
            r = full(1.0 / gain)
        self.flush()
        self._append(nir.LIF(tau=full(self.dt / gain), r=r, v_leak=full(0.0), v_threshold=thr, v_reset=reset),
                     recurrent)

    def _append(self, neuron, recurrent):
        """The neuron node, or with a recurrent weight the nested graph snnTorch's RLeaky is
        (input -> neuron -> output, the neuron -> w_rec -> neuron loop): snnTorch's importer
        runs it as RLeaky computes (its own flat export of RLeaky it wires wrongly)."""
        nir = require("nir", "NIR export and import")

        if recurrent is None:
            self.nodes.append(neuron)
            return
        n = np.array(self.shape)
        self.nodes.append(nir.NIRGraph(
            nodes={"input": nir.Input(input_type=n), "lif": neuron, "w_rec": nir.Linear(weight=_compact(recurrent)),
                   "output": nir.Output(output_type=n)},
            edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")]))

    def _cuba(self, name, layer, recurrent=None):
        """A CubaLIF node. Written with r = tau_mem/dt and w_in = tau_syn/dt (both gains 1),
        the weights before it verbatim, in either form: snnTorch's importer asserts
        r = tau_mem/dt, and Norse's honours r and w_in. With `recurrent` (RecurrentCUBA's
        weight), the nested graph snnTorch's RSynaptic maps to, as _append writes it."""
        nir = require("nir", "NIR export and import")

        for field, value in (("decay", layer.decay), ("syn_decay", layer.syn_decay)):
            if value >= 1:
                raise ValueError(f"{name}: {field}={value} (no leak) has no NIR CubaLIF: its time constant "
                                 "would be infinite")
        self.flush()
        thr, reset = self._firing(layer.threshold, layer.v_reset)
        tau_mem, tau_syn = self._full(self.dt / (1.0 - layer.decay)), self._full(self.dt / (1.0 - layer.syn_decay))
        self._append(nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau_mem, r=tau_mem / self.dt, v_leak=self._full(0.0),
                                 v_threshold=thr, v_reset=reset, w_in=tau_syn / self.dt), recurrent)


def _check_hard_reset(name, layer) -> None:
    if layer.reset != "hard":
        raise ValueError(f"{name}: reset={layer.reset!r} has no NIR equivalent (NIR neurons reset to v_reset)")


def _check_dt(dt) -> float:
    """dt, seconds per step, as to_nir and from_nir take it (from_nir took True as 1 s)."""
    if not (isinstance(dt, (int, float)) and not isinstance(dt, bool) and 0 < dt < 1e308):  # 2**1100: no float
        raise ValueError(f"dt: expected a finite number of seconds > 0, got {dt!r}")
    return float(dt)


def _check_finite(nodes, dt: float) -> None:
    """A NIR file with NaN or inf parameters, or a zero time constant, is invalid: refuse it,
    naming the node and field (diverged weights, or a dt so small that a time constant
    underflows or 1/dt overflows in the float32 that peers compute in)."""
    for i, node in enumerate(nodes):
        parts = node.nodes.items() if hasattr(node, "nodes") else [("", node)]  # a recurrent subgraph's nodes
        for key, part in parts:
            for field, value in vars(part).items():
                if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
                    continue
                with np.errstate(over="ignore"):
                    value = value.astype(np.float32)
                problem = ("a non-finite" if not np.isfinite(value).all() else
                           "a zero" if field.startswith("tau") and (value <= 0).any() else None)
                if problem:
                    where = f"{i}" + (f" ({type(node).__name__}), its node {key!r}" if key else "")
                    raise ValueError(f"cannot export: NIR node {where} ({type(part).__name__}) would have {problem} "
                                     f"{field} (with dt = {dt}); check the model's weights and dt")


def _np64(t) -> np.ndarray:
    return t.detach().cpu().double().numpy().copy()


def _compact(a: np.ndarray) -> np.ndarray:
    """float32 when that holds the values exactly (weights written verbatim), else float64."""
    a32 = a.astype(np.float32)
    return a32 if np.array_equal(a32.astype(np.float64), a, equal_nan=True) else a


# ---------------------------------------------------------------- import

class Integrator(nn.Module):
    """NIR's I, dv/dt = r I, forward Euler: v[t] = sum_{k<=t} dt r x[k] over [T, B, ...]."""

    def __init__(self, gain: torch.Tensor):
        super().__init__()
        self.register_buffer("gain", gain)

    def forward(self, x):
        return torch.cumsum(x * self.gain, dim=0)


class LeakyIntegrator(nn.Module):
    """NIR's LI, forward Euler: v <- decay v + x (x already scaled by dt r / tau); outputs v."""

    def __init__(self, decay: torch.Tensor):
        super().__init__()
        self.register_buffer("decay", decay)

    def forward(self, x):
        v, out = torch.zeros_like(x[0]), []
        for step in x:
            v = self.decay * v + step
            out.append(v)
        return torch.stack(out)


class RestingLIF(LIF):
    """A LIF whose potential starts at `v_init` rather than 0: Norse's LIFBoxCell starts at
    v_leak. v_init is one number or one value per neuron of a sample (NIR's shape), broadcast
    over the batch; with stateful=True the first call (and the first after a reset) starts there."""

    def __init__(self, v_init, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("v_init", torch.as_tensor(v_init, dtype=torch.float32))

    def call_neuron(self, function, x, **kwargs):
        if kwargs.get("v0") is None and isinstance(x, torch.Tensor):
            kwargs["v0"] = self.v_init.to(x.device, x.dtype).expand(x.shape[1:])
        return super().call_neuron(function, x, **kwargs)

    def extra_repr(self):
        return super().extra_repr() + f", v_init={self.v_init.tolist() if self.v_init.numel() < 5 else 'per neuron'}"


class RestingCUBA(CUBA):
    """A CUBA whose state starts at (v_init, i_init) rather than 0: Norse's LIFCell starts its
    potential at v_leak, and from_nir carries a CubaLIF's v_leak drive on the synaptic current,
    which then starts at it. Each is one number or one value per neuron of a sample, broadcast
    over the batch; with stateful=True the first call (and the first after a reset) starts there."""

    def __init__(self, v_init, i_init, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("v_init", torch.as_tensor(v_init, dtype=torch.float32))
        self.register_buffer("i_init", torch.as_tensor(i_init, dtype=torch.float32))

    def call_neuron(self, function, x, **kwargs):
        if all(s is None for s in kwargs.get("state0") or (None,)) and isinstance(x, torch.Tensor):
            kwargs["state0"] = tuple(s.to(x.device, x.dtype).expand(x.shape[1:]) for s in (self.v_init, self.i_init))
        return super().call_neuron(function, x, **kwargs)


SUPPORTED = ("Input", "Output", "Affine", "Linear", "Conv2d", "Flatten", "AvgPool2d", "LIF", "IF", "CubaLIF", "LI",
             "I")
NEURONS = ("LIF", "IF", "CubaLIF")  # node types that may carry a recurrent Affine/Linear


def from_nir(graph, dt: float | None = None, convention: str = "nir") -> nn.Sequential:
    """A spikefuse model of a sequential NIR graph (a nir.NIRGraph or a .nir file path): an
    nn.Sequential of Linear, TimeFolded(Conv2d/AvgPool2d), Flatten, spikefuse LIF/IF, CUBA (for
    CubaLIF), RecurrentLIF (for a LIF/IF with an Affine/Linear back to itself, nested or not;
    see the module docstring), RecurrentCUBA (the same for a CubaLIF: snnTorch's RSynaptic) and Integrator/LeakyIntegrator (NIR's I/LI), mapping time-major
    [T, B, *shape] to [T, B, ...]. A v_threshold may differ between channels for LIF/IF only.

    dt: seconds per step; default the graph's metadata["dt"] (spikefuse writes it; snnTorch
    assumes 1e-4, Norse 1e-3 unless told). The NIR gain r dt/tau is folded into the preceding
    Linear/Conv2d; v > v_threshold becomes h >= nextafter(v_threshold, +inf) in float32.
    convention: "nir" (LIF and CubaLIF nodes reset to v_reset at once), "snntorch" (LIF and
    CubaLIF nodes are snnTorch's default Leaky/RLeaky/Synaptic: reset="subtract",
    detach_reset=True; RLeaky as reset="none", see the module docstring) or "norse" (a graph
    of norse.torch.to_nir(..., dt=1.0): LIF and CubaLIF nodes step with dt, default 1e-3
    (Norse's cells'), and start at v_leak (RestingLIF, RestingCUBA); CubaLIF (LIFCell) adds
    its input to the current unscaled; IF nodes (IAFCell) step with dt = 1 whatever dt is, as
    IAFCell adds its input unscaled. Norse does not write v_reset: a cell's v_reset other
    than 0 (also IAFCell's initial potential) is lost in its export and cannot be recovered
    here). See the module docstring.
    The model's `readout` attribute repeats the graph's ("mean": average the output over T)."""
    nir = require("nir", "NIR export and import")

    if convention not in CONVENTIONS:
        raise ValueError(f"convention: expected one of {list(CONVENTIONS)}, got {convention!r}")
    if isinstance(graph, (str, Path)):
        graph = _read(nir, Path(graph))
    if not isinstance(graph, nir.NIRGraph):
        raise TypeError(f"graph: expected a nir.NIRGraph or a path, got {type(graph).__name__}")
    metadata = graph.metadata if isinstance(graph.metadata, dict) else {}
    if dt is None and "dt" in metadata:
        try:
            dt = float(np.asarray(metadata["dt"]))
        except (TypeError, ValueError):  # a string or an array: float() raised, naming nothing
            raise ValueError(f"graph: its metadata's dt is not one number: {metadata['dt']!r}") from None
    if dt is None and convention == "norse":
        dt = NORSE_DT
    dt = None if dt is None else _check_dt(dt)
    reader = _Reader(dt, convention)
    nodes, edges = _recurrences(nir, graph)
    for key in _chain(nir, nodes, edges):
        _check_finite_node(key, nodes[key])
        reader.add(key, nodes[key])
    model = nn.Sequential(*reader.modules)
    readout = metadata.get("readout")
    readout = readout.decode() if isinstance(readout, bytes) else readout
    model.readout = readout if readout in ("mean", "count") else "none"
    model.dt = dt
    return model


def _read(nir, path: Path):
    """nir.read, with h5py's errors on a truncated, foreign or non-HDF5 file as one line."""
    if not path.is_file():
        raise FileNotFoundError(f"graph: no such NIR file: {path}")
    try:
        return nir.read(path)
    except Exception as e:  # h5py raises OSError, KeyError, AttributeError...: all mean "not a NIR file"
        from .errors import one_line
        raise ValueError(f"graph: {path} is not a readable NIR file ({one_line(e)})") from e


def _check_finite_node(key, node) -> None:
    """Refuse NaN/inf in any float parameter of a node (export refuses to write them; a NaN
    weight or tau would otherwise load silently or be misreported). Loading may sync."""
    if isinstance(node, _Recurrent):
        for part_key, part in node.parts():
            _check_finite_node(part_key, part)
        return
    for field, value in vars(node).items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, float) or (isinstance(value, np.ndarray) and value.dtype.kind in "fc"):
            bad = ~np.isfinite(np.asarray(value))
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0]) if np.ndim(value) else ()
                shown = np.asarray(value)[where] if where else np.asarray(value).reshape(-1)[0]
                raise ValueError(f"node {key!r} ({type(node).__name__}): {field} is not finite "
                                 f"({shown} at index {list(where)}); NIR parameters must be finite")


def _check_neuron_sizes(key, node, features: int) -> None:
    """Each per-neuron parameter of a neuron node after an Affine/Linear of `features` outputs
    holds one value or one per output (a graph built with type_check=False loaded a 3-neuron LIF
    after 2 outputs as 2 neurons, or failed in numpy or at the first forward)."""
    if isinstance(node, _Recurrent):
        _check_neuron_sizes(node.keys[0], node.neuron, features)
        weight = _arr(node.weight.weight)  # one that is not square is refused where the neuron is built
        if weight.ndim == 2 and weight.shape[0] == weight.shape[1] != features:
            raise ValueError(f"node {node.keys[1]!r}: recurrent weight {weight.shape}; expected ({features}, "
                             f"{features}), one row and column per output of the nodes before it")
        return
    for field, value in vars(node).items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and value.size not in (1, features):
            raise ValueError(f"node {key!r} ({type(node).__name__}): {field} has {value.size} values (shape "
                             f"{value.shape}); expected {features}, one per output of the nodes before it")


class _Recurrent:
    """A neuron node with an Affine/Linear from its spikes back to its own input: a recurrent
    neuron (snnTorch's RLeaky), read as one node of the chain."""

    def __init__(self, neuron, weight, keys):
        self.neuron, self.weight, self.keys = neuron, weight, keys  # keys: the two nodes' names

    def parts(self):
        return zip(self.keys, (self.neuron, self.weight))


def _recurrences(nir, graph) -> tuple[dict, list]:
    """The graph's nodes and edges with each recurrent neuron as one _Recurrent node. Two forms:
    a nested NIRGraph node of Input -> neuron -> Output with an Affine/Linear from the neuron
    back to itself (snnTorch's RLeaky before nirtorch flattens it; what to_nir writes), or
    that loop in the graph itself (what snnTorch's export_to_nir writes). Any other nested
    graph is refused naming it."""
    nodes, edges = dict(graph.nodes), [tuple(e) for e in graph.edges]
    for key, node in graph.nodes.items():
        if isinstance(node, nir.NIRGraph):
            nodes[key] = _recurrent_subgraph(nir, key, node)
    for key, node in graph.nodes.items():
        into, out_of = [a for a, b in edges if b == key], [b for a, b in edges if a == key]
        if (isinstance(node, (nir.Affine, nir.Linear)) and len(into) == 1 and into == out_of
                and type(nodes.get(into[0])).__name__ in NEURONS):  # neuron -> weight -> neuron, nothing else
            nodes[into[0]] = _Recurrent(nodes[into[0]], node, (into[0], key))
            del nodes[key]
            edges = [e for e in edges if key not in e]
    return nodes, edges


def _recurrent_subgraph(nir, key, graph) -> _Recurrent:
    try:
        nodes, edges = _recurrences(nir, graph)
        inner = _chain(nir, nodes, edges) if len(nodes) == 3 else []
    except ValueError:
        inner = []
    if len(inner) != 1 or not isinstance(nodes[inner[0]], _Recurrent):
        kinds = {k: type(n).__name__ for k, n in graph.nodes.items()}
        raise ValueError(f"node {key!r} (NIRGraph): from_nir reads a nested graph only as a recurrent neuron "
                         f"(Input -> LIF/IF/CubaLIF -> Output, and an Affine/Linear from the neuron back to it); "
                         f"got nodes {kinds}, edges {sorted(map(tuple, graph.edges))}")
    rec = nodes[inner[0]]
    return _Recurrent(rec.neuron, rec.weight, tuple(f"{key}.{k}" for k in rec.keys))


def _chain(nir, nodes, edges) -> list[str]:
    """The node keys from Input to Output of a graph that is one chain; ValueError otherwise."""
    for key, node in nodes.items():
        if not isinstance(node, _Recurrent) and (type(node).__name__ not in SUPPORTED
                                                  or isinstance(node, nir.NIRGraph)):
            raise ValueError(f"node {key!r} ({type(node).__name__}): not supported by spikefuse.nir.from_nir; "
                             f"supported node types: {', '.join(SUPPORTED)}, and recurrent neurons")
    inputs = [k for k, n in nodes.items() if isinstance(n, nir.Input)]
    outputs = [k for k, n in nodes.items() if isinstance(n, nir.Output)]
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"expected one Input and one Output node, got inputs {inputs} and outputs {outputs}")
    for a, b in edges:
        for end in (a, b):
            if end not in nodes:
                raise ValueError(f"edge ({a!r}, {b!r}) names node {end!r}, which the graph does not have")
    successors, predecessors = {}, {}
    for a, b in edges:
        successors.setdefault(a, []).append(b)
        predecessors.setdefault(b, []).append(a)
    for key in nodes:
        if len(successors.get(key, [])) > 1 or len(predecessors.get(key, [])) > 1:
            raise ValueError(f"node {key!r} has {len(predecessors.get(key, []))} inputs and "
                             f"{len(successors.get(key, []))} outputs; from_nir reads sequential graphs (one chain)")
    order, key = [], inputs[0]
    while key != outputs[0]:
        nxt = successors.get(key)
        if not nxt:
            raise ValueError(f"node {key!r} has no outgoing edge: the chain from Input never reaches Output")
        key = nxt[0]
        if key in order:
            raise ValueError(f"node {key!r} is on a cycle; from_nir reads feed-forward graphs only")
        order.append(key)
    order.pop()  # the Output
    if len(order) + 2 != len(nodes):
        stray = sorted(set(nodes) - set(order) - {inputs[0], outputs[0]})
        raise ValueError(f"nodes {stray} are not on the chain from Input to Output")
    return order


def _arr(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.asarray(value, np.float64)


def _bias(key, weight, bias):
    """The bias as one value per output of `weight`, or a ValueError naming the node."""
    if bias is not None and bias.size != weight.shape[0]:
        raise ValueError(f"node {key!r}: bias has {bias.size} values (shape {bias.shape}); expected "
                         f"{weight.shape[0]}, one per output of weight {weight.shape}")
    return None if bias is None else bias.reshape(-1)


def _per_channel(key, field, value) -> np.ndarray:
    """A neuron parameter as one value per channel ([1] if uniform): NIR gives one per neuron."""
    a = np.atleast_1d(_arr(value))
    if a.size == 1:
        return a.reshape(1)
    rows = a.reshape(a.shape[0], -1)
    if not (rows == rows[:, :1]).all():
        raise ValueError(f"node {key!r}: {field} varies within a channel; spikefuse neurons take one value per channel")
    rows = rows[:, 0]
    return rows[:1] if (rows == rows[0]).all() else rows


def _uniform(key, field, value, why="spikefuse neurons take one value per layer") -> float:
    a = np.unique(_arr(value))
    if a.size != 1:
        raise ValueError(f"node {key!r}: {field} differs between neurons ({a.min()}..{a.max()}); {why}")
    return float(a[0])


def _full_tensor(values) -> torch.Tensor:
    """One value per neuron (NIR's per-sample shape), broadcasting over [T, B, ...]."""
    return torch.tensor(np.asarray(values, np.float64), dtype=torch.float32)


def _f32(x: float) -> float:
    """x rounded to float32 and written as the shortest decimal that gives it back (0.9, not 0.899999976)."""
    return float(str(np.float32(x)))


class _Reader:
    def __init__(self, dt, convention="nir"):
        self.dt, self.convention, self.modules = dt, convention, []
        self.weighted = None  # the module just built from an Affine/Linear/Conv2d, if the last one
        # the features an Affine/Linear gave, while the chain after it stays flat (neurons keep
        # them); None after a convolution, pooling or flattening, whose shapes are not followed
        self.features = None

    def add(self, key, node):
        nir = require("nir", "NIR export and import")

        from .nn.layers import TimeFolded

        weighted, self.weighted = self.weighted, None
        if not isinstance(node, (nir.Affine, nir.Linear)):
            if isinstance(node, (nir.Conv2d, nir.Flatten, nir.AvgPool2d)):
                self.features = None
            elif self.features is not None:
                _check_neuron_sizes(key, node, self.features)
        if isinstance(node, (nir.Affine, nir.Linear)):
            weight = _arr(node.weight)
            bias = _arr(node.bias) if isinstance(node, nir.Affine) and node.bias is not None else None
            if weight.ndim != 2:
                raise ValueError(f"node {key!r}: {type(node).__name__} weight must be 2-D, got shape {weight.shape}")
            if self.features is not None and weight.shape[1] != self.features:
                # a graph built with type_check=False: it loaded, and failed at the first forward
                raise ValueError(f"node {key!r}: weight {weight.shape} takes {weight.shape[1]} inputs, but the "
                                 f"nodes before it give {self.features}")
            self.features = weight.shape[0]
            bias = _bias(key, weight, bias)
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
            self.weighted = dict(module=layer, weight=weight, bias=bias)
            self._set(self.weighted)
            self.modules.append(layer)
        elif isinstance(node, nir.Conv2d):
            weight = _arr(node.weight)
            if weight.ndim != 4:
                raise ValueError(f"node {key!r}: Conv2d weight must be 4-D [out, in/groups, kh, kw], "
                                 f"got shape {weight.shape}")
            bias = _bias(key, weight, _arr(node.bias) if node.bias is not None else None)
            if bias is not None and not bias.any():
                bias = None
            padding = node.padding if isinstance(node.padding, str) else np.atleast_1d(node.padding)
            pair = lambda v: tuple(int(s) for s in np.broadcast_to(np.atleast_1d(v), (2,)))  # noqa: E731
            conv = nn.Conv2d(weight.shape[1] * int(node.groups), weight.shape[0], tuple(weight.shape[2:]),
                             stride=pair(node.stride), padding=padding if isinstance(padding, str) else pair(padding),
                             dilation=pair(node.dilation), groups=int(node.groups), bias=bias is not None)
            self.weighted = dict(module=conv, weight=weight, bias=bias)
            self._set(self.weighted)
            self.modules.append(TimeFolded(conv))
        elif isinstance(node, nir.Flatten):
            start, end = int(node.start_dim), int(node.end_dim)
            self.modules.append(nn.Flatten(start + 2 if start >= 0 else start, end + 2 if end >= 0 else end))
        elif isinstance(node, nir.AvgPool2d):
            pair = lambda v: tuple(int(s) for s in np.broadcast_to(np.atleast_1d(v), (2,)))  # noqa: E731
            self.modules.append(TimeFolded(nn.AvgPool2d(pair(node.kernel_size), pair(node.stride), pair(node.padding))))
        elif isinstance(node, (nir.LIF, nir.IF)):
            self._neuron(key, node, weighted)
        elif isinstance(node, nir.CubaLIF):
            self._cuba(key, node, weighted)
        elif isinstance(node, _Recurrent):
            if isinstance(node.neuron, nir.CubaLIF):
                self._cuba(key, node.neuron, weighted, node)
            else:
                self._neuron(key, node.neuron, weighted, node)
        elif isinstance(node, (nir.LI, nir.I)):
            dt = self._dt(key)
            r = _per_channel(key, "r", node.r)
            if isinstance(node, nir.I):
                self.modules.append(Integrator(_full_tensor(_arr(node.r) * dt)))
                return
            tau = _per_channel(key, "tau", node.tau)
            leak = _per_channel(key, "v_leak", node.v_leak)
            left = self._scale_input(key, weighted, r * dt / tau, dt / tau * leak)
            if not np.all(np.asarray(left) == 1.0):
                raise ValueError(f"node {key!r}: an LI with input gain r dt/tau != 1 needs an Affine/Conv2d before it")
            self.modules.append(LeakyIntegrator(_full_tensor(1.0 - dt / _arr(node.tau))))
        # Input / Output: nothing to build

    def _dt(self, key):
        if self.dt is None:
            raise ValueError(f"node {key!r}: the graph does not say its time step (no metadata['dt']); pass dt= "
                             "(snnTorch writes graphs for dt = 1e-4; for Norse's, convention='norse' supplies its cells' dt)")
        return self.dt

    def _set(self, w):
        module = w["module"]
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(w["weight"].astype(np.float32)))
            if w["bias"] is not None:
                module.bias.copy_(torch.from_numpy(w["bias"].astype(np.float32)))

    def _scale_input(self, key, weighted, gain, drive):
        """Fold the per-channel input gain (and constant drive from v_leak) into the weighted layer
        before the neuron; returns the gain left for the neuron (1 if folded)."""
        if (np.abs(gain - 1) < UNIT_GAIN_TOLERANCE).all() and not drive.any():
            return 1.0
        if weighted is None:
            if drive.any():
                raise ValueError(f"node {key!r}: a constant input (v_leak != 0, or a recurrent Affine's bias) needs "
                                 "an Affine/Conv2d before the neuron to carry it")
            return gain
        shape = (-1, *[1] * (weighted["weight"].ndim - 1))
        weighted["weight"] = weighted["weight"] * gain.reshape(shape)
        if weighted["bias"] is not None or drive.any():
            bias = weighted["bias"] if weighted["bias"] is not None else 0.0
            weighted["bias"] = np.broadcast_to(bias * gain + drive, (weighted["weight"].shape[0],))
            module = weighted["module"]
            if module.bias is None:
                module.bias = nn.Parameter(torch.zeros(module.weight.shape[0]))
        self._set(weighted)
        return 1.0

    def _left(self, key, weighted, gain, drive) -> float:
        """_scale_input for a neuron: the one gain left for it (1 where folded), or a ValueError."""
        gain, drive = (np.array(a, np.float64) for a in np.broadcast_arrays(_unit(gain), drive))
        left = np.unique(np.atleast_1d(self._scale_input(key, weighted, gain, drive)))
        if left.size != 1:
            raise ValueError(f"node {key!r}: a per-neuron input gain needs an Affine/Conv2d before it")
        return float(left[0])

    def _neuron(self, key, node, weighted, recurrent=None):
        """A LIF/IF node as spikefuse's LIF/IF; with `recurrent` (the _Recurrent it is in), a
        RecurrentLIF."""
        nir = require("nir", "NIR export and import")

        from .nn.neurons import IF, LIF

        norse = self.convention == "norse"
        dt = 1.0 if norse and isinstance(node, nir.IF) else self._dt(key)  # IAFCell: v += input
        r = _per_channel(key, "r", node.r)
        if isinstance(node, nir.IF):
            decay, gain, drive = np.ones(1), r * dt, np.zeros(1)
        else:
            tau = _per_channel(key, "tau", node.tau)
            _check_tau(key, "tau", tau, dt)
            decay = 1.0 - dt / tau
            gain, drive = r * dt / tau, dt / tau * _per_channel(key, "v_leak", node.v_leak)
        w_rec = None
        if recurrent is not None:  # its bias is a constant input: snnTorch's RLeaky adds it every step
            w_rec, b_rec = self._recurrent_weight(recurrent.keys[1], recurrent.weight)
            drive = drive + _unit(gain) * b_rec
        left = self._left(key, weighted, gain, drive)
        delayed = self.convention == "snntorch" and isinstance(node, nir.LIF)  # snnTorch's Leaky/RLeaky
        threshold = _per_channel(key, "v_threshold", node.v_threshold).astype(np.float32)
        # NIR fires at v > t: in float32, v >= nextafter(t, +inf); reset="subtract" fires at h > t itself
        fire = (threshold if delayed and w_rec is None else np.nextafter(threshold, np.float32(np.inf))) / left
        v_reset = _f32((0.0 if node.v_reset is None else _uniform(key, "v_reset", node.v_reset)) / left)
        if w_rec is not None:
            self._recurrent(key, node, w_rec * (_unit(gain) / left).reshape(-1, 1), decay, fire, v_reset,
                            subtract=threshold / left if delayed else None)
            return
        options = dict(threshold=_f32(fire[0]) if fire.size == 1 else 1.0)  # per channel: a buffer, set below
        options.update(dict(reset="subtract", detach_reset=True) if delayed else dict(v_reset=v_reset))
        decay = _f32(decay[0]) if decay.size == 1 else torch.tensor(decay, dtype=torch.float32)
        if isinstance(node, nir.IF):
            neuron = IF(**options)
        elif norse:  # Norse's cells start at v_leak (in the neuron's units: over the gain left)
            neuron = RestingLIF(_arr(node.v_leak) / left, decay=decay, **options)
        else:
            neuron = LIF(decay=decay, **options)
        if fire.size > 1:  # a buffer, not a plain attribute: it moves with the model and is saved
            del neuron.threshold
            neuron.register_buffer("threshold", torch.tensor(fire, dtype=torch.float32))
        self.modules.append(neuron)

    def _recurrent_weight(self, key, node):
        """The recurrent Affine/Linear's weight [N, N] and bias ([N], or [0.])."""
        nir = require("nir", "NIR export and import")

        weight = _arr(node.weight)
        if weight.ndim != 2 or weight.shape[0] != weight.shape[1]:
            raise ValueError(f"node {key!r}: the recurrent {type(node).__name__}'s weight must be square [N, N], "
                             f"got shape {weight.shape}")
        bias = _arr(node.bias) if isinstance(node, nir.Affine) and node.bias is not None else None
        return weight, np.zeros(1) if bias is None else _bias(key, weight, bias)

    def _recurrent(self, key, node, weight, decay, fire, v_reset, subtract):
        """A RecurrentLIF: h = decay*v + x + s[t-1] @ weight.T, fired at h >= fire. snnTorch's
        RLeaky (convention="snntorch") subtracts `subtract` * s[t-1] from h instead of resetting
        at once: reset="none" with the subtraction on the weight's diagonal, the same forward
        (but the reset's gradient, which snnTorch detaches, flows)."""
        from .nn.recurrent_lif import RecurrentLIF

        for field, values in (("tau", decay), ("v_threshold", fire)):
            if np.unique(values).size > 1:
                raise ValueError(f"node {key!r}: {field} differs between neurons; spikefuse's RecurrentLIF takes one "
                                 "value per layer")
        if self.convention == "norse" and np.any(_arr(getattr(node, "v_leak", 0.0))):
            raise ValueError(f"node {key!r}: convention='norse' starts the potential at v_leak, RecurrentLIF at 0")
        if decay[0] <= 0:
            raise ValueError(f"node {key!r}: tau = dt gives decay 0; spikefuse's RecurrentLIF needs decay > 0")
        options = dict(reset="hard", v_reset=v_reset)
        if subtract is not None:
            if subtract[0] < 0:  # snnTorch would subtract at the first step (0 > threshold): RecurrentLIF cannot
                raise ValueError(f"node {key!r}: v_threshold < 0 under convention='snntorch' (RLeaky then resets "
                                 "before its first spike)")
            weight = weight - np.diag(np.full(len(weight), np.float64(subtract[0])))
            options = dict(reset="none")
        layer = RecurrentLIF(len(weight), decay=_f32(decay[0]), threshold=_f32(fire[0]), **options)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(weight.astype(np.float32)))
        self.modules.append(layer)

    def _cuba(self, key, node, weighted, recurrent=None):
        """A CubaLIF node as spikefuse's CUBA. NIR's tau_syn dI/dt = -I + w_in S and tau_mem dv/dt
        = v_leak - v + r I, forward Euler (v from the new I, as snnTorch's Synaptic and Norse's
        LIFCell step): I <- syn_decay I + g_syn S, v <- decay v + g_mem I + c, with g_syn =
        w_in dt/tau_syn (Norse's LIFCell adds its input unscaled: g_syn = w_in under
        convention="norse"), g_mem = r dt/tau_mem and c = dt/tau_mem v_leak. Both gains fold
        into the Affine/Linear before it; c rides on the current (i' = g_mem I + c: the bias
        gains c (1 - syn_decay) and i' starts at c, RestingCUBA). With `recurrent` (the
        _Recurrent it is in: snnTorch's RSynaptic), a RecurrentCUBA: the recurrent spikes join S,
        so its weight takes the same gain and its bias is one more input every step."""
        from .nn.cuba import CUBA
        from .nn.recurrent_cuba import RecurrentCUBA

        dt = self._dt(key)
        tau_syn, tau_mem = (_uniform(key, f, getattr(node, f), "spikefuse's CUBA takes one per layer")
                            for f in ("tau_syn", "tau_mem"))
        _check_tau(key, "tau_syn", tau_syn, dt)
        _check_tau(key, "tau_mem", tau_mem, dt)
        if tau_mem == dt:
            raise ValueError(f"node {key!r}: tau_mem = dt = {dt} gives decay 0; spikefuse's CUBA needs decay > 0")
        syn_decay, decay = 1.0 - dt / tau_syn, 1.0 - dt / tau_mem
        norse = self.convention == "norse"
        w_in = _per_channel(key, "w_in", node.w_in)
        gain = (w_in if norse else w_in * dt / tau_syn) * _per_channel(key, "r", node.r) * dt / tau_mem
        leak = dt / tau_mem * _arr(node.v_leak)  # c, per neuron
        drive = dt / tau_mem * _per_channel(key, "v_leak", node.v_leak) * (1 - syn_decay)
        w_rec = None
        if recurrent is not None:
            w_rec, b_rec = self._recurrent_weight(recurrent.keys[1], recurrent.weight)
            drive = drive + _unit(gain) * b_rec
        left = self._left(key, weighted, gain, drive)
        delayed = self.convention == "snntorch"  # snnTorch's Synaptic: the delayed subtract reset, fired at h > t
        threshold = np.float32(_uniform(key, "v_threshold", node.v_threshold, "spikefuse's CUBA takes one threshold "
                                        "per layer (only LIF takes one per channel)"))
        if not delayed:
            threshold = np.nextafter(threshold, np.float32(np.inf))
        v_reset = 0.0 if node.v_reset is None else _uniform(key, "v_reset", node.v_reset)
        reset = dict(reset="subtract", detach_reset=True) if delayed else dict(v_reset=_f32(v_reset / left))
        options = dict(decay=_f32(decay), syn_decay=_f32(syn_decay), threshold=_f32(threshold / left), **reset)
        v_init = _arr(node.v_leak) / left if norse else np.zeros(1)  # Norse's LIFCell starts at v_leak
        if w_rec is not None:
            if v_init.any() or leak.any():
                raise ValueError(f"node {key!r}: a recurrent CubaLIF with v_leak != 0 has no spikefuse neuron "
                                 "(RecurrentCUBA starts at 0 and has no constant drive on its current)")
            layer = RecurrentCUBA(len(w_rec), **options)
            with torch.no_grad():
                layer.weight.copy_(torch.from_numpy((w_rec * (_unit(gain) / left).reshape(-1, 1)).astype(np.float32)))
            self.modules.append(layer)
        elif v_init.any() or leak.any():
            self.modules.append(RestingCUBA(v_init, leak / left, **options))
        else:
            self.modules.append(CUBA(**options))


def _unit(gain):
    """gain, or exactly 1 where all of it is within UNIT_GAIN_TOLERANCE of 1 (float rounding of r = tau/dt)."""
    return np.ones_like(gain) if (np.abs(np.asarray(gain) - 1) < UNIT_GAIN_TOLERANCE).all() else gain


def _check_tau(key, field, tau, dt) -> None:
    tau = np.asarray(tau)
    if (tau <= 0).any() or not np.isfinite(tau).all():
        raise ValueError(f"node {key!r}: {field} must be finite and > 0")
    if (tau < dt).any():
        raise ValueError(f"node {key!r}: {field} = {tau.min()} < dt = {dt}: forward Euler would "
                         f"overshoot (decay 1 - dt/{field} < 0); pass the graph's dt")


__all__ = ["to_nir", "from_nir", "DEFAULT_DT", "NORSE_DT", "FORMS", "CONVENTIONS", "READOUT_NODES",
           "Integrator", "LeakyIntegrator", "RestingLIF", "RestingCUBA"]
