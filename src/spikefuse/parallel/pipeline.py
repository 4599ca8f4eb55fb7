"""The exact temporal pipeline: a network's layers cut into N stages (one per rank), its
time axis [T, B, ...] cut into C chunks, over torch.distributed point-to-point ops.

Schedule (GPipe, over time chunks):
    forward   stage k runs chunk c while stage k-1 runs chunk c+1. Each stage carries the
              membrane potential of each of its neurons from chunk to chunk and sends its
              output chunk on to stage k+1: as bits (spike_pack) when the stage ends in a
              neuron layer, else as it is. The receive of chunk c+1 is posted before chunk c
              is computed, so it streams in meanwhile (NCCL runs it on its own stream).
    loss      the last stage applies loss_fn to its outputs of all T steps once every chunk
              is in, and takes dL/d(outputs) of each chunk from it: any loss (cross-entropy
              of the time-mean, a per-step loss) is exact.
    backward  the same in reverse: chunk C-1 first. Stage k sends dL/d(its input chunk c)
              back to stage k-1, and the state gradient is carried down the chunks: dL/dv0
              of chunk c+1 is the incoming dL/dv[T-1] of chunk c. The weight gradients of
              SpikingLinear layers are computed after the send (ops.weight_grad_queue, the
              zero-bubble split of backward), so stage k-1 does not wait for them, and
              stage k keeps up to 2k + 1 chunks' of them waiting (_lag): its input
              gradients run ahead, and the waiting products fill the drain, where stage k
              would otherwise idle while the stages before finish their last chunks.
Exactness: each chunk's autograd graph lives from its forward to its backward, its initial
states v0 being leaves; backward is torch.autograd.backward on (the chunk's output, its final
states) with (the received gradient, the carried state gradient). That is backpropagation
through every step, hard reset included. The loss, the spikes and every parameter gradient
are single-device training's, up to the order of float sums (a weight gradient is summed
chunk by chunk).

Layers: neurons (spikefuse.nn.LIF, IF, PLIF) carry their state; every other layer must act
on each time step on its own (Linear, Conv, Flatten(2), pooling...), which is assumed, not
checked. Batch norm over time needs all T steps at once: refused (ValueError) unless
batch_norm="per_chunk", which normalizes each chunk by its own statistics: a different
model, NOT equal to single-device training, whose running statistics move once per chunk.
BNLIF (batch norm fused with neurons, no initial state) and neurons nested inside other
modules are refused either way.

A peer that died or stalled: every wait is bounded by `timeout` (gloo) and raises
PipelinePeerError naming the peer. On NCCL a wait does not block the host; there the process
group's own timeout and watchdog apply (torch.distributed.init_process_group(timeout=...)).
"""
from __future__ import annotations

import contextlib
import datetime
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import functional as F
from ..data.events import check_flag
from ..errors import one_line
from ..neuron_options import MAX_INT, check_int, check_number
from ..nn import ALIF, BNLIF, CUBA, LIF, RecurrentALIF, RecurrentCUBA, RecurrentLIF
from ..ops import spike_pack, weight_grad_queue

BATCH_NORM = ("refuse", "per_chunk")
CARRIES_NO_STATE_HERE = (ALIF, CUBA, RecurrentLIF, RecurrentALIF, RecurrentCUBA)  # neurons whose state is not handed over
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_HEADER_WORDS = 16  # int64: T, chunks, dtype index, packed, ndim, then the trailing shape
_HEADER_TAG = 0


class PipelinePeerError(RuntimeError):
    """A neighbouring stage did not answer in time: its process died or stalled."""


# ---- cutting a network into stages ----

def split_stages(layers: Sequence[nn.Module], stages: int, costs: Sequence[float] | None = None,
                 slack: float = 0.0) -> list[range]:
    """Cut `layers` into `stages` runs of consecutive layers (one range of layer indices
    each) that minimize the largest stage cost. costs: one per layer (e.g. measured
    seconds); default the parameter count. Among cuts whose largest stage is within
    (1 + slack) of the best, one with the most stages ending in a neuron layer is taken:
    those hand off 1-bit spikes instead of floats."""
    layers = list(layers)
    stages = check_count("stages", stages)
    # a NaN, negative or infinite slack or cost left no cut within the limit: an empty stage came back
    slack = check_real("slack", slack, "a finite number >= 0", low=0)
    if stages > len(layers):
        raise ValueError(f"stages: cannot cut {len(layers)} layers into {stages} stages "
                         "(each stage needs at least one layer)")
    if costs is None:
        costs = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    costs = list(costs)
    if len(costs) != len(layers):
        raise ValueError(f"costs: expected {len(layers)} non-negative numbers, got {costs}")
    costs = [check_real("costs", c, f"{len(layers)} finite non-negative numbers", low=0, whole=costs) for c in costs]
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def cost(i, j):  # layers i..j-1
        return prefix[j] - prefix[i]

    L, inf = len(layers), float("inf")
    # best[k][j]: the smallest largest-stage cost of layers[:j] in k stages
    best = [[inf] * (L + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, L + 1):
            best[k][j] = min(max(best[k - 1][i], cost(i, j)) for i in range(k - 1, j))
    limit = best[stages][L] * (1 + slack) + 1e-12 * prefix[-1]
    # then, within that limit, the fewest cuts after a non-neuron layer
    penalty = [[inf] * (L + 1) for _ in range(stages + 1)]
    came_from = [[0] * (L + 1) for _ in range(stages + 1)]
    penalty[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, L + 1):
            after_neuron = j == L or isinstance(layers[j - 1], LIF)
            for i in range(k - 1, j):
                if cost(i, j) <= limit and penalty[k - 1][i] + (not after_neuron) < penalty[k][j]:
                    penalty[k][j], came_from[k][j] = penalty[k - 1][i] + (not after_neuron), i
    bounds, j = [L], L
    for k in range(stages, 0, -1):
        j = came_from[k][j]
        bounds.append(j)
    bounds.reverse()
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def check_layers(layers: Sequence[nn.Module], batch_norm: str = "refuse") -> None:
    """Raise ValueError, naming the layer, for a layer the pipeline cannot run exactly."""
    if batch_norm not in BATCH_NORM:
        raise ValueError(f"batch_norm: unknown policy {batch_norm!r}; expected one of {list(BATCH_NORM)}")
    for i, layer in enumerate(layers):
        name = f"layer {i} ({type(layer).__name__})"
        if isinstance(layer, BNLIF):
            raise ValueError(f"batch_norm: {name} fuses batch norm with neurons whose state a pipeline "
                             "cannot hand over between chunks; use TemporalBatchNorm followed by LIF")
        if isinstance(layer, nn.modules.batchnorm._BatchNorm) and batch_norm == "refuse":
            raise ValueError(f"batch_norm: {name} normalizes over all T steps, which a pipeline sees one "
                             "chunk at a time; use a network without batch norm, or batch_norm='per_chunk' "
                             "for statistics per chunk (not equal to single-device training)")
        if isinstance(layer, CARRIES_NO_STATE_HERE):
            raise ValueError(f"layers: {name} has state the pipeline does not carry between time chunks "
                             "(it would restart at every chunk: not single-device training); the pipeline "
                             "runs LIF, IF and PLIF neurons")
        if isinstance(layer, LIF) and layer.grad_scope != "step" and layer.grad_threshold > float("-inf"):
            raise ValueError(f"grad_scope: {name} decides its gradient cut over the whole sequence "
                             f"({layer.grad_scope!r}), which a pipeline sees one chunk at a time; use "
                             "grad_scope='step'")
        if not isinstance(layer, LIF) and any(
                isinstance(m, (LIF, nn.modules.batchnorm._BatchNorm)) for m in layer.modules() if m is not layer):
            raise ValueError(f"layers: {name} holds neurons or batch norm inside; pass the network's "
                             "layers flat (an nn.Sequential of Linear/Conv, LIF, ... layers)")


# ---- the trainer ----

class PipelineTrainer:
    """This rank's stage of a pipelined network, and its training step.

    Every rank builds the same network (same seed) and passes its layers (an nn.Sequential
    or a list; e.g. model.layers of the spikefuse models, whose time-mean readout then
    belongs in loss_fn); the trainer cuts them into one stage per rank of `group` (default:
    balanced by parameter count, or `cut`, ranges of layer indices) and keeps its own.
    `stage` is an nn.Sequential of those layers under their original indices, so its
    state_dict keys are the full network's. Give the optimizer `trainer.parameters()`.

    loss_fn(outputs, target) -> scalar, where outputs are the last layer's [T, B, ...].
    chunks: C, the number of time chunks (1 <= C <= T; C need not divide T).
    stages: if given, must equal the group's size (a named error otherwise).
    batch_norm: "refuse" or "per_chunk" (see the module docstring).
    pack_spikes: hand a stage's output over as bits when the stage ends in neurons.
    timeout: seconds to wait for a neighbour before PipelinePeerError (default: the group's).
    device: where this stage's layers go (the network is built anywhere, e.g. on the CPU).
    weight_grad_lag: how many chunks' weight gradients this stage holds back in backward, so that
        the input gradients the stage before waits for go out first (default: 2k + 1 on stage
        k > 0, 0 on the first; the gradients are the same bits whatever the lag).
    """

    def __init__(self, layers: Sequence[nn.Module], loss_fn: Callable, chunks: int, group=None, *,
                 stages: int | None = None, cut: Sequence[range] | None = None, batch_norm: str = "refuse",
                 pack_spikes: bool = True, timeout: float | None = None, device=None,
                 weight_grad_lag: int | None = None):
        layers = list(layers)
        check_layers(layers, batch_norm)
        _check_chunks(chunks)
        pack_spikes = check_flag("pack_spikes", pack_spikes)
        if device is not None:  # NaN was taken and ignored, 2**70 or '3' failed inside .to()
            from ..data.registry import check_device
            device = check_device(device)
        self.peers = _Peers(_handoff_group(group), timeout)
        if stages is not None and check_count("stages", stages) != self.peers.size:
            raise ValueError(f"stages: {stages} stages asked for, but the process group has {self.peers.size} "
                             "ranks; run one process per stage")
        if cut is None:
            cut = split_stages(layers, self.peers.size)
        cut = [range(r.start, r.stop) for r in cut]
        if len(cut) != self.peers.size or [r.start for r in cut[1:]] != [r.stop for r in cut[:-1]] \
                or cut[0].start != 0 or cut[-1].stop != len(layers) or any(len(r) < 1 for r in cut):
            raise ValueError(f"cut: expected {self.peers.size} consecutive non-empty ranges covering layers "
                             f"0..{len(layers) - 1} (one per rank), got {cut}")
        self.cut, self.chunks, self.batch_norm = cut, int(chunks), batch_norm
        self.loss_fn, self.pack_spikes = loss_fn, pack_spikes
        self.weight_grad_lag = _check_lag(weight_grad_lag)
        own = cut[self.peers.index]
        self.stage = nn.Sequential(OrderedDict((str(i), layers[i]) for i in own))
        if device is not None:
            self.stage.to(device)
        self.outputs: torch.Tensor | None = None  # the last stage's outputs of the latest step
        self.peers.check_all_present()

    @property
    def stage_index(self) -> int:
        return self.peers.index

    @property
    def is_last(self) -> bool:
        return self.peers.last

    def parameters(self):
        return self.stage.parameters()

    def named_parameters(self):
        """Names as in the full nn.Sequential ("3.weight")."""
        return self.stage.named_parameters()

    def step(self, x: torch.Tensor | None, target=None) -> torch.Tensor:
        """Forward and backward of one batch; the loss (every rank gets it) and .grad on this
        stage's parameters (accumulated, as loss.backward() would). x [T, B, ...] is needed
        on the first stage only (elsewhere, if given, only its shape is checked), the
        target on the last only."""
        loss, self.outputs = _step(list(self.stage), x, target, self.loss_fn, self.chunks, self.peers,
                                   self.pack_spikes, self.weight_grad_lag)
        return loss

    def captured(self, optimizer: torch.optim.Optimizer | None = None, *, warmup: int = 3) -> Callable:
        """This stage's training step as CUDA-graph replays: step(x, target) -> loss runs
        forward, backward and, if given, optimizer.step(), with the chunk hand-offs (NCCL
        point-to-point) inside the graph, so the host issues one launch per step instead of
        a few hundred per chunk (spikefuse.capture.CapturedStep: `warmup` eager steps
        per input shape, then one capture; every rank captures the same step and all replay
        or, if capturing fails anywhere, all run eagerly with a CaptureFallback warning).

        Call it on every rank at the same steps, as step(): x [T, B, ...] on the first stage,
        elsewhere x or just T (an int); the target on the last stage (ignored elsewhere).
        After each call every parameter's .grad holds that step's gradient (set, not
        accumulated); the optimizer must be capturable (prepare_optimizer is applied to it).
        On the CPU (gloo) the same function runs eagerly."""
        from ..capture import CapturedStep, prepare_optimizer

        device = next(iter(self.parameters()), torch.empty(0)).device
        if optimizer is not None and device.type == "cuda":
            why = prepare_optimizer(optimizer)
            if why is not None:
                raise ValueError(f"optimizer: {why}")
        params = list(self.parameters())
        first, last = self.peers.first, self.peers.last

        def run(x, target):  # grads set to None: the graph's backward makes them in its pool
            for p in params:
                p.grad = None
            loss = self.step(x if first else None, target if last else None)
            if optimizer is not None:
                optimizer.step()
            return loss, [p.grad for p in params]
        graphs = CapturedStep(run, warmup=warmup, enabled=device.type == "cuda", name="pipeline step",
                              agree_across=self.peers.group)
        clocks = {}  # T -> a tensor [T]: the input that stands for x or the target on other stages

        def clock(T):
            if T not in clocks:
                clocks[T] = torch.empty(T, device=device)
            return clocks[T]

        def step(x, target=None):
            T = x if isinstance(x, int) and not isinstance(x, bool) else getattr(x, "shape", (None,))[0]
            if not (isinstance(T, int) and T >= 1) or (first and isinstance(x, int)):
                raise ValueError(f"x: expected the input [T, B, ...]{'' if first else ' or its length T'}, "
                                 f"got {x!r:.80}")
            if last and not isinstance(target, torch.Tensor):
                raise ValueError(f"target: the last stage needs the target as a tensor, got {type(target).__name__}")
            loss, grads = graphs(x if first else clock(T), target if last else clock(T))
            for p, g in zip(params, grads):  # the graph's gradients, whatever .grad was set to since
                p.grad = g
            return loss
        step.graphs = graphs
        return step


HANDOFF_CTAS = 4  # NCCL thread blocks per hand-off kernel (PipelineTrainer's own communicator)
_handoff_groups: dict = {}  # parent group -> its capped twin: one communicator however many trainers


def _handoff_group(group):
    """The group a PipelineTrainer's hand-offs travel on. On NCCL: a communicator of its own
    over the same ranks (with the same timeout) whose kernels take at most HANDOFF_CTAS SMs.
    A receive posted ahead spins on its SMs while the stage computes; with NCCL's default
    count the first stage's 2048-wide input-gradient GEMMs (128 tiles, one wave on an
    H200's 132 SMs) ran in two waves, 80 instead of 49 us. Measured on 2 H200s (deep-lif,
    B = 16, against the hand-offs on `group` itself): 2.5 %, 0.8 % and 2.7 % shorter steps at
    T = 1024, 4096 and 16384; 1 block (through NCCL_MAX_CTAS) was 4-15 % slower, the
    transfers slowing down. Elsewhere: `group` itself. Every rank of the group constructs its
    trainers at the same points, so the communicator is made in step."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend(group) != "nccl":
        return group
    parent = group if group is not None else dist.group.WORLD
    if parent not in _handoff_groups:
        options = dist.ProcessGroupNCCL.Options()
        options.config.max_ctas = HANDOFF_CTAS
        timeout = parent._get_backend(torch.device("cuda")).options._timeout  # the parent's (new_group sets it)
        _handoff_groups[parent] = dist.new_group(dist.get_process_group_ranks(parent), timeout=timeout,
                                                 backend="nccl", pg_options=options,
                                                 use_local_synchronization=group is not None)
    return _handoff_groups[parent]


def pipeline_step(stage: nn.Sequential, x: torch.Tensor | None, target, loss_fn: Callable, chunks: int,
                  group=None, *, batch_norm: str = "refuse", pack_spikes: bool = True,
                  timeout: float | None = None, return_outputs: bool = False, weight_grad_lag: int | None = None):
    """One pipelined training step of this rank's `stage` (its rank in `group` is its place
    in the pipeline; see PipelineTrainer for the arguments). Returns the loss on every rank
    (with return_outputs, also the last stage's outputs [T, B, ...], None elsewhere) and
    leaves .grad on the stage's parameters."""
    layers = list(stage)
    check_layers(layers, batch_norm)
    _check_chunks(chunks)
    pack_spikes, return_outputs = check_flag("pack_spikes", pack_spikes), check_flag("return_outputs", return_outputs)
    loss, outputs = _step(layers, x, target, loss_fn, chunks, _Peers(group, timeout), pack_spikes,
                          _check_lag(weight_grad_lag))
    return (loss, outputs) if return_outputs else loss


def chunked_step(layers: Sequence[nn.Module], x: torch.Tensor, target, loss_fn: Callable, chunks: int, *,
                 batch_norm: str = "refuse", return_outputs: bool = False):
    """The pipeline's step on this process alone, whatever torch.distributed is doing: one
    stage, C chunks, exact BPTT through the chunk boundaries (what each stage does, but the
    hand-offs; the planner times it). Same returns as pipeline_step."""
    layers = list(layers)
    check_layers(layers, batch_norm)
    _check_chunks(chunks)
    return_outputs = check_flag("return_outputs", return_outputs)
    loss, outputs = _step(layers, x, target, loss_fn, chunks, _Peers(None, None, alone=True), False)
    return (loss, outputs) if return_outputs else loss


def _step(layers, x, target, loss_fn, chunks, peers, pack_spikes, weight_grad_lag=None):
    if x is not None:
        _check_input(x, chunks)
    elif peers.first:
        raise ValueError("x: the first stage needs the input [T, B, ...], got None")
    peers.device = _stage_device(layers, x, peers)
    later = []  # the weight gradients of the chunk at hand, computed after its input gradient is sent
    with weight_grad_queue.deferring(later):
        records, chunk_outputs = _forward(layers, x, chunks, peers, pack_spikes)
    loss = outputs = output_grads = None
    if peers.last:
        outputs = torch.cat(chunk_outputs)
        loss = loss_fn(outputs, target)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"loss_fn: expected a scalar tensor, got {loss!r}")
        output_grads = torch.autograd.grad(loss, chunk_outputs, allow_unused=True)
        loss, outputs = loss.detach().float().reshape(()), outputs.detach()
    _backward(records, output_grads, peers, later, _lag(weight_grad_lag, peers.index))
    return peers.share_loss(loss), outputs


def _lag(asked: int | None, index: int) -> int:
    """How many chunks' weight gradients stage `index` keeps waiting in backward. The default
    covers the drain: after stage k's last input gradient, each stage before it still runs
    its last chunk's input gradients (about 1/3 of a chunk's work, as the forward and the
    weight gradients are) and hands them on, and the first stage its weight gradients too,
    while one chunk's weight gradients are about 1/3 of a chunk's work: k + 1 chunks with free
    hand-offs, 2k + 1 leaving one chunk per stage for them (k = 1, 3 chunks: measured in
    docs/parallel.md). The first stage has no one waiting for it."""
    return (2 * index + 1 if index > 0 else 0) if asked is None else asked


# ---- one step: forward over the chunks, then backward in reverse ----

class _Box:
    """Where a gradient is put (or found) outside autograd's own bookkeeping."""
    grad: torch.Tensor | None = None


class _ReceivedInput(torch.autograd.Function):
    """Identity on a received chunk that records the chunk's gradient: as a leaf, the chunk
    would stay alive (held by its AccumulateGrad) until the end of the step."""

    @staticmethod
    def forward(ctx, trigger, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.box.grad = grad
        return None, None, None


class _OutputAnchor(torch.autograd.Function):
    """A scalar handle on a chunk's output graph whose backward feeds in the gradient put in
    its box: backward can start from it while the output itself (sent on) is freed."""

    @staticmethod
    def forward(ctx, y, box):
        ctx.box = box
        return y.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        return ctx.box.grad, None


@dataclass
class _Chunk:
    """What the backward of one chunk needs from its forward."""
    anchor: torch.Tensor | None  # None if the output needs no gradient
    out_box: _Box
    out_shape: torch.Size
    out_dtype: torch.dtype
    in_box: _Box | None  # the input's gradient (stages after the first)
    in_shape: torch.Size | None
    in_dtype: torch.dtype | None
    v0: list  # per layer: the neurons' initial state (a leaf), else None
    vT: list  # per layer: the neurons' final state, else None


def _run_layers(layers, x, v0):
    """The stage on one chunk, its neurons starting from v0; returns (output, final states)."""
    vT = []
    for layer, v in zip(layers, v0):
        if isinstance(layer, LIF):
            x, v = F.lif(x, v0=v, return_state=True, **_lif_options(layer))
        else:
            x, v = layer(x), None
        vT.append(v)
    return x, vT


def _lif_options(m: LIF) -> dict:
    """The options spikefuse.nn.LIF.forward passes to spikefuse.functional.lif."""
    return dict(decay=m.decay_value(), threshold=m.threshold, reset=m.reset, v_reset=m.v_reset,
                detach_reset=m.detach_reset, surrogate=m.surrogate, alpha=m.alpha, backend=m.backend,
                grad_threshold=m.grad_threshold, grad_scope=m.grad_scope)


def _forward(layers, x, chunks, peers, pack_spikes):
    """Runs the chunks in order; returns their records and (last stage) their outputs as leaves."""
    if peers.first:
        T, pieces = x.shape[0], x.tensor_split(chunks)
    else:
        T, incoming = peers.receive_header(chunks)
    sizes = _chunk_sizes(T, chunks)
    pack = pack_spikes and isinstance(layers[-1], LIF)  # a neuron layer's output is 0/1: exact as bits
    trigger = torch.zeros((), device=peers.device, requires_grad=True)
    states, records, outputs = [None] * len(layers), [], []
    for c in range(chunks):
        if peers.first:
            x_c, received, in_box = pieces[c], None, None
        else:
            received = incoming.result()
            if c + 1 < chunks:  # the next chunk streams in while this one computes
                incoming = peers.receive_chunk(c + 1, sizes[c + 1])
            in_box = _Box()
            x_c = _ReceivedInput.apply(trigger, received, in_box)
            bits = spike_pack.attached_bits(received)
            if bits is not None:  # a spiking layer reading x_c saves these bits instead of packing again
                spike_pack.attach_bits(x_c, bits)
        v0 = [s.detach().requires_grad_(s.requires_grad) if s is not None else None for s in states]
        y, states = _run_layers(layers, x_c, v0)
        out_box = _Box()
        anchor = _OutputAnchor.apply(y, out_box) if y.requires_grad else None
        records.append(_Chunk(anchor, out_box, y.shape, y.dtype, in_box, getattr(received, "shape", None),
                              getattr(received, "dtype", None), v0, states))
        if peers.last:
            outputs.append(y.detach().requires_grad_(y.requires_grad))
        else:
            peers.send_chunk(y.detach(), c, T, chunks, pack)
        del y, x_c, received
    peers.flush()
    return records, outputs


def _backward(records, output_grads, peers, later, lag):
    chunks = len(records)
    waiting = deque()  # per chunk, oldest first: weight-gradient work held back by `lag`
    carried = [None] * len(records[-1].v0)  # per layer: dL/dv[T-1] of the chunk at hand
    if not peers.last:
        incoming = peers.receive_grad(chunks - 1, records[-1].out_shape, records[-1].out_dtype)
    for c in reversed(range(chunks)):
        rec = records[c]
        if peers.last:
            grad = output_grads[c]
        else:
            grad = incoming.result()
            if c > 0:  # the next gradient streams in while this chunk runs backward
                incoming = peers.receive_grad(c - 1, records[c - 1].out_shape, records[c - 1].out_dtype)
        roots, grads = [], []
        if rec.anchor is not None and grad is not None:
            rec.out_box.grad = grad
            roots.append(rec.anchor)
            grads.append(torch.ones_like(rec.anchor))
        for v, g in zip(rec.vT, carried):
            if v is not None and g is not None and v.requires_grad:
                roots.append(v)
                grads.append(g)
        if roots:
            torch.autograd.backward(roots, grads)
        carried = [v.grad if v is not None and v.requires_grad else None for v in rec.v0]
        if not peers.first:
            g_in = rec.in_box.grad
            if g_in is None:  # the input did not reach the loss
                g_in = torch.zeros(rec.in_shape, dtype=rec.in_dtype, device=peers.device)
            peers.send_grad(g_in, c)
        waiting.append(later[:])
        later.clear()
        while len(waiting) > lag:
            weight_grad_queue.run(waiting.popleft())
        records[c] = None  # this chunk's graph is done: free it
    while waiting:  # the drain: the stages before finish their last chunks meanwhile
        weight_grad_queue.run(waiting.popleft())
    peers.flush()


# ---- talking to the neighbouring stages ----

class _Incoming:
    """A posted receive; result() waits for it (once: a second wait on a gloo receive would wait
    for another message) and returns the tensor."""

    def __init__(self, peers, work, buffer, finish, what, peer):
        self.peers, self.work, self.buffer, self.finish, self.what, self.peer = \
            peers, work, buffer, finish, what, peer
        self.value = None

    def result(self) -> torch.Tensor:
        if self.value is None:
            self.peers.wait(self.work, self.what, self.peer)
            self.value = self.finish(self.buffer)
        return self.value


class _Peers:
    """This rank's place in the pipeline and the point-to-point traffic with its neighbours."""

    def __init__(self, group, timeout, alone=False):
        if timeout is not None:  # "3" raised from '>'; inf or 2**70 overflowed timedelta at the first wait
            timeout = check_real("timeout", timeout, f"a number of seconds > 0 and at most {MAX_TIMEOUT:.0f}",
                                 low_open=0, high=MAX_TIMEOUT)
        self.timeout = timeout
        if not alone and dist.is_available() and dist.is_initialized():
            self.group = group if group is not None else dist.group.WORLD
            self.size, self.index = dist.get_world_size(self.group), dist.get_rank(self.group)
            if self.index < 0:
                raise ValueError("group: this rank is not a member of the group")
            self.gloo = dist.get_backend(self.group) == "gloo"
        elif group is not None and not alone:
            raise ValueError("group: torch.distributed is not initialized; call init_process_group first")
        else:
            self.group, self.size, self.index, self.gloo = None, 1, 0, True
        self.first, self.last = self.index == 0, self.index == self.size - 1
        self.prev = self._global(self.index - 1) if not self.first else None
        self.next = self._global(self.index + 1) if not self.last else None
        self.device = torch.device("cpu")  # where buffers are made; set per step
        self.pending = []  # sends in flight, with the buffers they read
        self.meta = None  # (trailing shape, dtype, packed) of the chunks coming in
        # the last step's header, each way: a step being captured in a CUDA graph cannot read
        # one on the host, so it reuses these (its eager warm-up steps had the same shapes)
        self.header_sent: list | None = None
        self.header_received: tuple | None = None

    def _global(self, index):
        return dist.get_global_rank(self.group, index)

    def _describe(self, peer):
        return f"rank {peer} (stage {dist.get_group_rank(self.group, peer)})"

    @contextlib.contextmanager
    def _guard(self, what, peer):
        """A failed or timed-out exchange as a PipelinePeerError naming the peer."""
        try:
            yield
        except RuntimeError as e:
            within = f" {self.timeout:g} s" if self.timeout is not None else " the group's timeout"
            raise PipelinePeerError(
                f"pipeline stage {self.index} (rank {dist.get_rank()}): {what} with {self._describe(peer)} "
                f"failed or ran past{within}: that rank died or stalled ({one_line(e)})") from e

    def wait(self, work, what, peer):
        with self._guard(what, peer):
            if self.gloo and self.timeout is not None:
                work.wait(datetime.timedelta(seconds=self.timeout))
            else:  # NCCL: the current stream waits, not the host; the group's watchdog times out
                work.wait()

    def check_all_present(self):
        """On gloo: a monitored barrier, so that a rank that never came up is named now."""
        if self.size == 1 or not self.gloo:
            return
        timeout = datetime.timedelta(seconds=self.timeout) if self.timeout is not None else None
        try:
            dist.monitored_barrier(self.group, timeout=timeout, wait_all_ranks=True)
        except RuntimeError as e:
            raise PipelinePeerError(f"pipeline stage {self.index} (rank {dist.get_rank()}): not every "
                                    f"stage came up ({one_line(e)})") from e

    def capturing(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    def _send(self, tensor, peer, tag, what):
        while not self.capturing() and self.pending and self.pending[0][0].is_completed():  # buffers may go
            work, _, what_before, peer_before = self.pending.pop(0)
            self.wait(work, what_before, peer_before)  # (raises if it failed)
        with self._guard(what, peer):
            work = self._post(dist.isend, tensor, peer, tag)
        self.pending.append((work, tensor, what, peer))

    def _recv(self, buffer, peer, tag, finish, what):
        with self._guard(what, peer):
            work = self._post(dist.irecv, buffer, peer, tag)
        return _Incoming(self, work, buffer, finish, what, peer)

    def _post(self, op, tensor, peer, tag):
        if self.gloo:
            return op(tensor, peer, group=self.group, tag=tag)
        # NCCL: as a batch (of one), which runs on the group's communicator without serialising
        # with the group's other ops (an unbatched send/recv does, and NCCL says so on stderr)
        (work,) = dist.batch_isend_irecv([dist.P2POp(op, tensor, peer, self.group, tag)])
        return work

    def flush(self):
        """Wait for the sends in flight (their buffers may be reused after)."""
        while self.pending:
            work, _, what, peer = self.pending.pop(0)
            self.wait(work, what, peer)

    # forward: a header once per step, then the chunks
    def send_chunk(self, y, c, T, chunks, pack):
        if c == 0:
            shape = y.shape[1:]
            if len(shape) > _HEADER_WORDS - 5:
                raise ValueError(f"a stage output of shape {tuple(y.shape)} has too many dims to hand over")
            words = [T, chunks, _DTYPES.index(y.dtype), int(pack), len(shape), *shape]
            if self.capturing():  # the receiver reuses the header of the eager step before
                if words != self.header_sent:
                    raise RuntimeError(f"a captured pipeline step sends chunks {words} unlike the eager step "
                                       f"before it ({self.header_sent}); capture after an eager step of the "
                                       "same shapes")
            else:
                header = torch.tensor(words + [0] * (_HEADER_WORDS - len(words)), dtype=torch.int64)
                self._send(header.to(self.device), self.next, _HEADER_TAG, "sending the step's header")
                self.header_sent = words
        payload = spike_pack.pack(y) if pack else y.contiguous()
        self._send(payload, self.next, 1 + 2 * c, f"sending output chunk {c}")

    def receive_header(self, chunks):
        """T, and the receive of chunk 0 posted, once the step's header is in (while capturing:
        the header of the eager step before)."""
        if self.capturing():
            if self.header_received is None:
                raise RuntimeError("a pipeline step can only be captured after an eager step of the same shapes")
            T, sent_chunks, dtype, packed, ndim, *shape = self.header_received
        else:
            header = torch.zeros(_HEADER_WORDS, dtype=torch.int64, device=self.device)
            self._recv(header, self.prev, _HEADER_TAG, lambda b: b, "receiving the step's header").result()
            self.header_received = T, sent_chunks, dtype, packed, ndim, *shape = header.tolist()
        if sent_chunks != chunks:
            raise ValueError(f"chunks: this stage has chunks={chunks}, the previous stage chunks={sent_chunks}; "
                             "every rank must use the same")
        self.meta = (tuple(shape[:ndim]), _DTYPES[dtype], bool(packed))
        return T, self.receive_chunk(0, _chunk_sizes(T, chunks)[0])

    def receive_chunk(self, c, size):
        shape, dtype, packed = self.meta
        full = (size, *shape)
        if packed:
            buffer = torch.empty((torch.Size(full).numel() + 7) // 8, dtype=torch.uint8, device=self.device)
            return self._recv(buffer, self.prev, 1 + 2 * c, lambda b: _unpack(b, full, dtype),
                              f"receiving input chunk {c}")
        buffer = torch.empty(full, dtype=dtype, device=self.device)
        return self._recv(buffer, self.prev, 1 + 2 * c, lambda b: b, f"receiving input chunk {c}")

    # backward: the chunks' gradients, last chunk first
    def send_grad(self, grad, c):
        self._send(grad.contiguous(), self.prev, 2 + 2 * c, f"sending the gradient of input chunk {c}")

    def receive_grad(self, c, shape, dtype):
        buffer = torch.empty(shape, dtype=dtype, device=self.device)
        return self._recv(buffer, self.next, 2 + 2 * c, lambda b: b, f"receiving the gradient of output chunk {c}")

    def share_loss(self, loss):
        """The last stage's loss (float32), on every rank."""
        if self.size == 1:
            return loss
        buffer = loss if loss is not None else torch.zeros((), device=self.device)
        last = self._global(self.size - 1)
        with self._guard("the loss broadcast", last):
            work = dist.broadcast(buffer, last, group=self.group, async_op=True)
        self.wait(work, "the loss broadcast", last)
        return buffer


def _unpack(bits, shape, dtype):
    spikes = spike_pack.unpack(bits, shape, dtype)
    spike_pack.attach_bits(spikes, bits)
    return spikes


# ---- argument checks ----

MAX_TIMEOUT = datetime.timedelta.max.total_seconds()  # the longest wait datetime.timedelta holds


def check_count(name: str, value, most: int = MAX_INT) -> int:
    """An int in [1, most] (check_int's test; bools and floats refused), refused in this package's
    words, "name: expected ...", which the planner's command line maps to its option names."""
    try:
        return check_int(name, value, 1, most)
    except ValueError:  # check_int's ArgumentError is one too
        over = isinstance(value, int) and not isinstance(value, bool) and value > most
        raise ValueError(f"{name}: expected an integer {f'from 1 to {most}' if over else '>= 1'}, "
                         f"got {value!r}") from None


def check_real(name: str, value, expected: str, whole=None, **bounds) -> float:
    """A finite number within check_number's bounds, refused as "name: expected <expected>, got ..."."""
    try:
        return check_number(name, value, **bounds)
    except ValueError:
        raise ValueError(f"{name}: expected {expected}, got {value if whole is None else whole!r}") from None


def _check_lag(lag):
    if lag is not None and (isinstance(lag, bool) or not isinstance(lag, int) or lag < 0):
        raise ValueError(f"weight_grad_lag: expected an integer >= 0 or None (the default), got {lag!r}")
    return lag


def _check_chunks(chunks):
    check_count("chunks", chunks)  # a larger count than T is refused with the input (_check_input)


def _check_input(x, chunks):
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x: expected a time-major tensor [T, B, ...], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if chunks > x.shape[0]:
        raise ValueError(f"chunks: {chunks} chunks of a sequence of T={x.shape[0]} steps; "
                         "expected 1 <= chunks <= T")


def _chunk_sizes(T, chunks):
    """Steps per chunk, as tensor_split cuts: the first T % chunks chunks one step longer."""
    return [T // chunks + (c < T % chunks) for c in range(chunks)]


def _stage_device(layers, x, peers):
    for layer in layers:
        for p in layer.parameters():
            return p.device
    if x is not None:
        return x.device
    if not peers.gloo and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
