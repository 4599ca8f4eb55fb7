"""How much faster the temporal pipeline (spikefuse.parallel.pipeline) trains a network on N
GPUs: the speedup model, measured on this machine, and the stage cut and chunk count.

The temporal-fusion paper's model. With Ts the single-device step time and Tc the cost of one
hand-off between two devices, N devices take Ts/N + N*Tc:
    speedup(N) = Ts / (Ts/N + N*Tc),   best at N* = sqrt(Ts/Tc)   (d/dN (Ts/N + N*Tc) = 0).

The pipeline's schedule (GPipe over C time chunks). Let t be one stage's forward+backward of
one chunk and h one chunk's hand-off across one stage boundary (its spikes forward, its
gradient back). Stage k can start chunk c once it has finished chunk c-1 and chunk c has
arrived from stage k-1:  S(k, c) = max(S(k, c-1) + t, S(k-1, c) + t + h).
If h <= t this solves to S(k, c) = k*(t + h) + c*t: the last stage finishes the last chunk at
(C+N-1)*t + (N-1)*h. If h > t the link is the bottleneck and a chunk arrives every h instead
of every t. Both cases, forward and backward (its mirror image) together:
    T_pipe(N, C) = (C-1)*max(t, h) + N*t + (N-1)*h.
With balanced stages, t = Ts/(N*C), and free hand-offs (h = 0):
    speedup = Ts / T_pipe = N*C / (C+N-1)        (the ideal pipeline; -> N as C grows).
With h = Tc <= t and C -> infinity, T_pipe -> Ts/N + (N-1)*Tc: the paper's model (which counts
N hand-offs where the pipeline has N-1 boundaries).

The prediction itself follows PipelineTrainer's own schedule (split_schedule_time), simulated
chunk by chunk: a stage runs its forwards in order, then per chunk, in reverse, the backward
the stage before waits for (b) and, held back by the weight-gradient lag (2k + 1 chunks on
stage k, 0 on the first), its SpikingLinear weight gradients (w). Held, those fill the drain
that GPipe's form charges. Measured on 2 H200s (deep-lif, B = 16, T = 1024..16384, 4-32
chunks) the steps came within 6 % of it; at 16 and 32 chunks 5-6 % slower than predicted,
whose hand-offs cost more than this model charges (docs/parallel.md).

What `plan` measures, instead of assuming balance, free chunks and a fixed Tc:
- Ts, the ordinary single-device step, and the same step on one device cut into C chunks
  (spikefuse.parallel.pipeline.chunked_step: every per-chunk cost of a stage but the
  hand-offs: smaller GEMMs, more launches), for C = 1, 2, 4, ...; on CUDA both are captured
  in a CUDA graph, as PipelineTrainer.captured runs the pipeline (issued eagerly, a chunk of
  deep-lif cost ~4 ms of host time on an H200 machine whatever its length);
- each layer's forward+backward time and its forward alone: the stage cut balances the
  former (split_stages); a stage's share of the layer time times the C-chunk step, over C,
  is its work on one chunk, split into forward, what the stage before waits for and the
  held weight gradients (a SpikingLinear's backward counted half input, half weight
  gradient, or all weight gradient where its input needs none);
- the link between two GPUs (latency and bandwidth of device-to-device copies, or given):
  h is two messages' latency plus one chunk's spikes (bits after a neuron layer) and its
  float gradient over the bandwidth;
- the bytes each layer saves for backward per time step (saved-tensor hooks): a GPU holds its
  stage's parameters and gradients, its saved activations over all T steps, the input (first
  stage), the outputs (last stage) and the chunks in flight; no optimizer state, no workspace.
The chunk count is the measured C with the shortest predicted step.
"""
from __future__ import annotations

import argparse
import inspect
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import precision as precisions
from ..data.events import check_device
from ..nn import LIF
from ..nn.spiking_layers import SpikingLinear
from .pipeline import _check_input, _lag, check_count, check_layers, check_real, chunked_step, split_stages

MAX_GPUS = 8
MAX_CHUNKS = 256
ASSUMED_LINK = (20e-6, 100e9)  # latency (s), bandwidth (B/s): used when no second GPU can be measured
CUT_SLACK = 0.05  # measured layer times vary by more than this: prefer spike hand-offs within it


# ---- the formulas ----

def paper_speedup(n: int, ts: float, tc: float) -> float:
    """The temporal-fusion paper: Ts / (Ts/N + N*Tc)."""
    return ts / (ts / n + n * tc)


def paper_optimum(ts: float, tc: float) -> float:
    """N* = sqrt(Ts/Tc), where the paper's speedup peaks (infinite when Tc = 0)."""
    return math.sqrt(ts / tc) if tc > 0 else math.inf


def ideal_pipeline_speedup(n: int, chunks: int) -> float:
    """N*C / (C+N-1): the pipeline with balanced stages and free hand-offs."""
    return n * chunks / (chunks + n - 1)


def pipeline_time(n: int, chunks: int, chunk_time: float, handoff: float) -> float:
    """(C-1)*max(t, h) + N*t + (N-1)*h: one step through N stages in C chunks, t being one
    stage's forward+backward of a chunk and h a chunk's hand-off (see the module docstring)."""
    h = handoff if n > 1 else 0.0
    return (chunks - 1) * max(chunk_time, h) + n * chunk_time + (n - 1) * h


def pipeline_speedup(n: int, chunks: int, ts: float, tc: float) -> float:
    """Ts / T_pipe with balanced stages (t = Ts/(N*C)) and a hand-off of Tc per chunk."""
    return ts / pipeline_time(n, chunks, ts / (n * chunks), tc)


def split_schedule_time(stages: list[tuple[float, float, float]], chunks: int, handoff: float,
                        lags: list[int] | None = None) -> float:
    """One step of PipelineTrainer's schedule, simulated: stage k spends f, b, w = stages[k] on
    each chunk's forward, on the backward the stage before waits for, and on its held weight
    gradients. Stage k runs chunk c's forward once it has the chunk (the stage before's
    forward of it, then `handoff` on the link, which carries one chunk at a time each way),
    then, chunk by chunk in reverse, b once the stage after's gradient of the chunk has come
    the same way, and the weight gradients of the oldest held chunk while more than lags[k]
    are held (default: the trainer's, 2k + 1 on stage k > 0); the rest at the end."""
    n = len(stages)
    lags = [_lag(None, k) for k in range(n)] if lags is None else lags
    free = [0.0] * n  # when each stage is next idle
    ready = [0.0] * chunks  # when the stage before's forward of chunk c was done
    for k, (f, _, _) in enumerate(stages):
        link = 0.0  # when the link from the stage before is next free
        for c in range(chunks):
            if k:
                ready[c] = link = max(ready[c], link) + handoff
            free[k] = ready[c] = max(free[k], ready[c]) + f
    ready = [0.0] * chunks  # when the stage after's gradient of chunk c was done
    for k in reversed(range(n)):
        _, b, w = stages[k]
        held, link = 0, 0.0
        for c in reversed(range(chunks)):
            if k < n - 1:
                ready[c] = link = max(ready[c], link) + handoff
            free[k] = ready[c] = max(free[k], ready[c]) + b
            held += 1
            if held > lags[k]:
                free[k] += w
                held -= 1
        free[k] += held * w
    return max(free)


# ---- what plan() returns ----

@dataclass
class LayerProfile:
    """One layer: forward+backward seconds over the whole input, bytes saved for backward and
    output bytes per time step, parameter bytes, and whether its output is spikes."""
    name: str
    seconds: float
    saved_per_step: float
    out_per_step: float
    param_bytes: int
    spikes: bool
    forward_seconds: float | None = None  # the forward alone (None: a third of `seconds`)
    held_seconds: float = 0.0  # of the backward, what a pipeline stage can hold back (weight gradients)


@dataclass
class PlanRow:
    """The prediction for one GPU count."""
    gpus: int
    chunks: int
    cut: list[range]
    step_time_s: float  # the predicted step (split_schedule_time)
    handoff_s: float  # h: one chunk across the slowest boundary, spikes forward and gradient back
    predicted_speedup: float  # Ts / T_pipe, from the measurements
    ideal_speedup: float  # N*C/(C+N-1) at this C
    paper_speedup: float  # Ts/(Ts/N + N*Tc) with Tc = h
    memory_bytes: int  # the largest stage's


@dataclass
class Plan:
    model: str
    time_steps: int
    batch: int
    device: str
    ts_s: float  # the single-device step over T steps
    chunked_s: dict[int, float]  # C -> the step on one device in C chunks
    link_latency_s: float
    link_bandwidth: float  # bytes per second
    link_source: str  # "measured ...", "given" or "assumed ..."
    profiles: list[LayerProfile]
    input_bytes: int
    single_memory_bytes: int  # predicted, one device
    single_peak_bytes: int | None  # measured (CUDA), one device
    rows: list[PlanRow] = field(default_factory=list)  # N = 1, 2, ...
    gpus: int | None = None  # the GPU count asked for

    def at(self, gpus: int, chunks: int) -> PlanRow:
        """The prediction for `gpus` stages (cut as in that row) at a given chunk count (the
        one-device chunked step interpolated between measured counts)."""
        return predict_row(self.profiles, self.rows[gpus - 1].cut, self.time_steps, self.ts_s, self.chunked_s,
                           (self.link_latency_s, self.link_bandwidth), self.input_bytes, chunks)

    @property
    def best(self) -> PlanRow:
        return max(self.rows, key=lambda r: (round(r.predicted_speedup, 9), -r.gpus))

    @property
    def chosen(self) -> PlanRow:
        """The row for the GPUs asked for, else the best."""
        return next((r for r in self.rows if r.gpus == self.gpus), self.best)

    @property
    def paper_optimum(self) -> float:
        return paper_optimum(self.ts_s, self.chosen.handoff_s)


# ---- measuring ----

def _seconds_of(fn, device, reps: int) -> float:
    """Median seconds of fn() after one warm-up call, the device synchronized around each."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _step_seconds_of(run, x: torch.Tensor, reps: int) -> float:
    """Median seconds of the training step run(x); on CUDA captured in one CUDA graph (as the
    pipeline's and every spikefuse training step runs), so that it is the GPU's time and not
    the host's issuing of a few hundred launches per chunk."""
    if x.device.type != "cuda":
        return _seconds_of(lambda: run(x), x.device, reps)
    from ..capture import CapturedStep

    step = CapturedStep(run, warmup=2, name="planner step")
    for _ in range(3):  # warm-up steps, then the capture
        step(x)
    seconds = _seconds_of(lambda: step(x), x.device, reps)
    step = None  # the graph's memory goes back before the next measurement
    torch.cuda.empty_cache()
    return seconds


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_layers(layers, x: torch.Tensor, reps: int = 3, memory_steps: int = 16) -> list[LayerProfile]:
    """Each layer timed forward and backward on its real input (the previous layers' output
    over all of x); the memory per step from one forward of the stack over the first
    `memory_steps` steps of x."""
    # reps 0 raised StatisticsError, memory_steps 0 divided by zero, a non-tensor x AttributeError
    _check_stack(layers, x)
    reps, memory_steps = check_count("reps", reps), check_count("memory_steps", memory_steps)
    T = x.shape[0]
    saved = saved_bytes(layers, x[:memory_steps])
    profiles, a = [], x
    for i, layer in enumerate(layers):
        a_in = a.detach().requires_grad_(i > 0 and a.is_floating_point())
        with torch.no_grad():
            out = layer(a_in)
        grad = torch.ones_like(out)

        def run():
            y = layer(a_in)
            if y.requires_grad:
                y.backward(grad)
        seconds = _seconds_of(run, x.device, reps)
        forward = min(_seconds_of(lambda: layer(a_in), x.device, reps), seconds)  # saving, as in training
        held = 0.0  # the pipeline holds back a SpikingLinear's weight gradient (weight_grad_queue)
        if isinstance(layer, SpikingLinear) and layer.weight.requires_grad:
            held = (seconds - forward) / (2 if a_in.requires_grad else 1)
        profiles.append(LayerProfile(f"{i}:{type(layer).__name__}", seconds,
                                     saved[i] / min(T, memory_steps), out.numel() * out.element_size() / T,
                                     sum(p.numel() * p.element_size() for p in layer.parameters()),
                                     isinstance(layer, LIF), forward, held))
        a = out
        layer.zero_grad(set_to_none=True)
    return profiles


def saved_bytes(layers, x: torch.Tensor) -> list[int]:
    """Bytes each layer saves for backward in one forward of the stack (saved-tensor hooks;
    each storage counted once, for the layer that saved it first; parameters and x not counted)."""
    _check_stack(layers, x)
    seen = {p.untyped_storage().data_ptr() for layer in layers for p in layer.parameters()}
    seen.add(x.untyped_storage().data_ptr())
    per_layer, current = [0] * len(layers), [0]

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            per_layer[current[0]] += storage.nbytes()
        return t
    a, outputs = x, []  # outputs kept to the end: a freed storage's address could come back
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for i, layer in enumerate(layers):
            current[0] = i
            a = layer(a)
            outputs.append(a)
    return per_layer


def _zero_grads(layers):
    for layer in layers:
        layer.zero_grad(set_to_none=True)


def step_seconds(layers, x: torch.Tensor, reps: int = 3) -> float:
    """The ordinary single-device forward+backward of the whole stack (captured on CUDA)."""
    _check_stack(layers, x)
    reps = check_count("reps", reps)
    stack = nn.Sequential(*layers)

    def run(x):
        _zero_grads(layers)
        out = stack(x)
        out.backward(torch.ones_like(out))
    seconds = _step_seconds_of(run, x, reps)
    _zero_grads(layers)
    return seconds


def chunked_seconds(layers, x: torch.Tensor, chunks: int, reps: int = 3) -> float:
    """The pipeline's step on one device, all of x in `chunks` chunks (captured on CUDA)."""
    _check_stack(layers, x, check_count("chunks", chunks))  # not first inside a CUDA-graph capture
    reps = check_count("reps", reps)

    def run(x):
        _zero_grads(layers)
        chunked_step(layers, x, None, lambda out, _: out.float().mean(), chunks)
    seconds = _step_seconds_of(run, x, reps)
    _zero_grads(layers)
    return seconds


def measure_link(devices=("cuda:0", "cuda:1"), nbytes: int = 2**26, reps: int = 10) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of copies from one GPU to another: a 4-byte copy, and the
    time of an nbytes copy beyond that latency."""
    # reps 0 raised StatisticsError, nbytes 0 gave a bandwidth of 0, 2**70 failed in torch.empty
    nbytes, reps = check_count("nbytes", nbytes, 2**40), check_count("reps", reps)
    if not (isinstance(devices, (tuple, list)) and len(devices) == 2):
        raise ValueError(f"devices: expected two CUDA devices, got {devices!r}")
    try:
        src, dst = (check_device(d) for d in devices)
    except ValueError as e:
        raise ValueError(f"devices: {str(e).removeprefix('device: ')}") from None
    if src.type != "cuda" or dst.type != "cuda":
        raise ValueError(f"devices: expected two CUDA devices (copies between GPUs), got {devices!r}")

    def copy_seconds(n):
        a = torch.empty(n, dtype=torch.uint8, device=src)
        b = torch.empty(n, dtype=torch.uint8, device=dst)
        times = []
        for i in range(reps + 2):
            torch.cuda.synchronize(src), torch.cuda.synchronize(dst)
            start = time.perf_counter()
            b.copy_(a)
            torch.cuda.synchronize(dst)
            if i >= 2:  # warm-up: peer access set up
                times.append(time.perf_counter() - start)
        return statistics.median(times)
    latency = copy_seconds(4)
    return latency, nbytes / max(copy_seconds(nbytes) - latency, 1e-9)


def _check_stack(layers, x, chunks: int = 1) -> None:
    """What the measuring helpers take: a list of modules and a time-major x [T, B, ...]."""
    if not (isinstance(layers, (list, tuple, nn.Sequential)) and all(isinstance(m, nn.Module) for m in layers)):
        raise TypeError(f"layers: expected a list of torch.nn.Module layers, got {type(layers).__name__}")
    _check_input(x, chunks)


# ---- the plan ----

def plan(model_name: str, time_steps: int, batch: int, gpus: int | None = None, *, device=None,
         input_shape=None, num_classes: int | None = None, link: tuple[float, float] | None = None,
         max_gpus: int = MAX_GPUS, rate: float = 0.2, reps: int = 3, **model_kwargs) -> Plan:
    """Measure `model_name` (a spikefuse.models name) at T=time_steps, B=batch on `device`
    (default: the GPU if there is one) and predict the pipeline for N = 1..max_gpus.

    input_shape, num_classes: default to the model builder's defaults. link: (latency s,
    bandwidth B/s) of a hand-off; default measured between cuda:0 and cuda:1, else assumed
    (ASSUMED_LINK, said so in link_source). The input is random spikes at `rate`.
    model_kwargs go to the builder (width=..., backend=...)."""
    from ..models import MODELS, build_model

    if model_name not in MODELS:
        raise ValueError(f"model_name: unknown model {model_name!r}; expected one of {sorted(MODELS)}")
    # sizes past 2**31 - 1 failed inside torch.rand or build_model (not named as the CLI names them);
    # reps 0 raised StatisticsError, 2.5 a TypeError; a NaN rate gave an input without spikes
    for name, value in (("time_steps", time_steps), ("batch", batch), ("max_gpus", max_gpus), ("reps", reps)):
        check_count(name, value)
    if gpus is not None:
        check_count("gpus", gpus)
    rate = check_real("rate", rate, "a spike probability in [0, 1]", low=0, high=1)
    if link is not None:
        if not (isinstance(link, (tuple, list)) and len(link) == 2):
            raise ValueError(f"link: expected (latency s, bandwidth B/s), got {link!r}")
        check_link(*link)
    max_gpus = max(max_gpus, gpus or 1)
    device = _measuring_device(device)
    defaults = inspect.signature(MODELS[model_name][0]).parameters
    input_shape = _default(input_shape, defaults, "input_shape", model_name)
    num_classes = _default(num_classes, defaults, "num_classes", model_name)
    torch.manual_seed(0)
    model = build_model(model_name, input_shape, num_classes, time_steps, **model_kwargs).to(device)
    layers = getattr(model, "layers", model)
    if not isinstance(layers, nn.Sequential):
        raise ValueError(f"model_name: {model_name!r} is not a flat stack of layers (an nn.Sequential, or one "
                         "in .layers), which the pipeline cuts into stages")
    layers = list(layers)
    check_layers(layers)
    x = (torch.rand(time_steps, batch, *input_shape, device=device) < rate).float()

    profiles = profile_layers(layers, x, reps)
    single_peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    ts = step_seconds(layers, x, reps)
    if device.type == "cuda":
        single_peak = torch.cuda.max_memory_allocated(device) - base
    counts = [2**i for i in range(int(math.log2(min(time_steps, MAX_CHUNKS))) + 1)]
    chunked = {c: chunked_seconds(layers, x, c, reps) for c in counts}

    if link is not None:
        link, source = (float(link[0]), float(link[1])), "given"  # checked above, before measuring
    elif device.type == "cuda" and torch.cuda.device_count() >= 2:
        link, source = measure_link(), "measured cuda:0 -> cuda:1 copies"
    else:
        link, source = ASSUMED_LINK, "assumed (no second GPU to measure)"
    input_bytes = x.numel() * x.element_size()
    return Plan(model_name, time_steps, batch,
                torch.cuda.get_device_name(device) if device.type == "cuda" else str(device), ts, chunked,
                *link, source, profiles, input_bytes,
                stage_memory(profiles, range(len(layers)), time_steps, 1, input_bytes), single_peak,
                predict(layers, profiles, time_steps, ts, chunked, link, input_bytes, max_gpus), gpus)


def check_link(latency, bandwidth, name: str = "link", units: tuple[str, str] = ("s", "B/s")) -> None:
    """A hand-off link: latency finite and >= 0, bandwidth finite and > 0 (NaN, inf and negative
    figures used to give a "plan", a zero bandwidth a ZeroDivisionError); ValueError naming it."""
    real = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (latency, bandwidth))
    if not (real and latency >= 0 and bandwidth > 0):
        raise ValueError(f"{name}: expected a latency >= 0 {units[0]} and a bandwidth > 0 {units[1]}, both finite, "
                         f"got {latency!r} {bandwidth!r}")


def _measuring_device(device) -> torch.device:
    """Where to measure: cpu or a CUDA device this machine has (ValueError naming `device` otherwise)."""
    device = check_device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: the planner measures on 'cpu' or 'cuda', got {str(device)!r}")
    return device


def _default(value, defaults, name, model_name):
    if value is not None:  # the builder checks them (int() raised on NaN, truncated 2.5, took "3")
        if name == "input_shape" and not isinstance(value, (tuple, list, torch.Size)):
            raise ValueError(f"input_shape: expected a tuple of sizes, got {value!r}")
        return tuple(value) if name == "input_shape" else value
    param = defaults.get(name)
    if param is None or param.default is inspect.Parameter.empty:
        raise ValueError(f"{name}: model {model_name!r} has no default {name}; pass one")
    return tuple(param.default) if name == "input_shape" else int(param.default)


def predict(layers, profiles: list[LayerProfile], time_steps: int, ts: float, chunked: dict[int, float],
            link: tuple[float, float], input_bytes: int, max_gpus: int = MAX_GPUS) -> list[PlanRow]:
    """For N = 1..max_gpus (at most one stage per layer): the stage cut balanced by the
    profiled layer times, the measured chunk count with the shortest predicted step, the prediction."""
    times = [p.seconds for p in profiles]
    return [predict_row(profiles, split_stages(layers, n, costs=times, slack=CUT_SLACK), time_steps, ts,
                        chunked, link, input_bytes)
            for n in range(1, min(max_gpus, len(layers)) + 1)]


def predict_row(profiles: list[LayerProfile], cut: list[range], time_steps: int, ts: float,
                chunked: dict[int, float], link: tuple[float, float], input_bytes: int,
                chunks: int | None = None) -> PlanRow:
    """The prediction for one stage cut, at `chunks` or at the measured chunk count with the
    shortest predicted step. chunked: C -> the one-device step in C chunks (interpolated
    linearly in C between measured counts); each stage's share of it, over C, is its work on
    a chunk, split by stage_parts, for split_schedule_time."""
    T, (latency, bandwidth), n = time_steps, link, len(cut)
    whole = max(sum(p.seconds for p in profiles), 1e-30)
    parts = [stage_parts([profiles[i] for i in r]) for r in cut]  # per stage: f, b, w over the layer time
    boundaries = [profiles[r.stop - 1] for r in cut[:-1]]
    counts = sorted(chunked)

    def handoff(steps):  # the slowest boundary: spikes (bits after a neuron) forward, float gradient back
        return max((2 * latency + steps * p.out_per_step * ((1 / 32 if p.spikes else 1) + 1) / bandwidth
                    for p in boundaries), default=0.0)

    def total(c):  # the stages' parts scaled to one chunk of the one-device step in c chunks
        scale = _interpolate(chunked, c) / c / whole
        return split_schedule_time([tuple(v * scale for v in f_b_w) for f_b_w in parts], c,
                                   handoff(math.ceil(T / c)))
    if chunks is None:
        chunks = min(counts if n > 1 else [1], key=lambda c: (round(total(c) / ts, 9), c))  # ties: fewer
    elif not 1 <= chunks <= T:
        raise ValueError(f"chunks: expected 1 <= chunks <= T={T}, got {chunks}")
    t_pipe, h = total(chunks), handoff(math.ceil(T / chunks))
    if n == 1:  # one device: no pipeline, the ordinary step
        t_pipe = ts
    return PlanRow(n, chunks, cut, t_pipe, h, ts / t_pipe, ideal_pipeline_speedup(n, chunks),
                   paper_speedup(n, ts, h), max(stage_memory(profiles, r, T, chunks, input_bytes) for r in cut))


def stage_parts(profiles: list[LayerProfile]) -> tuple[float, float, float]:
    """A stage's layer time split as split_schedule_time takes it: forward, the backward the
    stage before waits for, the held weight gradients."""
    forward = sum(p.seconds / 3 if p.forward_seconds is None else p.forward_seconds for p in profiles)
    held = sum(p.held_seconds for p in profiles)
    return forward, sum(p.seconds for p in profiles) - forward - held, held


def _interpolate(measured: dict[int, float], c: int) -> float:
    counts = sorted(measured)
    if c in measured:
        return measured[c]
    lo = max([k for k in counts if k < c], default=counts[0])
    hi = min([k for k in counts if k > c], default=counts[-1])
    if lo == hi:  # beyond the measured counts: the per-chunk cost of the nearest
        return measured[lo] * c / lo
    return measured[lo] + (measured[hi] - measured[lo]) * (c - lo) / (hi - lo)


def stage_memory(profiles: list[LayerProfile], stage: range, T: int, chunks: int, input_bytes: int) -> int:
    """Bytes one device holds for a stage: parameters and their gradients, saved activations
    over T steps, the input (first stage), outputs and their gradient (last stage) and the
    chunks in flight at its boundaries (a chunk and its gradient, float)."""
    total = sum(2 * profiles[i].param_bytes + profiles[i].saved_per_step * T for i in stage)
    steps = math.ceil(T / chunks)
    if stage.start == 0:
        total += input_bytes
    else:
        total += 2 * profiles[stage.start - 1].out_per_step * steps
    if stage.stop == len(profiles):
        total += 2 * profiles[-1].out_per_step * T
    else:
        total += 2 * profiles[stage.stop - 1].out_per_step * steps
    return int(total)


# ---- the table ----

def format_plan(p: Plan) -> str:
    """The plan as a table for N = 1..max, with the optimum and the chosen cut."""
    chunked = ", ".join(f"{c}: {_seconds(s)}" for c, s in sorted(p.chunked_s.items()))
    lines = [
        f"temporal pipeline plan: {p.model}, T={p.time_steps}, B={p.batch}, measured on {p.device}",
        f"Ts = {_seconds(p.ts_s)} (one device, forward+backward); in C chunks on one device: {chunked}",
        f"link: {_seconds(p.link_latency_s)} + bytes / {p.link_bandwidth / 1e9:.3g} GB/s ({p.link_source})",
        "paper: Ts/(Ts/N + N*Tc); ideal pipeline: N*C/(C+N-1); predicted: Ts/T_pipe, T_pipe the pipeline's",
        "  schedule simulated chunk by chunk (weight gradients held back), each stage's work on a chunk its",
        "  share of the C-chunk step, and h = Tc the hand-off of one chunk",
        "",
        f"{'N':>2} {'chunks':>6} {'paper':>6} {'ideal':>6} {'predicted':>9} {'T_pipe':>9} {'Tc':>9} "
        f"{'memory/GPU':>10}  stage cut (layers)",
    ]
    for r in p.rows:
        lines.append(f"{r.gpus:>2} {r.chunks:>6} {r.paper_speedup:>6.2f} {r.ideal_speedup:>6.2f} "
                     f"{r.predicted_speedup:>9.2f} {_seconds(r.step_time_s):>9} "
                     f"{_seconds(r.handoff_s) if r.gpus > 1 else '-':>9} {_bytes(r.memory_bytes):>10}  "
                     f"{_cut_text(r.cut)}{'  <- optimum' if r is p.best else ''}")
    c = p.chosen
    measured = f", measured peak {_bytes(p.single_peak_bytes)}" if p.single_peak_bytes is not None else ""
    lines += [
        "",
        f"optimum: {p.best.gpus} GPU(s), {p.best.predicted_speedup:.2f}x predicted; the paper's "
        f"N* = sqrt(Ts/Tc) = {p.paper_optimum:.3g} (Tc = {_seconds(c.handoff_s)})",
        f"{'asked for' if p.gpus is not None else 'best'}: {c.gpus} GPU(s), {c.chunks} chunks, cut "
        f"{_cut_text(c.cut)}, {_bytes(c.memory_bytes)} per GPU (one GPU: {_bytes(p.single_memory_bytes)} "
        f"predicted{measured}; optimizer state not included)",
    ]
    if p.gpus is not None and c.gpus != p.gpus:
        lines.append(f"note: {p.gpus} GPUs would be more stages than the model's {len(p.profiles)} layers")
    return "\n".join(lines) + "\n"


def _seconds(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _cut_text(cut) -> str:
    return " | ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else f"{r.start}" for r in cut)


# ---- `spikefuse plan` ----

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a spikefuse model name, e.g. deep-lif")
    parser.add_argument("--time-steps", type=int, required=True, metavar="T")
    parser.add_argument("--batch", type=int, required=True, metavar="B")
    parser.add_argument("--gpus", type=int, metavar="N", help="the GPU count to plan for (default: the best)")
    parser.add_argument("--device", help="where to measure (default: cuda if present, else cpu)")
    parser.add_argument("--link", nargs=2, type=float, metavar=("LATENCY_US", "GB_PER_S"),
                        help="the hand-off link, instead of measuring copies between cuda:0 and cuda:1")
    parser.add_argument("--width", type=float, help="scale the model's layer widths (quick runs)")


FLAGS = {"time_steps": "--time-steps", "batch": "--batch", "gpus": "--gpus", "device": "--device", "link": "--link",
         "model_name": "--model", "width": "--width"}


@precisions.applied("fp32")  # the caller's flags after
def run(args) -> int:
    """Measures in fp32, TF32 matmuls and convolutions, as `spikefuse train` trains by default."""
    from ..errors import UsageError
    from ..models import MODELS

    if args.model not in MODELS:  # named as the command line names it, not as plan()'s argument
        raise UsageError(f"--model: unknown model {args.model!r}; expected one of: {', '.join(MODELS)}")
    params = inspect.signature(MODELS[args.model][0]).parameters
    missing = [name for name in ("input_shape", "num_classes")
               if name not in params or params[name].default is inspect.Parameter.empty]
    if missing:  # plan() takes them from Python; the command line has no option for them
        plannable = [name for name, (builder, _) in MODELS.items()
                     if all(inspect.signature(builder).parameters.get(k) is not None and
                            inspect.signature(builder).parameters[k].default is not inspect.Parameter.empty
                            for k in ("input_shape", "num_classes"))]
        raise UsageError(f"--model: model {args.model!r} has no default {' or '.join(missing)}, which the command "
                         f"line cannot give (the models that have both: {', '.join(plannable)}); from Python, call "
                         "spikefuse.parallel.planner.plan with input_shape= and num_classes=")
    kwargs = {"width": args.width} if args.width is not None else {}
    try:
        if args.link:  # checked in the units given; plan() checks the converted figures again
            check_link(*args.link, name="--link", units=("us", "GB/s"))
        link = (args.link[0] * 1e-6, args.link[1] * 1e9) if args.link else None
        if link and not all(map(math.isfinite, link)):  # finite as given, past float64 in s and B/s
            raise UsageError(f"--link: {args.link[0]:g} us and {args.link[1]:g} GB/s are past float64's range "
                             "in seconds and bytes per second; give a real link's figures")
        result = plan(args.model, args.time_steps, args.batch, args.gpus, device=args.device, link=link, **kwargs)
    except ValueError as e:  # plan()'s parameter names as the command line spells them
        name, sep, rest = str(e).partition(": ")
        raise UsageError(f"{FLAGS[name]}: {rest}" if sep and name in FLAGS else str(e)) from None
    print(format_plan(result), end="")
    return 0


__all__ = ["paper_speedup", "paper_optimum", "ideal_pipeline_speedup", "pipeline_time", "pipeline_speedup",
           "split_schedule_time",
           "Plan", "PlanRow", "LayerProfile", "profile_layers", "saved_bytes", "step_seconds", "chunked_seconds",
           "measure_link", "check_link", "plan", "predict", "predict_row", "stage_memory", "format_plan"]
