"""Ready networks, by name. Add an entry to MODELS: name -> (builder, description);
a builder takes (input_shape, num_classes, time_steps, **kwargs) and returns a module
mapping time-major input [T, B, *input_shape] to logits [B, num_classes]."""
from __future__ import annotations

from . import mlp

MODELS = {
    "mlp": (mlp.build, "spiking MLP: Linear-LIF x2 (256 units), mean-over-time linear readout"),
}


def build_model(name: str, input_shape, num_classes: int, time_steps: int | None = None, **kwargs):
    """Build a registered model; unknown names raise ValueError listing the valid ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(MODELS)}")
    builder, _ = MODELS[name]
    return builder(tuple(input_shape), int(num_classes), time_steps, **kwargs)


__all__ = ["MODELS", "build_model"]
