"""BNLIF: temporal batch norm followed by LIF neurons, as one fused op.

It is a torch BatchNorm (same parameters, buffers, momentum and eval behaviour, so a
TemporalBatchNorm state_dict loads into it) whose forward returns spikes. The fused
backend saves only the input and the per-channel statistics for backward
(spikefuse.ops.bn_lif); the reference backend is torch batch norm over T*B followed by
spikefuse.reference.lif, the oracle.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import functional as F
from ..ops.surrogate import resolve as resolve_surrogate
from .layers import check_input, fold, layer_name, unfold


class BNLIF(nn.modules.batchnorm._BatchNorm):
    """x [T, B, C, *] -> spikes of LIF(BN(x) (+ residual)), statistics over all but C.

    decay, threshold, reset, v_reset, detach_reset, surrogate, alpha: as spikefuse.nn.LIF.
    learn_decay: learn one decay per layer (PLIF: decay = sigmoid(w), initialised at decay).
    backend: "auto" (fused on CUDA, reference elsewhere), "fused" or "reference".
    forward(x, residual=None, time_steps=None): with time_steps, x is one input [B, C, *]
    repeated at every step (direct encoding); the fused backward then sums its gradient
    over time without a per-step gradient tensor.
    """

    def __init__(self, num_features: int, decay: float = 0.5, threshold: float = 1.0,
                 reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None,
                 learn_decay: bool = False, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, backend: str = "auto",
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        if reset not in F.RESETS:
            raise ValueError(f"reset: unknown mode {reset!r}; expected one of {list(F.RESETS)}")
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        F._check_decay(decay, None)
        self.surrogate, self.alpha = resolve_surrogate(surrogate, alpha)
        self.decay, self.threshold, self.reset = float(decay), float(threshold), reset
        self.v_reset, self.detach_reset, self.backend = float(v_reset), bool(detach_reset), backend
        if learn_decay:
            if not 0.0 < decay < 1.0:
                raise ValueError(f"learn_decay needs an initial decay strictly inside (0, 1), got {decay}")
            self.decay_logit = nn.Parameter(torch.tensor(math.log(decay / (1 - decay)), device=device))
        else:
            self.decay_logit = None

    def _check_input_dim(self, x):
        check_input(self, x, "[T, B, C, *]", rank=tuple(range(3, 9)), channels=self.num_features)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                time_steps: int | None = None) -> torch.Tensor:
        if time_steps is not None:
            check_input(self, x, "[B, C, *] (repeated over time_steps)", rank=tuple(range(2, 8)),
                        channels=self.num_features, dim=1)
            if time_steps < 1:
                raise ValueError(f"{layer_name(self)}: time_steps must be >= 1, got {time_steps}")
            x = x.unsqueeze(0)
        else:
            self._check_input_dim(x)
        F._check_x(x)
        steps = x.shape[0] if time_steps is None else time_steps
        if residual is not None and residual.shape != (steps, *x.shape[1:]):
            raise ValueError(f"{layer_name(self)}: residual must have the input's shape "
                             f"{(steps, *x.shape[1:])}, got {tuple(residual.shape)}")
        momentum = self._momentum()
        training = self.training or not self.track_running_stats
        decay = torch.sigmoid(self.decay_logit) if self.decay_logit is not None else self.decay
        lif = dict(threshold=self.threshold, reset=self.reset, v_reset=self.v_reset,
                   detach_reset=self.detach_reset, surrogate=self.surrogate, alpha=self.alpha)
        if F._use_fused(self.backend, x):
            from ..ops.bn_lif import bn_lif_fused

            decay_value, decay_tensor = (1.0, decay.reshape(1)) if isinstance(decay, torch.Tensor) else (decay, None)
            return bn_lif_fused(x, self.weight, self.bias, self.running_mean, self.running_var,
                                training, momentum, self.eps, decay_value, decay_tensor,
                                self.threshold, self.reset, self.v_reset, self.detach_reset,
                                self.surrogate, self.alpha, residual, steps)
        x = x.expand(steps, *x.shape[1:])
        y = nn.functional.batch_norm(fold(x), self.running_mean, self.running_var, self.weight,
                                     self.bias, training, momentum, self.eps)
        y = unfold(y, x.shape[0])
        if residual is not None:
            y = y + residual
        return F.lif(y, decay=decay, backend="reference", **lif)

    def _momentum(self):
        """torch's rule: momentum None means a cumulative average; counts batches seen."""
        if not (self.training and self.track_running_stats):
            return 0.0
        self.num_batches_tracked.add_(1)
        return 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum

    def extra_repr(self):
        return (f"{super().extra_repr()}, decay={self.decay}, threshold={self.threshold}, "
                f"reset={self.reset!r}, surrogate={self.surrogate!r}, learn_decay={self.decay_logit is not None}")
