"""Data parallel's gradient all-reduce, overlapped with backward, without DistributedDataParallel.

    reducer = GradientReducer(model, group)     # rank 0's weights copied to every rank
    loss.backward()                             # buckets all-reduce as their gradients arrive
    reducer.finish()                            # every gradient is now the ranks' mean
    optimizer.step()

or, where the update needs nothing but each parameter's own gradient and state (no clipping
by the global norm, no fp16 gradient scaling: both must see every gradient first):

    reducer = GradientReducer(model, group, optimizer=optimizer)
    loss.backward()
    reducer.finish()                            # averaged and stepped

In captured steps each bucket's parameters are then stepped as soon as the bucket's mean is
ready, on the bucket's stream while backward goes on, instead of all after the last bucket.
(SGD took 98 us of the captured CIFAR-medium step's tail on 2 H100s; moved beside backward it
shares the GPU's memory with it, and the step measured no faster on 2 H200s, docs/parallel.md.)

Why not DDP: inside a captured step DDP's bookkeeping cost ~0.3 ms of an 11 ms CIFAR-medium step
on 2 H100s, measured with a comm hook that sends nothing (docs/parallel.md). Its gradients live
in its buckets, so every backward adds each parameter's gradient into a zeroed bucket view (a
zero pass plus one add kernel per parameter) and the default hook divides every bucket
before sending it. Here autograd hands each gradient over as it is, a post-accumulate hook
marks it ready, and each bucket goes out as one all-reduce averaged by NCCL itself (AVG):
its gradients copied into one flat tensor (one kernel), which then holds them. On 2 H100s the
captured SyncBN step ran at 1.915x one GPU's throughput, against 1.895x under DDP in the same run.
From the second step on the buckets travel through GPU peer memory instead, pulled by the copy
engines (grad_peer.py): captured, 1.935x in the same setting (0.05-0.13 ms a step less than
NCCL's); eager, 0.6-2.3 ms a step less than NCCL's (2 H200s, three alternated pairs on two instances).

Buckets are launched strictly in order on every rank, so the collectives match across ranks
whatever order the hooks fire in. They are cut from the order in which gradients became
ready in the first backward (rank 0's, shared with the others), small at both ends: the
first goes out early, and the last, which waits for the end of backward, is short.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ..ops import grad_rows
from ..optim import steps_each_parameter_alone
from . import peer_memory
from .grad_peer import PeerBuckets, buffer_bytes, servable

BUCKET_MB = 4.0   # a bucket's size; the first and the last are cut at EDGE_MB
EDGE_MB = 1.0
PEER_MEMORY_SHARE = 1 / 16  # "auto" takes peer buckets while their buffers fit in this share of the GPU


class GradientReducer:
    """Averages the gradients of `model`'s parameters over `group`'s ranks during backward.

    Every rank must produce gradients for the same parameters at every step (a parameter
    that got none is given zeros). fp16 gradient scaling and clipping work on the averaged
    gradients after finish(), so every rank clips and skips alike."""

    TRANSPORTS = ("auto", "nccl", "peer")

    def __init__(self, model: nn.Module, group=None, *, bucket_mb: float = BUCKET_MB, buffers=(),
                 transport: str = "auto", optimizer: torch.optim.Optimizer | None = None):
        """buffers: tensors that ranks may update differently (running statistics of BN layers
        that are not synchronised): sync_buffers() copies rank 0's to every rank, as DDP does
        before each forward. transport: how the buckets travel from the second step on (the
        first, which learns their cut, always takes torch.distributed's all-reduce):
        "nccl" (torch.distributed.all_reduce on the group's backend), "peer" (GPU peer memory
        and copy engines, grad_peer.py; every rank on this host with a GPU of its own, an NCCL
        group, float32 parameters; it holds ranks + 1 copies of the gradients), "auto" ("peer"
        where it works and those copies fit in 1/16 of the GPU's memory, else "nccl";
        peer_unavailable says why not). optimizer: finish() steps it too; in
        steps captured in a CUDA graph bucket by bucket as their means arrive (overlapping the
        rest of backward), in eager steps once after the last bucket (each step() call costs
        the host ~0.1 ms). Every update is the one a whole step gives, bit for bit, only where
        it depends on nothing but a parameter's own gradient and state (torch's SGD, Adam,
        AdamW, LazyAdam): not with clipping by the global norm or fp16 gradient scaling."""
        if not dist.is_initialized():
            raise RuntimeError("GradientReducer needs an initialised process group (init_data_parallel)")
        if not (isinstance(bucket_mb, (int, float)) and not isinstance(bucket_mb, bool) and bucket_mb > 0):
            raise ValueError(f"bucket_mb: expected a size in MB > 0, got {bucket_mb!r}")
        if transport not in self.TRANSPORTS:
            raise ValueError(f"transport: expected one of {', '.join(self.TRANSPORTS)}, got {transport!r}")
        self.transport, self.peer, self.peer_unavailable = transport, None, None
        self._last = None  # the transport of the last finished step
        self.group, self.bucket_bytes = group, bucket_mb * 2**20
        self.world = dist.get_world_size(group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if len({p.device for p in self.params}) > 1:
            raise ValueError("model: its parameters are on several devices; data parallel keeps one per rank")
        if transport == "peer" and self.params:  # refused here rather than after the first step
            why_not = peer_memory.symmetric_unavailable(self.params[0], group)
            if why_not:
                raise RuntimeError(f"GradientReducer(transport='peer'): {why_not}")
        self.buffers = list(buffers)
        if optimizer is not None and not steps_each_parameter_alone(optimizer):
            raise ValueError(f"optimizer: {type(optimizer).__name__} may update a parameter from more than its own "
                             "gradient and state; step it after finish() instead")
        self.optimizer = optimizer
        self._step_stream = None  # where NCCL buckets' parameters are stepped, made at first use
        self.stepped_in_buckets = False  # whether the last finished step stepped the optimizer bucket by bucket
        _broadcast(list(model.parameters()) + list(model.buffers()), group)
        # NCCL averages in the all-reduce; gloo has no AVG: it sums, and finish() divides
        self.op = dist.ReduceOp.AVG if dist.get_backend(group) == "nccl" else dist.ReduceOp.SUM
        self.first_order: list[int] | None = []  # the ready order of the first backward, then None
        self._cut(list(range(len(self.params)))[::-1])  # until then: backward's usual order
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_ready) for p in self.params]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._begin()

    def _cut(self, order: list[int]) -> None:
        """Buckets over the parameters in `order`: up to bucket_bytes each, EDGE_MB at the ends."""
        edge = min(EDGE_MB * 2**20, self.bucket_bytes)
        sizes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        tail = len(order)  # the last bucket: the trailing parameters that fit in `edge`
        while tail > 1 and sum(sizes[tail - 1:]) <= edge:
            tail -= 1
        buckets, current, filled = [], [], 0.0
        for k, (i, size) in enumerate(zip(order, sizes)):
            cap = edge if not buckets else self.bucket_bytes
            if current and (filled + size > cap or k == tail):
                buckets.append(current)
                current, filled = [], 0.0
            current.append(i)
            filled += size
        buckets.append(current)
        self.buckets = buckets
        self.bucket_of = {i: b for b, members in enumerate(buckets) for i in members}

    def _begin(self) -> None:
        self.via_peer = False  # whether this step's buckets went through peer memory
        self._stepping = False  # whether this step's buckets step the optimizer as they finish
        self.missing = [len(b) for b in self.buckets]
        self.launched = 0
        self.pending = []

    def sync_buffers(self) -> None:
        """Rank 0's buffers on every rank (nothing to send where there are none); call it before
        each training forward."""
        _broadcast(self.buffers, self.group)

    def _on_ready(self, param: torch.Tensor) -> None:
        i = self._index[id(param)]
        b = self.bucket_of[i]
        if b < self.launched:
            raise RuntimeError("GradientReducer: a second backward reached a parameter before finish(); "
                               "call finish() after every backward (gradients are not accumulated over steps)")
        if self.first_order is not None:
            self.first_order.append(i)
        self.missing[b] -= 1
        while self.launched < len(self.buckets) and self.missing[self.launched] == 0:
            self._launch(self.launched)

    def _launch(self, b: int) -> None:
        params = [self.params[i] for i in self.buckets[b]]
        for p in params:
            if p.grad is None:  # no gradient reached it this step: zeros, as on every rank
                p.grad = torch.zeros_like(p)
            grad_rows.clear(p)  # a sparse backward's row list is this rank's, not the mean's
        # (a sparse gradient, the same on every rank, takes torch.distributed's all-reduce)
        stepping = self.optimizer is not None and capturing_on(params[0].device)
        if self.peer is not None and all(p.grad.layout == torch.strided for p in params):
            self.peer.launch(b, params)
            self.via_peer = True
            if stepping:
                with torch.cuda.stream(self.peer.stream):  # after the bucket's mean, on its stream
                    step_only(self.optimizer, params)
        else:
            work = _all_reduce(_flattened(params), self.op, self.group)
            self.pending.append(work)
            if stepping:
                self._step_after(work, params)
        self._stepping = stepping
        self.launched = b + 1

    def _step_after(self, work, params: list[torch.Tensor]) -> None:
        """Step `params` once their all-reduce `work` is done, beside the current stream
        (backward goes on)."""
        with self._side_stream(params[0].device):
            work.wait()  # this stream waits for the all-reduce, the host does not
            if self.op != dist.ReduceOp.AVG:
                torch._foreach_div_([p.grad for p in params], float(self.world))
            step_only(self.optimizer, params)

    @contextlib.contextmanager
    def _side_stream(self, device: torch.device):
        """Work queued after what the current stream holds, on a stream of its own (on the CPU,
        where gloo's tests run, in the host's order)."""
        if device.type != "cuda":
            yield
            return
        if self._step_stream is None:
            self._step_stream = torch.cuda.Stream(device)
        self._step_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._step_stream):
            yield

    def finish(self) -> None:
        """Wait for every bucket (launching those whose gradients did not all arrive): after it
        each parameter's .grad is the mean over the ranks, and the optimizer, if given, has
        stepped. Call it once after each backward."""
        while self.launched < len(self.buckets):
            self._launch(self.launched)
        for work in self.pending:
            work.wait()  # on CUDA: the current stream waits for the all-reduce, the host does not
        if self.via_peer:
            self.peer.finish()
        elif self.op != dist.ReduceOp.AVG and not self._stepping:
            torch._foreach_div_([p.grad for p in self.params], float(self.world))
        if self._stepping and self._step_stream is not None:
            torch.cuda.current_stream(self.params[0].device).wait_stream(self._step_stream)
        if self.optimizer is not None and not self._stepping:
            self.optimizer.step()
        elif self.optimizer is not None:  # the buckets stepped the model's; the optimizer's others now
            own = {id(p) for p in self.params}
            rest = [p for g in self.optimizer.param_groups for p in g["params"] if id(p) not in own]
            if rest:
                step_only(self.optimizer, rest)
        self._last = "peer" if self.via_peer else "nccl"
        self.stepped_in_buckets = self._stepping  # (the last finished step's)
        if self.first_order is not None:
            self._learn_order()
            self.peer = self._peer_buckets()
        self._begin()

    @property
    def transport_in_use(self) -> str | None:
        """How the last finished (or captured) step's buckets travelled: "peer" or "nccl"; None before."""
        return self._last

    def _peer_buckets(self) -> PeerBuckets | None:
        """Peer buckets for the cut just learnt, where the transport asks for them and they work."""
        if self.transport == "nccl":
            return None
        why_not = peer_unavailable(self.params, self.group, self.transport)
        self.peer_unavailable = why_not  # why the buckets stay with torch.distributed ('' where they need not)
        if why_not:
            if self.transport == "peer":
                raise RuntimeError(f"GradientReducer(transport='peer'): {why_not}")
            return None
        peer_memory.enable(self.group)
        sizes = [sum(self.params[i].numel() for i in bucket) for bucket in self.buckets]
        return PeerBuckets(sizes, self.params[0].device, self.group, dist.get_rank(self.group), self.world)

    def _learn_order(self) -> None:
        """Cut the buckets again from rank 0's ready order of the first backward (the same cut
        on every rank); parameters that never got a gradient go last."""
        seen = dict.fromkeys(self.first_order)
        order = list(seen) + [i for i in range(len(self.params)) if i not in seen]
        box = [order]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0,
                                   group=self.group)
        self.first_order = None
        self._cut(box[0])

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def capturing_on(device: torch.device) -> bool:
    """Whether the current stream of `device` is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def step_only(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """optimizer.step() over `params` alone: its groups narrowed to them for the call (their
    hyperparameters, learning-rate tensors included, and its state are the optimizer's own)."""
    ids = {id(p) for p in params}
    groups = optimizer.param_groups
    narrowed = [{**g, "params": [p for p in g["params"] if id(p) in ids]} for g in groups]
    optimizer.param_groups = [g for g in narrowed if g["params"]]
    try:
        optimizer.step()
    finally:
        optimizer.param_groups = groups


def peer_unavailable(params: list[torch.Tensor], group, transport: str = "auto") -> str:
    """Why the buckets of `params` cannot travel through peer memory under `transport` ("auto"
    or "peer"; '' where they can)."""
    why_not = peer_memory.symmetric_unavailable(params[0], group) if params else "no parameters"
    if not why_not and not servable(params):
        why_not = "it needs float32 parameters, each dense in memory"
    if not why_not and transport == "auto":
        why_not = too_large_for_peer(buffer_bytes(sum(p.numel() for p in params), dist.get_world_size(group)),
                                     torch.cuda.get_device_properties(params[0].device).total_memory)
    return why_not


def too_large_for_peer(held: int, gpu_memory: int) -> str:
    """Why "auto" leaves the buckets to NCCL on account of memory ('' where they fit): peer
    buckets hold (ranks + 1) copies of the gradients, which on a large model or many GPUs
    would crowd out training."""
    if held <= gpu_memory * PEER_MEMORY_SHARE:
        return ""
    return (f"its buffers ({held / 2**30:.1f} GiB: every rank's gradients and their mean) would take more than "
            f"1/{round(1 / PEER_MEMORY_SHARE)} of the GPU's {gpu_memory / 2**30:.0f} GiB")


def _flattened(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors to all-reduce for `params`' gradients: those of one dtype that are contiguous
    copied into one flat tensor, which then holds them (each .grad becomes a view of it); any
    other gradient as it is. One all-reduce per bucket through torch.distributed's public
    all_reduce, as DDP sends its buckets; on 2 H100s it took the CIFAR-medium step as long as
    NCCL's group of the 29 separate tensors (benchmarks/results/multi-gpu-2026-11-28)."""
    dtype = next((p.grad.dtype for p in params if p.grad.is_contiguous()), None)
    joined = [p for p in params if p.grad.dtype == dtype and p.grad.is_contiguous() and p.is_contiguous()]
    if len(joined) < 2:
        return [p.grad for p in params]
    flat = torch.cat([p.grad.view(-1) for p in joined])
    offset = 0
    for p in joined:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return [flat] + [p.grad for p in params if not any(p is q for q in joined)]


def _all_reduce(tensors: list[torch.Tensor], op, group):
    """One collective for `tensors`, in place, asynchronous: NCCL groups them into one launch."""
    coalescing = getattr(dist.distributed_c10d, "_coalescing_manager", None)
    if coalescing is None or len(tensors) == 1:
        works = [dist.all_reduce(t, op=op, group=group, async_op=True) for t in tensors]
        return _Works(works)
    with coalescing(group=group, async_ops=True) as manager:
        for t in tensors:
            dist.all_reduce(t, op=op, group=group)
    return manager


class _Works:
    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()


@torch.no_grad()
def _broadcast(tensors, group) -> None:
    """Rank 0's values of `tensors` on every rank: one broadcast per dtype (a BN layer's running
    statistics are a few small tensors, and each collective costs its latency)."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t.data)
    for same in by_dtype.values():
        if len(same) == 1:
            dist.broadcast(same[0], src=src, group=group)
            continue
        flat = torch.cat([t.reshape(-1) for t in same])
        dist.broadcast(flat, src=src, group=group)
        torch._foreach_copy_(same, [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in same]), same)])
