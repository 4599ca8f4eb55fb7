"""`spikefuse export --nir RUN_DIR`: a trained run as a NIR graph (nir.write, HDF5).

How our discrete-time neurons map onto NIR's continuous ones. NIR's LIF is
    tau dv/dt = (v_leak - v) + r I,   spike when v > v_threshold, then v = v_reset.
One forward-Euler step of length dt gives v <- (1 - dt/tau) v + (dt/tau) r I, which is
our h = decay * v + x exactly when
    tau = dt / (1 - decay),   r = tau / dt = 1 / (1 - decay),   v_leak = 0.
IF (decay = 1) is NIR's IF, dv/dt = r I, with r = 1 / dt. Thresholds and hard-reset
values carry over unchanged (we fire at h >= threshold, NIR at v > threshold: they
differ only on exact equality). `dt` is one of our time steps, in seconds (default 1 ms);
it is stored in the graph's metadata.
The mean-over-time readout (a Linear whose output is averaged over T steps) becomes an
Affine followed by NIR's integrator I (dv/dt = r I) with r = 1 / (T dt): after T steps
its v is exactly our logits. Soft or no reset has no NIR equivalent and is refused.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import UsageError, one_line
from ..nn import IF, LIF, PLIF

DEFAULT_DT = 1e-3


def to_nir(model: nn.Module, input_shape, time_steps: int, dt: float = DEFAULT_DT):
    """A nir.NIRGraph of a sequential spiking model (model.layers, or the model itself
    if it is an nn.Sequential) built from Flatten, Linear and LIF/IF/PLIF layers."""
    import nir

    if not (isinstance(dt, (int, float)) and not isinstance(dt, bool) and 0 < dt < math.inf):
        raise ValueError(f"dt: expected a finite number of seconds > 0, got {dt!r}")
    layers = model.layers if hasattr(model, "layers") else model
    if not isinstance(layers, nn.Sequential):
        raise ValueError(f"cannot export {type(model).__name__}: expected an nn.Sequential or a .layers Sequential")
    shape = tuple(int(s) for s in input_shape)
    nodes, width = [nir.Input(input_type=np.array(shape))], None
    for i, layer in enumerate(layers):
        if isinstance(layer, nn.Flatten):
            if len(shape) > 1:  # a per-step vector needs no flattening
                nodes.append(nir.Flatten(input_type={"input": np.array(shape)}, start_dim=0, end_dim=-1))
            width = int(np.prod(shape))
        elif isinstance(layer, nn.Linear):
            weight = _np(layer.weight)
            bias = _np(layer.bias) if layer.bias is not None else np.zeros(weight.shape[0], np.float32)
            nodes.append(nir.Affine(weight=weight, bias=bias))
            width = weight.shape[0]
        elif isinstance(layer, LIF):
            nodes.append(_neuron(layer, width, dt, f"layers.{i}"))
        else:
            raise ValueError(f"cannot export layer {i} ({type(layer).__name__}) to NIR; "
                             "supported: Flatten, Linear, LIF, IF, PLIF")
    if getattr(model, "readout", None) == "mean":
        nodes.append(nir.I(r=np.full(width, 1.0 / (time_steps * dt), np.float32)))
    _check_finite(nodes, dt)
    graph = nir.NIRGraph.from_list(*nodes, nir.Output(output_type=np.array([width])))
    graph.metadata = {"source": "spikefuse", "dt": float(dt), "time_steps": int(time_steps),
                      "readout": getattr(model, "readout", "none")}
    return graph


def _check_finite(nodes, dt: float) -> None:
    """A NIR file with NaN or inf parameters, or a zero time constant, is invalid: refuse it,
    naming the node and field (diverged weights, or a dt so small that 1/dt overflows float32)."""
    for i, node in enumerate(nodes):
        for field, value in vars(node).items():
            if not (isinstance(value, np.ndarray) and value.dtype.kind == "f"):
                continue
            problem = ("a non-finite" if not np.isfinite(value).all() else
                       "a zero" if field == "tau" and (value <= 0).any() else None)
            if problem:
                raise ValueError(f"cannot export: NIR node {i} ({type(node).__name__}) would have {problem} "
                                 f"{field} (with dt = {dt}); check the model's weights and dt")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().float().numpy().copy()


def _neuron(layer: LIF, width: int | None, dt: float, name: str):
    import nir

    if width is None:
        raise ValueError(f"{name}: a spiking layer must follow a Linear layer to have a known size")
    if layer.reset != "hard":
        raise ValueError(f"{name}: reset={layer.reset!r} has no NIR equivalent (NIR neurons reset to v_reset)")
    def full(value, dtype=np.float32):  # one value per neuron, as NIR wants
        return np.broadcast_to(np.asarray(value, dtype), (width,)).astype(dtype)

    threshold, v_reset = full(layer.threshold), full(layer.v_reset)
    if isinstance(layer, IF):
        return nir.IF(r=full(1.0 / dt), v_threshold=threshold, v_reset=v_reset)
    # float64 so a decay of 0.8 gives r = 5, not 5.0000005
    decay = full(_np(layer.decay_value()) if isinstance(layer, PLIF) else layer.decay, np.float64)
    if (decay >= 1).any() or (decay <= 0).any():
        raise ValueError(f"{name}: decay must lie strictly between 0 and 1 for a NIR LIF, "
                         f"got {decay.min()}..{decay.max()}")
    return nir.LIF(tau=full(dt / (1 - decay)), r=full(1 / (1 - decay)), v_leak=full(0.0),
                   v_threshold=threshold, v_reset=v_reset)


# ---- the subcommand ----

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nir", metavar="RUN_DIR", required=True, help="run directory written by `spikefuse train`")
    parser.add_argument("--out", metavar="FILE", help="output file (default: RUN_DIR/model.nir)")
    parser.add_argument("--dt", type=float, default=DEFAULT_DT, help=f"seconds per time step (default: {DEFAULT_DT})")


def run(args: argparse.Namespace) -> int:
    import nir

    from . import checkpoint
    from ..models import MODELS, build_model

    run_dir = Path(args.nir)
    path = run_dir / checkpoint.FILENAME
    if not path.is_file():
        raise UsageError(f"{run_dir} has no {checkpoint.FILENAME}; pass a run directory written by `spikefuse train`")
    if not 0 < args.dt < math.inf:  # also refuses nan
        raise UsageError(f"--dt must be a finite number of seconds > 0, got {args.dt}")
    try:
        state = checkpoint.load(path)
    except checkpoint.CheckpointError as e:
        raise UsageError(str(e)) from None
    config = state.get("config")
    spec = config.get("model") if isinstance(config, dict) else None
    if not isinstance(spec, dict) or "model" not in state:
        raise UsageError(f"{path} does not say which model it holds (config['model'] or the weights are "
                         "missing); export runs written by `spikefuse train`, or call spikefuse.train.export.to_nir")
    if spec.get("name") not in MODELS:
        raise UsageError(f"the run's model {spec.get('name')!r} is not known here; known: {', '.join(MODELS)}")
    try:
        model = build_model(spec["name"], spec["input_shape"], spec["num_classes"], spec["time_steps"],
                            **spec.get("kwargs", {}))
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # a damaged or edited checkpoint
        raise UsageError(f"{path}: its weights do not fit the model its config describes ({one_line(e)})") from None
    try:
        graph = to_nir(model, spec["input_shape"], spec["time_steps"], dt=args.dt)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out) if args.out else run_dir / "model.nir"
    nir.write(out, graph)
    print(f"wrote {out}: {len(graph.nodes)} NIR nodes ({', '.join(type(n).__name__ for n in graph.nodes.values())}), "
          f"dt = {args.dt} s per step")
    return 0
