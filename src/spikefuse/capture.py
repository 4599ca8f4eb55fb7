"""A whole training step (forward, loss, backward, optimizer step, metric sums) captured in
one CUDA graph and replayed per batch, so the host issues one launch per step instead of
hundreds: small networks then run at the GPU's speed, not the host's.

    prepare_optimizer(optimizer)                 # capturable state, learning rate as a tensor
    step = CapturedStep(train_step)              # train_step(x, y) does the whole step
    for x, y in batches:
        loss = step(x, y)                        # eager warm-up, then capture, then replays

How it works. Each input signature (shapes, dtypes, device) gets its own graph: its first
`warmup` calls run eagerly on a side stream (they are real training steps, and they
initialise lazy state: optimizer moments, cuBLAS/cuDNN handles, autotuned kernels; with
background compiles on, more follow until a call ran no op's stand-in and no kernel is still
compiling, so that no stand-in is captured), the
next call copies its inputs into static buffers and captures, and every later call copies
into those buffers and replays. So the last, shorter batch of an epoch gets a second graph
after `warmup` epochs; until then it runs eagerly. `step_fn` must only read its arguments
and tensors that outlive it (parameters, gradients, optimizer state, buffers, accumulators
updated in place); what it returns is overwritten by the next call.

Provisional graphs (SPIKEFUSE_PROVISIONAL_GRAPHS=0 turns them off): from a cold Triton cache,
where kernels compile for seconds, the step is captured after its warm-ups with the stand-ins
it runs meanwhile (a provisional graph: a first epoch at the stand-ins' GPU speed instead of
their host speed), captured again once the kernels its stand-ins stood in for are ready (a LIF
layer's quick kernels, before its tuned ones), and again once nothing compiles. Where the
stand-ins cannot be captured, the step runs eagerly until its kernels are compiled, then is
captured as usual (no warning). A cold shd run (700-256-20 BN-LIF) reached its target in 1.2 s
with them and compile processes, 2.6 s without (4x H100, benchmarks/results/runs-2026-11-27-s17/).

Where capture is impossible it falls back to eager, with one warning naming the cause: CPU
tensors, more input shapes than `max_graphs` (dynamic shapes), or an error raised while
capturing (an op that syncs with the host, such as `.item()`, or allocates on the CPU).

Memory: the graphs share one private memory pool that holds a step's working memory (its
activations and temporaries, about the eager step's peak over the parameters and optimizer
state) for as long as this object lives; `pool_bytes` reports it. Parameter gradients live
in that pool too. Sharing is safe because nothing in the pool outlives a replay that
another graph could overwrite: persistent state exists before the first capture (warm-up).
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map

from .neuron_options import ArgumentError, check_int
from .ops import launch

__all__ = ["CapturedStep", "prepare_optimizer", "CaptureFallback"]


class CaptureFallback(UserWarning):
    """Issued once when a CapturedStep runs eagerly instead of replaying a CUDA graph."""


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> str | None:
    """Make `optimizer` steppable inside a CUDA graph, in place; returns None, or why it
    cannot be (then capture must not be used with it).

    The learning rate becomes a 0-d tensor on the parameters' device, so a scheduler that
    changes it between steps (LRScheduler fills tensors in place) reaches the graph instead
    of being frozen into it. Optimizers with a `capturable` flag (Adam, AdamW, RMSprop, ...)
    get it set, their step counters moved to the device, and torch's fused kernel where they
    have one and the user chose neither `fused` nor `foreach`; SGD runs its fused kernel (its
    foreach path reads a tensor learning rate on the host). Run eager steps with the same
    prepared optimizer to get the same numbers as the captured ones.
    """
    for group in optimizer.param_groups:
        params = group["params"]
        if not params:
            continue
        device = params[0].device
        if device.type != "cuda":
            return f"{type(optimizer).__name__} holds parameters on {device}, not on a CUDA device"
        if "capturable" in group:
            group["capturable"] = True
            if _can_fuse(group):  # one multi-tensor kernel a step, not a dozen foreach launches
                group["fused"] = True
        elif isinstance(optimizer, torch.optim.SGD):
            if group.get("differentiable") or group.get("foreach"):
                return "SGD with foreach=True or differentiable=True reads its learning rate on the host"
            group["fused"] = True
        else:
            return (f"{type(optimizer).__name__} has no capturable mode (its step reads values on "
                    "the host); use Adam, AdamW, SGD or another optimizer with `capturable`")
        lr = group["lr"]
        group["lr"] = (lr.to(device=device, dtype=torch.float32) if isinstance(lr, torch.Tensor)
                       else torch.tensor(float(lr), device=device))
    for state in optimizer.state.values():  # after load_state_dict, or eager steps before
        for key, value in state.items():
            if key == "step" and isinstance(value, torch.Tensor) and value.device.type == "cpu":
                state[key] = value.to(optimizer.param_groups[0]["params"][0].device, torch.float32)
    return None


def _generator_state(device) -> tuple | None:
    """(device's default CUDA generator, its state) to restore after a failed capture."""
    if device.type != "cuda":
        return None
    generator = torch.cuda.default_generators[device.index if device.index is not None
                                              else torch.cuda.current_device()]
    return generator, generator.get_state()


def _restore_generator(generator: torch.Generator, state: torch.Tensor) -> None:
    """A capture that fails leaves the CUDA generator marked as capturing (torch 2.11: every
    later draw, dropout's included, raises "Offset increment outside graph capture"); a fresh
    copy of its state is not marked. Then back to the state before the capture, so the eager
    step draws what it would have drawn. (Measured on an H200: neither set_state, manual_seed
    nor CUDAGraph.reset alone clears the mark.)"""
    if hasattr(generator, "clone_state"):  # torch >= 2.4
        generator.graphsafe_set_state(generator.clone_state())
    generator.set_state(state)


FUSABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _can_fuse(group) -> bool:
    """Whether a capturable group may take torch's fused kernel: it has a `fused` option the
    user left unset (None), no foreach or differentiable asked for, and parameters of the
    dtypes that kernel takes. (Adam's fused step measured 55-78 us against 123-128 us for
    its capturable foreach step on the IPU SHD net, one H100: issue 34.)"""
    return ("fused" in group and group["fused"] is None and not group.get("foreach")
            and not group.get("differentiable") and all(p.dtype in FUSABLE_DTYPES for p in group["params"]))


class _Graph:
    """One input signature: its warm-up count, then its graph, static inputs and outputs."""

    def __init__(self):
        self.calls = 0
        self.deferrals = -1  # launch.deferrals() before the last warm-up call
        self.provisional = False  # the graph holds stand-ins of kernels that were compiling
        self.stood_in_for: tuple = ()  # the futures of the compiles its stand-ins stood in for
        self.may_be_provisional = True  # False once capturing stand-ins failed
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.outputs = None


class CapturedStep:
    """step_fn(*inputs) run as CUDA-graph replays (see the module docstring).

    warmup: eager calls per input signature before its capture (3 is PyTorch's advice;
        at least 1, so lazy state exists before the capture).
    max_graphs: input signatures captured at most; further ones run eagerly with a warning.
    enabled: False runs every call eagerly (no warning): the --no-capture path.
    agree_across: a torch.distributed process group whose ranks capture the same step
        together (data parallel, the pipeline): after each capture they agree, so that all
        replay or, if capturing failed on any rank, all run eagerly. Without it a rank that
        replays would wait forever on a peer that runs the step eagerly.
    stream: the CUDA side stream the warm-ups and captures run on (default: one of its
        own); pass the stream a DistributedDataParallel model was built on
        (DataParallel.wrap(stream=...)), so that its gradient hooks run where the step does.
    pool: a graph memory pool (torch.cuda.graph_pool_handle()) shared with other CapturedSteps,
        for steps that never run at the same time and whose outputs are read before another
        one runs (the trainer's training and evaluation steps): one working memory for all.
        Default: a pool of its own.
    """

    def __init__(self, step_fn: Callable, *, warmup: int = 3, max_graphs: int = 4,
                 enabled: bool = True, name: str = "training step", agree_across=None,
                 stream: torch.cuda.Stream | None = None, pool=None):
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        # check_int's bound: a warmup of 2**70 never captured, silently
        warmup, max_graphs = check_int("warmup", warmup), check_int("max_graphs", max_graphs)
        if not isinstance(enabled, bool):  # bool() took "no" (or NaN) as True
            raise ArgumentError(f"enabled must be True or False, got {enabled!r}")
        self.step_fn, self.warmup, self.max_graphs, self.name = step_fn, warmup, max_graphs, name
        self.enabled = enabled
        self.agree_across = agree_across
        self.fallback_reason: str | None = None  # set once capture is given up, with the warning
        self.graphs: dict[tuple, _Graph] = {}
        self._pool = pool
        self._side_stream = stream
        self._warned_shapes = False
        self.pool_bytes = 0  # device memory reserved while capturing (the private pool)
        self.provisional_captures = 0  # graphs captured with stand-ins while kernels compiled
        self.provisional_failure: str | None = None  # why capturing the stand-ins failed, where it did

    @property
    def captured(self) -> int:
        """How many input signatures have a graph."""
        return sum(entry.graph is not None for entry in self.graphs.values())

    def __call__(self, *inputs: torch.Tensor):
        if not self.enabled or self.fallback_reason is not None:
            return self.step_fn(*inputs)
        reason = self._unsupported(inputs)
        if reason is not None:
            return self._give_up(reason, inputs)
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:
                return self._eager_for_new_shape(key, inputs)
            entry = self.graphs[key] = _Graph()
        if entry.graph is not None and self._outdated(entry):
            entry.graph = entry.outputs = None  # its kernels are ready: one eager call, then captured again
            entry.inputs, entry.provisional, entry.stood_in_for, entry.calls = (), False, (), self.warmup - 1
        if entry.graph is not None:
            for static, new in zip(entry.inputs, inputs):
                if static.data_ptr() != new.data_ptr():
                    static.copy_(new, non_blocking=True)
            entry.graph.replay()
            return entry.outputs
        unsettled = self.agree_across is None and not launch.settled(entry.deferrals)
        provisional = (unsettled and entry.may_be_provisional and launch.cold_compiles_in_flight()
                       and os.environ.get("SPIKEFUSE_PROVISIONAL_GRAPHS", "1") != "0")
        if entry.calls < self.warmup or (unsettled and not provisional):
            entry.calls += 1
            entry.deferrals = launch.deferrals()
            return self._warm_up(inputs)
        return self._capture(entry, inputs, provisional)

    @staticmethod
    def _outdated(entry: _Graph) -> bool:
        """A provisional graph is captured again once nothing compiles, or once the kernels its stand-ins
        stood in for are ready while others still compile (a LIF layer's quick kernels arrive seconds
        before its tuned ones: those epochs then run the quick kernels, not the torch twins)."""
        if not entry.provisional:
            return False
        waited = entry.stood_in_for
        return launch.compiles_in_flight() == 0 or (bool(waited) and all(f.done() for f in waited))

    @staticmethod
    def _unsupported(inputs) -> str | None:
        if inputs and all(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
            return None
        where = sorted({str(t.device) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs})
        return f"CUDA graphs need CUDA tensors as inputs, got {', '.join(where) or 'no inputs'}"

    # ---- the three ways a call runs ----

    def _warm_up(self, inputs):
        """One eager step on a side stream (PyTorch's rule for what will be captured)."""
        device = inputs[0].device
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device)
        main = torch.cuda.current_stream(device)
        self._side_stream.wait_stream(main)
        with torch.cuda.stream(self._side_stream):
            outputs = self.step_fn(*inputs)
        main.wait_stream(self._side_stream)
        return outputs

    def _capture(self, entry: _Graph, inputs, provisional: bool = False):
        """Capture the step (with provisional, the stand-ins of kernels still compiling too) and run it."""
        device = inputs[0].device
        static = tuple(t.clone(memory_format=torch.preserve_format) for t in inputs)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.empty_cache()  # as capturing does first: then the growth is the pool's
        reserved = torch.cuda.memory_reserved(device)
        failure = None
        rng = _generator_state(device)
        deferred = launch.deferrals()
        stream = torch.cuda.current_stream(device)
        try:
            with (torch.cuda.graph(graph, pool=self._pool, stream=self._side_stream,  # the warm-ups' stream
                                   capture_error_mode="thread_local"),
                  launch.stand_ins_captured(provisional), launch.recording_deferrals() as stood_in_for):
                outputs = self.step_fn(*static)
        except Exception as e:  # the step did not run: run it eagerly, and from now on
            first_line = (str(e).strip().splitlines() or [""])[0]
            failure = f"capturing failed: {type(e).__name__}: {first_line}"
            if rng is not None:
                _restore_generator(*rng)
            torch.cuda.set_stream(stream)  # torch.cuda.graph leaves its stream current where capture_end raises
        if failure is not None and provisional:  # a stand-in that cannot be captured: eager until the
            entry.may_be_provisional = False     # kernels are compiled, then captured as usual
            self.provisional_failure = failure
            return self._warm_up(inputs)
        if self.agree_across is not None:  # nothing ran yet on any rank: all replay, or all go eager
            failure = self._agree(failure, device)
        if failure is not None:
            return self._give_up(failure, inputs)
        self.pool_bytes += torch.cuda.memory_reserved(device) - reserved
        # detached: the capture's autograd graph would otherwise stay alive with its
        # AccumulateGrad nodes bound to the capture stream, and later eager steps would
        # synchronise with that stream
        outputs = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, outputs)
        entry.graph, entry.inputs, entry.outputs = graph, static, outputs
        # provisional if it ran a stand-in, or while anything compiles (its LIF layers then run quick kernels)
        entry.provisional = provisional and (launch.deferrals() != deferred or launch.compiles_in_flight() > 0)
        entry.stood_in_for = tuple(stood_in_for) if entry.provisional else ()
        self.provisional_captures += entry.provisional
        graph.replay()  # capturing recorded the step without running it
        return outputs

    def _agree(self, failure: str | None, device) -> str | None:
        import torch.distributed as dist

        failed = torch.tensor([failure is not None], dtype=torch.int32, device=device)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.agree_across)
        if failed.item() and failure is None:
            failure = "capturing failed on another rank (its warning says why)"
        return failure

    def _give_up(self, reason, inputs):
        self.fallback_reason = reason
        self.graphs.clear()
        warnings.warn(f"{self.name} runs eagerly, not as a CUDA graph: {reason}", CaptureFallback, stacklevel=3)
        return self.step_fn(*inputs)

    def _eager_for_new_shape(self, key, inputs):
        if not self._warned_shapes:
            self._warned_shapes = True
            shapes = ", ".join(str([list(s) for s, _, _ in k]) for k in list(self.graphs)[:3])
            warnings.warn(f"{self.name}: input shapes {[list(s) for s, _, _ in key]} make more than "
                          f"max_graphs={self.max_graphs} shapes (already captured: {shapes}, ...); "
                          "steps of new shapes run eagerly. Fixed batch shapes (drop_last, padding) "
                          "keep every step captured.", CaptureFallback, stacklevel=3)
        return self.step_fn(*inputs)
