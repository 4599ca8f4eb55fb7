"""BNLIF: temporal batch norm followed by LIF neurons, as one fused op.

It is a torch BatchNorm (same parameters, buffers, momentum and eval behaviour, so a
TemporalBatchNorm state_dict loads into it) whose forward returns spikes. The fused
backend saves only the input and the per-channel statistics for backward
(spikefuse.ops.bn_lif); the reference backend is torch batch norm over T*B followed by
spikefuse.reference.lif, the oracle. After spikefuse.parallel.convert_sync_batchnorm,
training statistics run over every rank too (`sync`; both backends).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .. import functional as F
from ..neuron_options import NeuronOptions, check_immediate_reset, check_int
from .batchnorm import check_batch_norm, step_momentum
from .layers import check_input, fold, layer_name, unfold
from .neuron_base import option_property


class BNLIF(nn.modules.batchnorm._BatchNorm):
    """x [T, B, C, *] -> spikes of LIF(BN(x) (+ residual)), statistics over all but C.

    decay, threshold, reset, v_reset, detach_reset, surrogate, alpha: as spikefuse.nn.LIF.
    learn_decay: learn one decay per layer (PLIF: decay = sigmoid(w), initialised at decay).
    backend: "auto" (fused on CUDA, reference elsewhere), "fused" or "reference".
    forward(x, residual=None, time_steps=None): with time_steps, x is one input [B, C, *]
    repeated at every step (direct encoding); the fused backward then sums its gradient
    over time without a per-step gradient tensor.
    Batch 0: empty spikes, running statistics unchanged (as torch's BatchNorm). Non-finite
    values: as spikefuse.functional.lif on y = BN(x); in training a NaN or inf in a
    channel's input makes its batch variance NaN, so all its spikes are NaN and its running
    statistics non-finite (as torch). threshold and v_reset must be finite Python numbers
    (TypeError otherwise, at construction or when set, on every backend: self.options, a
    spikefuse.NeuronOptions, holds them with the other LIF options). Double backward:
    as functional.lif (through torch).
    """

    sync = None  # a spikefuse.parallel.sync_bn.RankSync once converted to SyncBN

    # kept in self.options (a NeuronOptions, checked: the fused kernels would take an infinite
    # threshold or a NaN v_reset without a word); surrogate and alpha read as resolved, as before
    threshold = option_property("threshold")
    reset = option_property("reset")
    v_reset = option_property("v_reset")
    detach_reset = option_property("detach_reset")
    surrogate = option_property("surrogate", read="resolved_surrogate")
    alpha = option_property("alpha", read="resolved_alpha")

    def __init__(self, num_features: int, decay: float = 0.5, threshold: float = 1.0,
                 reset: str = "hard", v_reset: float = 0.0, detach_reset: bool = False,
                 surrogate: str = "rectangular", alpha: float | None = None,
                 learn_decay: bool = False, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, backend: str = "auto",
                 device=None, dtype=None):
        check_batch_norm(num_features, eps, momentum)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        # the kernels take a surrogate by name (callable_surrogate=False)
        self.options = NeuronOptions(threshold, reset, v_reset, detach_reset, surrogate, alpha,
                                     callable_surrogate=False)
        check_immediate_reset(reset, "BNLIF")  # its kernels reset at once (and so must its reference path)
        if backend not in F.BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; expected one of {list(F.BACKENDS)}")
        F._check_decay(decay, None)
        self.decay, self.backend = float(decay), backend
        if learn_decay:
            if not 0.0 < decay < 1.0:
                raise ValueError(f"learn_decay needs an initial decay strictly inside (0, 1), got {decay}")
            self.decay_logit = nn.Parameter(torch.tensor(math.log(decay / (1 - decay)), device=device))
        else:
            self.decay_logit = None

    def _check_input_dim(self, x):
        check_input(self, x, "[T, B, C, *]", rank=tuple(range(3, 9)), channels=self.num_features)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                time_steps: int | None = None, *, half_twin: bool = False) -> torch.Tensor:
        """half_twin: x is a spiking conv's output (SpikingConv2d, spiking_conv2d) whose weight
        gradient will be taken; the fused backward hands that conv an fp16 copy of dL/dx for it
        (spikefuse.ops.half_grad: fp32 with TF32 on CUDA only)."""
        if time_steps is not None:
            check_input(self, x, "[B, C, *] (repeated over time_steps)", rank=tuple(range(2, 8)),
                        channels=self.num_features, dim=1)
            check_int("time_steps", time_steps)  # a host int: checking it costs no sync
            x = x.unsqueeze(0)
        else:
            self._check_input_dim(x)
        F._check_x(x)
        steps = x.shape[0] if time_steps is None else time_steps
        if residual is not None and residual.shape != (steps, *x.shape[1:]):
            raise ValueError(f"{layer_name(self)}: residual must have the input's shape "
                             f"{(steps, *x.shape[1:])}, got {tuple(residual.shape)}")
        training = self.training or not self.track_running_stats
        if training and self.sync is None and steps * math.prod(x.shape[1:]) == self.num_features:  # torch's rule
            raise ValueError(f"{layer_name(self)}: expected more than 1 value per channel when training, "
                             f"got input of shape {(steps, *x.shape[1:])}")
        momentum = step_momentum(self)
        sync = self.sync if self.training else None  # as torch.nn.SyncBatchNorm: eval stays local
        decay = torch.sigmoid(self.decay_logit) if self.decay_logit is not None else self.decay
        # the compiled fused op has no hook for SyncBN's all-reduces: torch batch norm then
        if F._use_fused(self.backend, x) and not (sync is not None and torch.compiler.is_dynamo_compiling()):
            from ..ops.bn_lif import bn_lif_fused

            decay_value, decay_tensor = (1.0, decay.reshape(1)) if isinstance(decay, torch.Tensor) else (decay, None)
            return bn_lif_fused(x, self.weight, self.bias, self.running_mean, self.running_var,
                                training, momentum, self.eps, decay_value, decay_tensor, self.options,
                                residual, steps, sync=sync.fused(self) if sync is not None else None,
                                unfused=lambda update: self._unfused(x, residual, steps, training,
                                                                    momentum, sync, decay, update),
                                half_twin=half_twin)
        return self._unfused(x, residual, steps, training, momentum, sync, decay)

    def _unfused(self, x, residual, steps, training, momentum, sync, decay, update_running=None):
        """Torch batch norm, then the LIF off the fused kernels: the reference backend, or (update_running
        given) the fused one's stand-in while its kernels compile in the background, whose LIF takes the
        loop path on CUDA too (F.lif_stand_in: no autograd node per op and step).
        update_running=False: the running statistics were already updated for this batch (by the fused
        statistics kernel)."""
        stand_in = update_running is not None
        update_running = update_running is not False
        x = x.expand(steps, *x.shape[1:])
        if sync is not None:
            y = sync.batch_norm(fold(x), self, momentum)
        else:
            keep = update_running or not training
            y = nn.functional.batch_norm(fold(x), self.running_mean if keep else None,
                                         self.running_var if keep else None, self.weight,
                                         self.bias, training, momentum, self.eps)
        y = unfold(y, x.shape[0])
        if residual is not None:
            y = y + residual
        if stand_in:
            return F.lif_stand_in(y, decay=decay, **self.options.keywords())
        return F.lif(y, decay=decay, backend="reference", **self.options.keywords())

    def extra_repr(self):
        return (f"{super().extra_repr()}, decay={self.decay}, threshold={self.threshold}, "
                f"reset={self.reset!r}, surrogate={self.surrogate!r}, learn_decay={self.decay_logit is not None}")
