"""Optimizers for sparse gradients.

LazyAdam: Adam that updates only the rows (first dimension) of each parameter whose
gradient has a nonzero, leaving the other rows' parameters and moments as they are
(torch.optim.SparseAdam's lazy rule, on the dense gradients autograd gives). With the
sparse backward of spikefuse.nn.SparseSpikingLinear, where most rows of a wide layer's
weight gradient are zero, it skips most of the optimizer's memory traffic. It is not
torch.optim.Adam: a row that gets no gradient keeps its momentum instead of coasting on
it; where every row has gradient it is Adam (amsgrad off, no weight decay). Where the
sparse backward noted which rows it wrote (spikefuse.ops.grad_rows), only those are read.

Capturable: the step counters live on the parameters' device and the learning rate may
be a device tensor (spikefuse.capture.prepare_optimizer makes it one), so a
CapturedStep can hold the whole update.
"""
from __future__ import annotations

import torch

from .neuron_options import check_number
from .ops import grad_rows
from .ops.lazy_adam import lazy_adam_step, lazy_adam_step_reference
from .ops.spike_pack import use_triton


FLOAT32_MAX = torch.finfo(torch.float32).max  # the update's arithmetic is float32: past this, inf


class LazyAdam(torch.optim.Optimizer):
    def __init__(self, params, lr: float | torch.Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        # host scalars checked here, once (an inf lr or eps made every updated weight NaN or froze it,
        # without a word); a tensor lr (capturable: spikefuse.capture) is the caller's to fill
        if not isinstance(lr, torch.Tensor):
            lr = check_number("lr", lr, low=0.0, high=FLOAT32_MAX)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        betas = tuple(check_number(f"betas[{i}]", b, low=0.0, high_open=1.0) for i, b in enumerate(betas))
        eps = check_number("eps", eps, low=0.0, high=FLOAT32_MAX)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, capturable=True))

    # The update runs in float32 with float32 moments (ops/lazy_adam.py): right for float32, bf16
    # and fp16 parameters, but float64 ones would silently get float32 steps. Refused where they
    # enter (the constructor and add_param_group both come here).
    DTYPES = (torch.float32, torch.bfloat16, torch.float16)

    def add_param_group(self, param_group: dict) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)  # once: it may be an iterator
        for i, p in enumerate(params):  # before the group is added: a refusal changes nothing
            _check_dtype(p, f"params[{i}] of group {len(self.param_groups)}")
        super().add_param_group({**param_group, "params": params})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("LazyAdam takes dense gradients (zero rows are skipped); "
                                     "use torch.optim.SparseAdam for sparse tensors")
                state = self.state[p]
                if not state:
                    _check_dtype(p, "a parameter")  # its dtype may have changed since (module.double())
                    state["step"] = torch.zeros((), device=p.device, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])
                state["step"] += 1
                if not p.is_contiguous():
                    raise ValueError("LazyAdam needs contiguous parameters")
                grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                candidates = grad_rows.take(p)  # None where it does not describe p.grad
                if not use_triton(p):
                    lazy_adam_step_reference(p, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                                             group["lr"], beta1, beta2, group["eps"])
                    continue
                lazy_adam_step(p, grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                               group["lr"], beta1, beta2, group["eps"], candidates)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for group in self.param_groups:  # a note must not outlive the gradient it describes
            for p in group["params"]:
                grad_rows.clear(p)
        super().zero_grad(set_to_none)


def steps_each_parameter_alone(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer`'s update of a parameter reads only that parameter's gradient and
    state, so that stepping its parameters in parts is stepping them together (what
    spikefuse.parallel.GradientReducer does to overlap the step with backward): torch's
    elementwise optimizers and LazyAdam, not a subclass (its step may differ) or an unknown one."""
    return type(optimizer) in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
                               torch.optim.Adagrad, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, LazyAdam)


def _check_dtype(p: torch.Tensor, which: str) -> None:
    if p.dtype not in LazyAdam.DTYPES:
        raise TypeError(f"LazyAdam: {which} is {p.dtype}; LazyAdam updates float32, bfloat16 and float16 "
                        "parameters (its moments and arithmetic are float32): use torch.optim.Adam for "
                        f"{p.dtype}, or convert the model with .float()")


__all__ = ["LazyAdam", "steps_each_parameter_alone"]
