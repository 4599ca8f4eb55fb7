"""LIF on the CPU without a per-step autograd graph: a plain loop of torch ops over T
forward, and a hand-written reverse-time loop backward (the equations of ops/lif.py's
backward kernel).

Why: spikefuse.reference builds ~10 autograd nodes per step, and its x[t] reads are
differentiated as `select`s, each of whose backward materialises a zero tensor of all of
x ([T, *]) and adds it into dL/dx: O(T^2) memory traffic, most of a CPU training step.

Forward, per step (4 ops for the hard reset; the reference's arithmetic, so the spikes are
bit-identical to spikefuse.reference.lif):
    H[t] = decay * v + x[t]      fired[t] = H[t] >= threshold      v = reset(H[t], fired[t])
then spikes = fired as 0/1, NaN where H is NaN (one pass over all T).
Saved for backward: H (one float per neuron-step; u, the spikes and v[t-1] are recomputed
from it in whole-T passes) and x (only read by a double backward).
Backward: everything that does not depend on the carried dL/dv is computed over all T at
once, B = dL/ds * sg and A = sg * through_spike + direct, so the reverse-time loop is two
ops per step:  dL/dh[t] = B[t] + dL/dv[t] * A[t],   dL/dv[t-1] = decay * dL/dh[t].
reset="subtract" (snnTorch's, delayed): H[t] also loses threshold * s[t-1], fired[t] is
H[t] > threshold, v = H[t]; backward, dL/dh[t] = B[t] + dL/dh[t+1] * A[t] with
A = decay - threshold * sg (or the "none" loop with detach_reset).
Non-finite values follow spikefuse.functional.lif's policy; where h is infinite the hard
reset's term (v_reset - h) * sg is inf * 0 = NaN, as in the fused kernels.
Double backward (create_graph=True) differentiates spikefuse.reference instead.
"""
from __future__ import annotations

import math

import torch

from ..reference import reached_grad_threshold
from .double_backward import grads_with_graph
from ..surrogates import call_surrogate


LOOP_DTYPES = (torch.float32, torch.float64)


def _broadcast_decay(decay, decay_tensor, x):
    """The decay as one step of the recurrence multiplies it: a float, a 0-d tensor, or a
    per-channel [C, 1, ..., 1] tensor for x of shape [T, B, C, ...]."""
    if decay_tensor is None:
        return decay
    if decay_tensor.numel() == 1:
        return decay_tensor.reshape(())
    return decay_tensor.reshape((-1,) + (1,) * max(x.dim() - 3, 0))


def _reset(h, fired, threshold, v_reset, reset):
    """v from h and the fired mask (same values as the reference's reset arithmetic)."""
    if reset == "hard":
        return torch.where(fired, v_reset, h)
    if reset == "soft":
        return torch.where(fired, h - threshold, h)
    return h  # none, subtract


def _forward(x, d, v0, threshold, reset, v_reset, save):
    T = x.shape[0]
    H = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    fired = torch.empty(x.shape, dtype=torch.bool, device=x.device)
    v = torch.zeros_like(H[0]) if v0 is None else v0
    v_next = torch.empty_like(H[0])  # one buffer for v: each step reads it (into H[t]) before writing it
    v_reset_t = x.new_full((), v_reset)  # (a fill, not a copy from the host: capturable in a provisional graph)
    delayed = reset == "subtract"
    fire = torch.gt if delayed else torch.ge  # == (h - threshold > 0 / >= 0); NaN: False
    for t in range(T):
        h = H[t]
        torch.mul(v, d, out=h)
        h.add_(x[t])  # == decay * v + x[t], the reference's two roundings
        if delayed:  # - threshold * s[t-1] (h - threshold or h exactly, as the reference's; v_next: scratch)
            torch.where(fired[t - 1] if t else fire(v, threshold), torch.sub(h, threshold, out=v_next), h, out=h)
        fire(h, threshold, out=fired[t])
        if reset == "hard":
            v = torch.where(fired[t], v_reset_t, h, out=v_next)
        elif reset == "soft":
            v = torch.where(fired[t], h - threshold, h, out=v_next)
        else:
            v = h
    if reset in ("none", "subtract"):
        v = v.clone()  # v[T-1] must not alias the saved H
    spikes = fired.to(x.dtype)
    if x.is_cuda or H.sum().isnan():  # a NaN somewhere (on CUDA not tested first: that would sync, and a
        spikes.masked_fill_(H.isnan(), float("nan"))  # provisional graph captures this loop); NaN is never "no spike"
    return spikes, v, (H if save else None)


def _surrogate_(u, name, alpha):
    """sg(u) computed in place in u (the formulas of surrogates.surrogate_grad, the same
    operations but for atan's final division, a reciprocal and a product here). A user
    callable is called on u (a fresh tensor: it may overwrite it) without autograd; its
    result, checked for shape, is made a dense tensor of its own (later steps write into it)."""
    if callable(name):
        with torch.no_grad():
            g = call_surrogate(name, u)
        if g is not u and (g._base is not None or not g.is_contiguous()):
            g = g.clone(memory_format=torch.contiguous_format)  # e.g. an expanded constant
        return g
    if name == "rectangular":
        return torch.lt(u.abs_(), alpha / 2, out=u).div_(alpha)
    if name == "triangle":
        return u.abs_().div_(alpha).neg_().add_(1).clamp_(min=0).div_(alpha)
    if name == "fast_sigmoid":
        return u.abs_().mul_(alpha).add_(1).pow_(2).reciprocal_()
    if name == "sigmoid":  # alpha e / (1 + e)^2 with e = exp(-alpha |u|), as the reference
        e = u.abs_().mul_(-alpha).exp_()
        return e.mul(alpha).div_(e.add(1).pow_(2))
    if name == "atan":
        return u.mul_(math.pi / 2 * alpha).pow_(2).add_(1).reciprocal_().mul_(alpha / 2)
    raise ValueError(f"surrogate: unknown name {name!r}")


def _backward(H, grad_s, grad_vT, d, v0, threshold, reset, v_reset, detach, surrogate, alpha,
              grad_threshold, need_gd, need_gv0, grad_h=None, grad_scope="step"):
    T = H.shape[0]
    direct = None
    if reset == "hard":  # 1 - s, NaN where the spike is (NaN in, NaN out: the reference's rule)
        direct = torch.lt(H, threshold, out=torch.empty_like(H)).masked_fill_(H.isnan(), float("nan"))
    delayed = reset == "subtract" and not detach  # the reset reaches s[t] through dL/dh[t+1]
    if delayed:  # v0 as step -1, whose spike resets step 0
        H = torch.cat([(torch.zeros_like(H[0]) if v0 is None else v0).unsqueeze(0), H])
    sg = _surrogate_(H - threshold, surrogate, alpha)
    if grad_threshold > float("-inf") and grad_scope != "step":
        sg.masked_fill_(~reached_grad_threshold(H[int(delayed):], grad_threshold, grad_scope), 0.0)
    elif grad_threshold > float("-inf"):
        sg.masked_fill_(H < grad_threshold, 0.0)
    if delayed:  # A = decay - threshold * sg for steps -1 .. T-1; A0 takes dL/dh[0] to v0
        A = torch.mul(sg, -threshold).add_(d)
        A0, A, H, sg = A[0], A[1:], H[1:], sg[1:]
    elif reset == "hard" and not detach:  # A = sg * (v_reset - h) + (1 - s)
        A = H.neg().add_(v_reset).mul_(sg).add_(direct)
    elif reset == "hard":
        A = direct
    elif reset == "soft" and not detach:  # A = sg * (-threshold) + 1
        A = (sg * -threshold).add_(1.0)
    else:
        A = None  # A == 1
    if grad_s is None:
        GX = torch.zeros_like(H)
    elif A is None or A is direct:  # sg is not needed any more: B = dL/ds * sg in its place
        GX = sg.mul_(grad_s)
    else:
        GX = torch.mul(grad_s, sg)
    if grad_h is not None:  # a loss on the returned potential: dL/dh[t] gets it directly
        GX.add_(grad_h)
    # GX holds B; the loop turns each B[t] into dL/dh[t] = dL/dx[t] in place
    gv = grad_vT.clone() if grad_vT is not None else torch.zeros_like(H[0])
    if delayed:  # v[T-1] = h[T-1]; then the carry is dL/dh[t+1], not dL/dv[t]
        GX[-1].add_(gv)
        gv.zero_()
    for t in range(T - 1, -1, -1):
        gh = GX[t]
        if A is None:
            gh.add_(gv)
        else:
            gh.addcmul_(gv, A[t])
        if delayed and (t > 0 or need_gv0):
            gv.copy_(gh)
        elif t > 0 or need_gv0:
            torch.mul(gh, d, out=gv)  # dL/dv[t-1]
    grad_decay = grad_v0 = None
    if need_gd:
        P = torch.empty_like(H)  # v[t-1]
        if v0 is None:
            P[0].zero_()
        else:
            P[0].copy_(v0)
        if T > 1:
            fired = H[:-1] >= threshold
            P[1:].copy_(_reset(H[:-1], fired, threshold, v_reset, reset))
        grad_decay = P.mul_(GX)  # per neuron-step; summed to the decay's shape by the caller
    if need_gv0:
        grad_v0 = gv.mul_(A0) if delayed else gv
    return GX, grad_decay, grad_v0


class LIFLoopFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, decay_tensor, v0, options):
        decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold, want_state = options[:9]
        want_h = len(options) > 9 and options[9]
        save = any(ctx.needs_input_grad[:3])
        d = _broadcast_decay(decay, decay_tensor, x)
        spikes, vT, H = _forward(x, d, v0, threshold, reset, v_reset, save or want_h)
        if save:
            ctx.save_for_backward(x, H, decay_tensor, v0)
            ctx.options = options[:9]
            ctx.want = (want_h, want_state)
            ctx.grad_scope = options[10] if len(options) > 10 else "step"
        out = (spikes,) + ((H.clone(),) if want_h else ()) + ((vT,) if want_state else ())
        return out if len(out) > 1 else spikes

    @staticmethod
    def backward(ctx, grad_s, *grads):
        x, H, decay_tensor, v0 = ctx.saved_tensors
        decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold, _ = ctx.options
        grads = iter(grads)
        grad_h = next(grads) if ctx.want[0] else None
        grad_vT = next(grads) if ctx.want[1] else None
        need_x, need_decay, need_v0, _ = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*_reference_grads(x, decay, decay_tensor, v0, grad_s, grad_vT, ctx.options,
                                      (need_x, need_decay, need_v0), grad_h, ctx.grad_scope), None)
        return (*_grads(x, H, decay_tensor, v0, grad_s, grad_vT, grad_h, ctx.options, ctx.grad_scope,
                        (need_x, need_decay, need_v0)), None)


def _grads(x, H, decay_tensor, v0, grad_s, grad_vT, grad_h, options, grad_scope, needs):
    """(grad_x, grad_decay, grad_v0) from the saved potentials H. options: decay, threshold,
    reset, v_reset, detach, surrogate, alpha, grad_threshold (and more, unread)."""
    decay, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold = options[:8]
    need_x, need_decay, need_v0 = needs
    need_gd = decay_tensor is not None and need_decay
    need_gv0 = v0 is not None and need_v0
    d = _broadcast_decay(decay, decay_tensor, x)
    gx, prod, gv0 = _backward(H, grad_s, grad_vT, d, v0, threshold, reset, v_reset, detach,
                              surrogate, alpha, grad_threshold, need_gd, need_gv0, grad_h, grad_scope)
    grad_decay = None
    if need_gd:  # dL/d decay = sum over t of dL/dh[t] * v[t-1], summed to the decay's shape
        if decay_tensor.numel() == 1:
            grad_decay = prod.sum().reshape(decay_tensor.shape)
        else:
            dims = [0, 1] + list(range(3, prod.dim()))
            grad_decay = prod.sum(dim=dims).reshape(decay_tensor.shape)
    return gx if need_x else None, grad_decay, gv0


def recomputed_grads(x, decay_tensor, v0, grad_s, grad_vT, grad_h, options, grad_scope, needs):
    """_grads with H recomputed by the forward loop from the inputs (options as _grads'). The
    fused LIF's backward while its kernel compiles (background compiles): the reference's
    create_graph path it would otherwise take costs O(T^2) (130 ms against 20 ms for a whole
    torch-twin step of ipu-shd at T=100, H200)."""
    decay, threshold, reset, v_reset = options[:4]
    with torch.no_grad():
        H = _forward(x, _broadcast_decay(decay, decay_tensor, x), v0, threshold, reset, v_reset, True)[2]
        return _grads(x, H, decay_tensor, v0, grad_s, grad_vT, grad_h, options, grad_scope, needs)


def _reference_grads(x, decay, decay_tensor, v0, grad_s, grad_vT, options, needs, grad_h=None, grad_scope="step"):
    """(grad_x, grad_decay, grad_v0) through spikefuse.reference with create_graph, for a
    backward that will itself be differentiated: second derivatives are the reference's."""
    from .. import reference

    _, threshold, reset, v_reset, detach, surrogate, alpha, grad_threshold, _ = options
    d = _broadcast_decay(decay, decay_tensor, x)
    with torch.enable_grad():
        spikes, h, vT = reference.lif(x, d, threshold, reset, v_reset, detach, surrogate, alpha, v0,
                                      return_state=True, grad_threshold=grad_threshold, return_potential=True,
                                      grad_scope=grad_scope)
        return grads_with_graph((spikes, h, vT), (grad_s, grad_h, grad_vT), (x, decay_tensor, v0), needs)


def usable(x, decay_tensor, v0, any_device=False) -> bool:
    """This path computes in x's dtype exactly as the reference does: float32/float64 CPU
    tensors, with a decay tensor and v0 (if given) of the same dtype. The ops are plain
    torch ops, so any_device=True (a user-callable surrogate, which the fused kernels
    cannot run) also takes CUDA tensors."""
    return ((any_device or x.device.type == "cpu") and x.dtype in LOOP_DTYPES
            and (decay_tensor is None or decay_tensor.dtype == x.dtype)
            and (v0 is None or v0.dtype == x.dtype)
            and not torch.compiler.is_dynamo_compiling())


def lif_loop(x, decay, decay_tensor, options, v0, return_state, return_potential=False):
    """Entry point for spikefuse.functional (arguments already checked there; see `usable`).
    decay_tensor: None, or the PLIF decay as [1] or [C] (C = x.shape[2]).
    options: a spikefuse.neuron_options.NeuronOptions; its surrogate a name, or a callable
    sg(u) -> tensor (then alpha is ignored).
    return_potential: also return H, the pre-reset potential (a copy of what backward saves);
    the return is spikes, then H if asked, then v[T-1] if return_state."""
    flat = (decay, *options.common(), options.grad_threshold, return_state, bool(return_potential),
            options.grad_scope)
    return LIFLoopFunction.apply(x, decay_tensor, v0, flat)
