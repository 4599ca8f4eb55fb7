"""What the compat modules share: the threshold one float up, and a decay tensor per neuron
laid out as spikefuse.functional.lif takes it."""
from __future__ import annotations

import torch


def next_up(value: float, dtype: torch.dtype) -> float:
    """The next float above `value` in the dtype the kernels compare in (float64 for float64
    input, else float32): `h >= it` is `h > value` for every h of that dtype."""
    dtype = torch.float64 if dtype == torch.float64 else torch.float32
    v = torch.tensor(value, dtype=dtype)
    return torch.nextafter(v, torch.tensor(float("inf"), dtype=dtype)).item()


def per_neuron(decay: torch.Tensor, x: torch.Tensor, v0: torch.Tensor, name: str):
    """(decay, x, v0) for spikefuse.functional.lif with a tensor decay that broadcasts to one
    step of x [T, *S]: the kernels take a decay per channel (dim 2), so with more than one
    value x goes flat as [T, 1, N], v0 as [1, N] and the decay as [N]; one value stays a
    scalar tensor. Reshape the results back to x's shape. A decay that does not broadcast to
    S: ValueError naming `name`."""
    shape = x.shape
    if torch.broadcast_shapes(decay.shape, shape[1:]) != shape[1:]:
        raise ValueError(f"{name} of shape {tuple(decay.shape)} does not broadcast to one step of the input, "
                         f"{tuple(shape[1:])}")
    if decay.numel() == 1:
        return decay.reshape(()), x, v0
    return decay.to(x.device).expand(shape[1:]).reshape(-1), x.reshape(shape[0], 1, -1), v0.reshape(1, -1)
