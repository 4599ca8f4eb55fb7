"""Weight gradients put off until asked for, and added into .grad by the GEMM itself.

A temporal pipeline stage (spikefuse.parallel.pipeline) runs each chunk's backward in two
parts, as the zero-bubble pipelines split it: first what the stage before waits for, the
gradient of its input (B), then the weight gradients (W), which nobody waits for. A
spike_linear called inside `deferring(queue)` returns no weight or bias gradient from its
backward; it appends the work to `queue`, and `run(queue)` then adds each product into the
parameter's .grad in place (addmm_: beta = 1 folds the sum into the GEMM, where autograd
would write a fresh gradient and add it in a second pass, once per chunk). The gradients
are those autograd would accumulate, up to the order of float sums.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

import torch

_active = contextvars.ContextVar("weight_grad_queue", default=None)  # per thread: the forward's queue


@contextlib.contextmanager
def deferring(queue: list):
    """Layers that support it, called inside, queue their weight gradients on `queue`."""
    token = _active.set(queue)
    try:
        yield queue
    finally:
        _active.reset(token)


def active() -> list | None:
    """The queue a layer's forward should hand to its backward (None: compute as usual)."""
    return _active.get()


def run(queue: list[Callable[[], None]]) -> None:
    """Do the queued weight-gradient work, oldest first, and empty the queue."""
    while queue:
        queue.pop(0)()


def accumulate_product(param: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """param.grad += a @ b, in the GEMM when the dtypes allow it (a fresh .grad otherwise)."""
    if param.grad is None:
        param.grad = (a @ b).to(param.dtype)
    elif a.dtype == b.dtype == param.grad.dtype:
        param.grad.addmm_(a, b)
    else:  # autocast: the product in the activations' dtype, the sum in the parameter's
        param.grad.add_((a @ b).to(param.grad.dtype))


def accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    """param.grad += grad."""
    if param.grad is None:
        param.grad = grad.to(param.dtype)
    else:
        param.grad.add_(grad.to(param.grad.dtype))
