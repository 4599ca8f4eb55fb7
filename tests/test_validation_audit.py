"""Issue 36, item 3: host scalars checked where they enter the public surface beyond the neurons.

Audited, with NaN, +-inf, 0, -1, a bool, a string, 2.5 where an int is wanted and 2**70: the
nn layers (SpikingLinear, SpikingConv2d, SparseSpikingLinear, ConvBNLIF, LinearBNLIF, Dropout,
TemporalBatchNorm1d/2d, BNLIF), spikefuse.encode, spikefuse.loss, spikefuse.traces,
spikefuse.optim.LazyAdam, spikefuse.precision, the model builders, and the data transforms and
generators (ToFrame, Downsample, the synthetic sets, batching).

Found, and now refused by name where the parameter enters (check_number / check_int of
spikefuse.neuron_options, or the data layer's own check_number): layer sizes given as floats,
bools, strings or 2**70 (a TypeError naming torch's empty()); a NaN/negative/string conv stride
or padding (taken silently, failing at the first forward); a NaN batch-norm eps or momentum (NaN
outputs or running statistics); a NaN/inf threshold, v_reset, beta or adapt_decay in the traces
(NaN traces); an inf lr or eps in LazyAdam (NaN or frozen weights); an encoder's 2**70 (an
OverflowError inside torch) and latency's huge tau under normalize (no spikes); models' NaN or
2.5 sizes and time steps (int() raised or truncated); SyntheticSHD's unchecked samples, seed,
mean_events and noise (failures inside numpy at indexing); 2**70 synthetic samples (no end);
ToFrame's float num_frames; 2**70 batch sizes (an OverflowError).

Second pass: the model builders' time_steps and hidden, the data batches' group, Trainer/fit,
CapturedStep, to_nir/from_nir and spikefuse.data.load (with LoaderSplit's batch_first). Found:
the builders that ignore T took NaN or a string as time_steps; hidden=512 raised "'int' object
is not iterable" (now refused by name: with two default layers it could mean one layer or two);
Trainer's epochs unchecked (NaN failed in range(), 0 trained nothing, 2**70 forever) and its
seed failing inside torch.manual_seed, clip_grad_norm taking True and 1e39, truthy strings
for its flags, an optimizer lr of 1e300; CapturedStep's 2**70 warm-ups (never captured) and
enabled="no"; to_nir's NaN/2.5/"3" time_steps and input_shape (int() raised or truncated), dt of
2**1100 (OverflowError); from_nir's dt=True (1 s); load's non-path root (os.fspath's TypeError),
device 2**70 (an OverflowError), 2**70 time_steps for event sets, truthy progress; batch_first
"no" read as True. Trainer takes the CLI's checks (train.config), so fit and `spikefuse train`
say the same words (test_fit_and_the_cli_share_one_check).

Third pass: spikefuse.parallel (split_stages, PipelineTrainer, pipeline_step, chunked_step, plan,
init_data_parallel, launch), in the package's own "name: expected ..." words (the planner's CLI
maps them to its options). Found: split_stages' NaN, negative or infinite slack or cost returned
a cut with an empty stage, a string raised from '+'; 2**70 chunks/stages/time steps/batches
reached the step or torch.rand; a timeout of "3" raised from '>', inf or 2**70 would overflow
timedelta at the first wait; pack_spikes went through bool(); PipelineTrainer's device NaN was
ignored, 2**70 raised inside Module.to; plan's reps 0 raised StatisticsError, 2.5 a TypeError,
its rate NaN gave spike-free input, num_classes went through int() (NaN raised, 2.5 truncated),
a bare input_shape raised "not iterable"; launch took nproc NaN, 2.5 or "3" into torch's
launcher config; init_data_parallel took any timeout into init_process_group. And spikefuse.data's
store and cache: EventStore ran int() over sensor_size (NaN raised, 2.5 truncated, 0 and 2**70
kept; one check now, events.check_sensor_size, shared with ToFrame and load), its device NaN or
2**70 failed inside torch.device; from_samples' total took NaN, "3" and -1, progress and
cached_store's resident went through bool(); cached_store's name "../../escape" wrote its entry
outside the cache, a non-path root raised os.fspath's TypeError; open_split raised KeyError on an
unknown name and sent a NaN split to Tonic's download. And spikefuse.bench's timing: median_ms'
NaN warmup or warmup_s skipped the warm-up, 2**70 of either never ended, back_to_back 0 divided
by zero, 0 reps raised StatisticsError; in_rounds' rounds=0 measured nothing.

Fourth pass: spikefuse.parallel's DataParallel.shard, Shard and Shard.batches,
convert_sync_batchnorm, the planner's measuring helpers (profile_layers, saved_bytes,
step_seconds, chunked_seconds, measure_link) and EventStore.load, .to and .sample (the bench
command's options: tests/test_bench_options.py). Found: shard's pad and batches' shuffle went
through bool() ("no" padded); a rank past world_size, or a NaN world_size, was kept (no batch,
or a TypeError at the first); batches' batch_size 0 raised range()'s ValueError, NaN or "3" a
misleading "does not split" or a formatting TypeError; a non-Generator generator failed inside
torch.randperm; convert_sync_batchnorm raised AttributeError for a non-module and kept any object
as its process group (failing at the first training forward's all-reduce); the planner's reps 0
raised StatisticsError, 2**70 ran for ever, memory_steps 0 was refused as "x has T == 0", a
non-tensor x raised AttributeError, a non-list of layers "not iterable"; measure_link took
nbytes 0 (a bandwidth of 0) and non-CUDA devices into torch.cuda; EventStore.load raised Path's
TypeError for a number and read the whole split before checking device, mmap="no" mapped;
EventStore.to failed inside Tensor.to for device 0 or -1 and took resident="no" as True;
EventStore.sample(-1) returned an empty sample, len() and 2.5 raised numpy's IndexError.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from spikefuse import encode, loss, traces
from spikefuse.bench.timing import in_rounds, median_ms
from spikefuse.capture import CapturedStep
from spikefuse.data import load
from spikefuse.data.dataset import DenseSpikeDataset
from spikefuse.data.framing import ToFrame
from spikefuse.data.synthetic import SyntheticSHD
from spikefuse.data.synthetic_events import SyntheticNMNIST
from spikefuse.data.synthetic_images import SyntheticCIFAR
from spikefuse.data.tonic_sets import open_split
from spikefuse.data.tonic_sets import pack as tonic_pack
from spikefuse.models import build_model
from spikefuse.nn import BNLIF, Dropout, TemporalBatchNorm1d, TemporalBatchNorm2d
from spikefuse.nn.sparse_linear import SparseSpikingLinear
from spikefuse.nn.spiking_layers import ConvBNLIF, LinearBNLIF, SpikingConv2d, SpikingLinear
from spikefuse.nir import from_nir, to_nir
from spikefuse.optim import LazyAdam
from spikefuse.parallel import (DataParallel, PipelineTrainer, chunked_step, convert_sync_batchnorm, init_data_parallel,
                                pipeline_step, plan, split_stages)
from spikefuse.parallel.ddp import launch
from spikefuse.parallel.planner import measure_link
from spikefuse.train import Trainer
from spikefuse.train.config import ConfigError, make

NON_NUMBERS = ["3", None, True]  # a string, None, a bool (an int to Python, never meant as one)
NON_FINITE = [math.nan, math.inf, -math.inf, 2**1100]
NOT_INTS = [2.5, math.nan, math.inf, "3", True]
BAD_SIZES = [0, -1, 2**70]


def _refused(call, name):
    """call() raises a ValueError (ArgumentError is one) or TypeError whose message starts with `name`."""
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert message.startswith(name), message
    assert "\n" not in message


def _adam(**kw):
    return LazyAdam([torch.nn.Parameter(torch.zeros(2, 2))], **kw)


def _synthetic_shd(**kw):
    return SyntheticSHD("train", samples=2, **kw)


def _trainer(**kw):
    """A Trainer's checks run in its constructor: no data is read, nothing trains."""
    model = torch.nn.Linear(2, 2)
    return Trainer(model, SimpleNamespace(train=None, test=None), torch.optim.SGD(model.parameters(), lr=0.1),
                   **{"epochs": 1, "progress": False, **kw})


def _layers():
    from spikefuse.nn import LIF
    return [torch.nn.Linear(3, 4), LIF(decay=0.5), torch.nn.Linear(4, 2), LIF(decay=0.5)]


def _chunked(chunks=2, **kw):
    return chunked_step(_layers(), torch.rand(4, 2, 3), torch.tensor([0, 1]),
                        lambda out, target: torch.nn.functional.cross_entropy(out.mean(0), target), chunks, **kw)


def _pipeline_step(chunks=2, **kw):
    return pipeline_step(torch.nn.Sequential(*_layers()), torch.rand(4, 2, 3), torch.tensor([0, 1]),
                         lambda out, target: torch.nn.functional.cross_entropy(out.mean(0), target), chunks, **kw)


def _pipeline_trainer(chunks=2, **kw):
    return PipelineTrainer(_layers(), lambda out, target: out.sum(), chunks, **kw)


def _plan(**kw):
    """Every plan() check runs before the model is built or measured."""
    return plan("mlp", **{"time_steps": 2, "batch": 2, "device": "cpu", "reps": 1, "hidden": (4,),
                          "input_shape": (3,), "num_classes": 2, **kw})


def _samples():
    return [({"t": torch.tensor([0, 1]), "x": torch.tensor([0, 1]), "p": torch.tensor([0, 0])}, 0)]


def _from_samples(sensor_size=(4, 1, 1), **kw):
    from spikefuse.data.store import EventStore
    return EventStore.from_samples(_samples(), sensor_size, **{"progress": False, **kw})


def _store(sensor_size=(4, 1, 1), device="cpu"):
    import numpy as np
    from spikefuse.data.store import EventStore
    events = np.zeros(2, dtype=[("t", np.int64), ("x", np.int16), ("p", np.int8)])
    return EventStore(events, np.array([0, 1, 2]), np.array([0, 1]), sensor_size, device=device)


def _cached(root="/nonexistent", name="x", split="train", **kw):
    """Every cached_store check runs before the cache is read or written."""
    from spikefuse.data.cache import cached_store
    return cached_store(root, name, split, {}, _from_samples, **kw)


def _dense():
    return DenseSpikeDataset(torch.zeros(2, 5, 3), torch.zeros(5, dtype=torch.long))


def _shard(rank=0, world_size=2, pad=True):
    from spikefuse.parallel.ddp import Shard
    return Shard(_dense(), rank, world_size, pad=pad)


_DEFAULT = object()


def _measure(helper, x=_DEFAULT, layers=_DEFAULT, **kw):
    """A planner helper on a tiny stack (the CPU: the same checks as on CUDA)."""
    from spikefuse.parallel import planner
    x = torch.rand(4, 2, 3) if x is _DEFAULT else x
    args = {"chunked_seconds": {"chunks": 2, "reps": 1}, "saved_bytes": {}}.get(helper, {"reps": 1})
    return getattr(planner, helper)(_layers() if layers is _DEFAULT else layers, x, **{**args, **kw})


def _saved_store(directory=_DEFAULT, **kw):
    """EventStore.load of a store saved into a fresh folder (or of `directory`)."""
    import tempfile
    from spikefuse.data.store import EventStore
    if directory is _DEFAULT:
        directory = tempfile.mkdtemp()
        _store().save(directory)
    return EventStore.load(directory, **kw)


def _lif_net():
    from spikefuse.nn import LIF
    return torch.nn.Sequential(torch.nn.Linear(3, 4), LIF(decay=0.5))


# ---- sizes: ints in [1, 2**31 - 1] -------------------------------------------------------------

SIZES = {
    "SpikingLinear.in_features": ("in_features", lambda v: SpikingLinear(v, 3)),
    "SpikingLinear.out_features": ("out_features", lambda v: SpikingLinear(3, v)),
    "SparseSpikingLinear.in_features": ("in_features", lambda v: SparseSpikingLinear(v, 3)),
    "LinearBNLIF.out_features": ("out_features", lambda v: LinearBNLIF(3, v)),
    "SpikingConv2d.in_channels": ("in_channels", lambda v: SpikingConv2d(v, 3, 3)),
    "SpikingConv2d.kernel_size": ("kernel_size", lambda v: SpikingConv2d(2, 3, v)),
    "SpikingConv2d.stride": ("stride", lambda v: SpikingConv2d(2, 3, 3, stride=v)),
    "ConvBNLIF.out_channels": ("out_channels", lambda v: ConvBNLIF(2, v)),
    "ConvBNLIF.stride": ("stride", lambda v: ConvBNLIF(2, 3, 3, v)),
    "TemporalBatchNorm1d.num_features": ("num_features", lambda v: TemporalBatchNorm1d(v)),
    "BNLIF.num_features": ("num_features", lambda v: BNLIF(v)),
    "BNLIF.forward.time_steps": ("time_steps", lambda v: BNLIF(3)(torch.rand(2, 3), time_steps=v)),
    "mlp.num_classes": ("num_classes", lambda v: build_model("mlp", (4,), v, hidden=(3,))),
    "mlp.hidden": ("hidden", lambda v: build_model("mlp", (4,), 2, hidden=(v,))),
    "shd.input_shape": ("input_shape", lambda v: build_model("shd", (v,), 2, width=1 / 64)),
    "deep-lif.depth": ("depth", lambda v: build_model("deep-lif", (4,), 2, depth=v, hidden=4)),
    "ipu-shd.hidden": ("hidden", lambda v: build_model("ipu-shd", (4,), 2, hidden=(v,))),
    "dvs-gesture.channels": ("channels", lambda v: build_model("dvs-gesture", (2, 8, 8), 2, channels=v)),
    "cifar-small.time_steps": ("time_steps", lambda v: build_model("cifar-small", (3, 8, 8), 2, v, width=1 / 64)),
    "mlp.time_steps": ("time_steps", lambda v: build_model("mlp", (4,), 2, v, hidden=(3,))),
    "shd.time_steps": ("time_steps", lambda v: build_model("shd", (4,), 2, v, width=1 / 64)),
    "deep-lif.time_steps": ("time_steps", lambda v: build_model("deep-lif", (4,), 2, v, depth=1, hidden=4)),
    "ipu-shd.time_steps": ("time_steps", lambda v: build_model("ipu-shd", (4,), 2, v, hidden=(3,))),
    "dvs-gesture.time_steps": ("time_steps", lambda v: build_model("dvs-gesture", (2, 8, 8), 2, v, width=1 / 64)),
    "resnet18.num_classes": ("num_classes", lambda v: build_model("resnet18", (3, 8, 8), v, width=1 / 64)),
    "encode.rate.time_steps": ("time_steps", lambda v: encode.rate(torch.rand(2), v)),
    "SyntheticSHD.samples": ("samples", lambda v: SyntheticSHD(samples=v)),
    "SyntheticNMNIST.samples": ("samples", lambda v: SyntheticNMNIST(samples=v)),
    "SyntheticCIFAR.samples": ("samples", lambda v: SyntheticCIFAR(samples=v)),
    "SyntheticNMNIST.mean_events": ("mean_events", lambda v: SyntheticNMNIST(samples=1, mean_events=v)),
    "SyntheticSHD.mean_events": ("mean_events", lambda v: _synthetic_shd(mean_events=v)),
    "ToFrame.batch.num_frames": ("num_frames", lambda v: ToFrame((4, 1, 1), n_time_bins=2).batch(
        {"t": torch.arange(3), "x": torch.zeros(3, dtype=torch.int16), "p": torch.zeros(3, dtype=torch.int8)},
        torch.tensor([0, 3]), num_frames=v)),
    "load.time_steps": ("time_steps", lambda v: load("shd-synthetic", time_steps=v, root="/nonexistent")),
    "Trainer.epochs": ("epochs", lambda v: _trainer(epochs=v)),
    "Trainer.batch_size": ("batch_size", lambda v: _trainer(batch_size=v)),
    "CapturedStep.warmup": ("warmup", lambda v: CapturedStep(abs, warmup=v)),
    "CapturedStep.max_graphs": ("max_graphs", lambda v: CapturedStep(abs, max_graphs=v)),
    "to_nir.time_steps": ("time_steps", lambda v: to_nir(_lif_net(), (3,), v)),
    "to_nir.input_shape": ("input_shape", lambda v: to_nir(_lif_net(), (v,))),
    "split_stages.stages": ("stages", lambda v: split_stages(_layers(), v)),
    "chunked_step.chunks": ("chunks", lambda v: _chunked(v)),
    "pipeline_step.chunks": ("chunks", lambda v: _pipeline_step(v)),
    "PipelineTrainer.chunks": ("chunks", lambda v: _pipeline_trainer(v)),
    "PipelineTrainer.stages": ("stages", lambda v: _pipeline_trainer(stages=v)),
    "plan.time_steps": ("time_steps", lambda v: _plan(time_steps=v)),
    "plan.batch": ("batch", lambda v: _plan(batch=v)),
    "plan.gpus": ("gpus", lambda v: _plan(gpus=v)),
    "plan.max_gpus": ("max_gpus", lambda v: _plan(max_gpus=v)),
    "plan.reps": ("reps", lambda v: _plan(reps=v)),
    "plan.num_classes": ("num_classes", lambda v: _plan(num_classes=v)),
    "launch.nproc": ("nproc", lambda v: launch(v, ["--help"])),
    "bench.median_ms.min_reps": ("min_reps", lambda v: median_ms(abs, min_reps=v)),
    "bench.median_ms.max_reps": ("max_reps", lambda v: median_ms(abs, max_reps=v)),
    "bench.median_ms.back_to_back": ("back_to_back", lambda v: median_ms(abs, back_to_back=v)),
    "bench.in_rounds.rounds": ("rounds", lambda v: in_rounds(abs, {}, v)),
    "Shard.world_size": ("world_size", lambda v: _shard(world_size=v)),
    "Shard.batches.batch_size": ("batch_size", lambda v: next(_shard().batches(v, shuffle=False))),
    "profile_layers.reps": ("reps", lambda v: _measure("profile_layers", reps=v)),
    "profile_layers.memory_steps": ("memory_steps", lambda v: _measure("profile_layers", memory_steps=v)),
    "step_seconds.reps": ("reps", lambda v: _measure("step_seconds", reps=v)),
    "chunked_seconds.chunks": ("chunks", lambda v: _measure("chunked_seconds", chunks=v)),
    "measure_link.nbytes": ("nbytes", lambda v: measure_link(nbytes=v)),
    "measure_link.reps": ("reps", lambda v: measure_link(reps=v)),
    "DenseSpikeDataset.batches.batch_size": ("batch_size", lambda v: next(
        DenseSpikeDataset(torch.zeros(2, 3, 4), torch.zeros(3, dtype=torch.long)).batches(v, shuffle=False))),
    "DenseSpikeDataset.batches.group": ("group", lambda v: next(
        DenseSpikeDataset(torch.zeros(2, 3, 4), torch.zeros(3, dtype=torch.long)).batches(2, shuffle=False, group=v))),
}


@pytest.mark.parametrize("value", NOT_INTS + BAD_SIZES, ids=repr)
@pytest.mark.parametrize("entry", SIZES)
def test_sizes_refused_by_name(entry, value):
    name, call = SIZES[entry]
    _refused(lambda: call(value), name)


def test_padding_may_be_zero_but_not_negative_or_fractional():
    SpikingConv2d(2, 3, 3, padding=0)
    ConvBNLIF(2, 3, 3, 1, padding=(0, 1))
    for bad in (-1, 0.5, math.nan):
        _refused(lambda: SpikingConv2d(2, 3, 3, padding=bad), "padding")
        _refused(lambda: ConvBNLIF(2, 3, 3, 1, bad), "padding")


@pytest.mark.parametrize("model", ["mlp", "shd", "ipu-shd"])
def test_hidden_is_a_list_of_sizes(model):
    """A bare int is refused by name: with two default layers, hidden=512 could mean one or two."""
    for bad in (512, (), None):
        _refused(lambda: build_model(model, (4,), 2, hidden=bad), "hidden")
    assert build_model(model, (4,), 2, None, hidden=[3]) is not None  # a list as a tuple


# ---- real numbers: finite, within their bounds ----------------------------------------------------

NUMBERS = {  # entry: (name, call, values outside the bounds besides the non-finite ones)
    "Dropout.p": ("p", lambda v: Dropout(v), [-0.1, 1.0]),
    "SparseSpikingLinear.sparse_below": ("sparse_below", lambda v: SparseSpikingLinear(3, 3, sparse_below=v), [-0.1, 1.5]),
    "TemporalBatchNorm2d.eps": ("eps", lambda v: TemporalBatchNorm2d(3, eps=v), [0.0, -1e-5]),
    "TemporalBatchNorm1d.momentum": ("momentum", lambda v: TemporalBatchNorm1d(3, momentum=v), [-0.1, 1.5]),
    "BNLIF.eps": ("eps", lambda v: BNLIF(3, eps=v), [0.0]),
    "BNLIF.momentum": ("momentum", lambda v: BNLIF(3, momentum=v), [2.0]),
    "encode.rate.gain": ("gain", lambda v: encode.rate(torch.rand(2), 2, gain=v), [-1.0]),
    "encode.latency.tau": ("tau", lambda v: encode.latency(torch.rand(2), 2, tau=v), [0.0]),
    "encode.latency.threshold": ("threshold", lambda v: encode.latency(torch.rand(2), 2, threshold=v), [1.0]),
    "encode.delta.threshold": ("threshold", lambda v: encode.delta(torch.rand(2, 2), threshold=v), [0.0]),
    "loss.count_mse.correct_rate": ("correct_rate", lambda v: loss.count_mse(
        torch.rand(2, 3), torch.tensor([0, 1]), correct_rate=v), [1.5]),
    "traces.membrane_trace.threshold": ("threshold", lambda v: traces.membrane_trace(
        torch.rand(2, 3), torch.ones(2, 3), "soft", threshold=v), []),
    "traces.membrane_trace.v_reset": ("v_reset", lambda v: traces.membrane_trace(
        torch.rand(2, 3), torch.ones(2, 3), v_reset=v), []),
    "traces.adaptive_threshold_trace.beta": ("beta", lambda v: traces.adaptive_threshold_trace(
        torch.ones(2, 3), beta=v), [-0.5]),
    "traces.adaptive_threshold_trace.adapt_decay": ("adapt_decay", lambda v: traces.adaptive_threshold_trace(
        torch.ones(2, 3), adapt_decay=v), [0.0, 1.5]),
    "LazyAdam.lr": ("lr", lambda v: _adam(lr=v), [-1e-3, 1e39]),
    "LazyAdam.betas": ("betas[0]", lambda v: _adam(betas=(v, 0.9)), [1.0]),
    "LazyAdam.eps": ("eps", lambda v: _adam(eps=v), [-1e-8]),
    "SyntheticSHD.noise": ("noise", lambda v: _synthetic_shd(noise=v), [1.5]),
    "models.width": ("width", lambda v: build_model("shd", (4,), 2, width=v), [0.0]),
    "Trainer.clip_grad_norm": ("clip_grad_norm", lambda v: _trainer(clip_grad_norm=v), [0.0, -1.0, 1e39, 1e-320]),
    "Trainer.max_rate": ("max_rate", lambda v: _trainer(max_rate=v), [-0.1, 1.0]),
    "Trainer.rate_weight": ("rate_weight", lambda v: _trainer(rate_weight=v), [0.0, 1e39]),
    "Trainer.rate_l1": ("rate_l1", lambda v: _trainer(rate_l1=v), [-1.0, 1e39]),
    "Trainer.rate_log": ("rate_log", lambda v: _trainer(rate_log=v), [-1.0, 1e37]),
    "to_nir.dt": ("dt", lambda v: to_nir(_lif_net(), (3,), dt=v), [0.0, -1e-3]),
    "from_nir.dt": ("dt", lambda v: from_nir(to_nir(_lif_net(), (3,)), dt=v), [0.0, -1e-3]),
    "split_stages.slack": ("slack", lambda v: split_stages(
        _layers(), 2, slack=v), [-0.1]),
    "split_stages.costs": ("costs", lambda v: split_stages(
        _layers(), 2, costs=[v, 1, 1, 1]), [-1.0]),
    "PipelineTrainer.timeout": ("timeout", lambda v: _pipeline_trainer(timeout=v), [0.0, -1.0, 1e14]),
    "pipeline_step.timeout": ("timeout", lambda v: _pipeline_step(timeout=v), [0.0, 1e14]),
    "bench.median_ms.budget_s": ("budget_s", lambda v: median_ms(abs, budget_s=v), [-1.0]),
    "bench.median_ms.warmup_s": ("warmup_s", lambda v: median_ms(abs, warmup_s=v), [-1.0, 3601.0, 2.0**70]),
    "plan.rate": ("rate", lambda v: _plan(rate=v), [-0.1, 1.5]),
}
NONE_VALID = {"PipelineTrainer.timeout", "pipeline_step.timeout",  # the group's own timeout
              "TemporalBatchNorm1d.momentum", "BNLIF.momentum",  # torch's cumulative average
              "Trainer.clip_grad_norm", "Trainer.max_rate", "from_nir.dt"}  # off; the graph's own


@pytest.mark.parametrize("entry", NUMBERS)
def test_numbers_refused_by_name(entry):
    name, call, out_of_bounds = NUMBERS[entry]
    for value in NON_FINITE + NON_NUMBERS + out_of_bounds:
        if value is None and entry in NONE_VALID:
            continue
        _refused(lambda: call(value), name)


@pytest.mark.parametrize("value", NOT_INTS + [None, 2**63, -(2**63) - 1], ids=repr)
def test_trainer_seed_is_an_int64(value):
    """torch.manual_seed's range: NaN, 2.5 or 2**70 used to fail inside it at fit's first epoch."""
    _refused(lambda: _trainer(seed=value), "seed")


FLAGS = {  # entry: (name, call); only True and False (a truthy "no" switched compile on)
    "Trainer.compile": ("compile", lambda v: _trainer(compile=v)),
    "Trainer.capture": ("capture", lambda v: _trainer(capture=v)),
    "Trainer.stop_on_nan": ("stop_on_nan", lambda v: _trainer(stop_on_nan=v)),
    "Trainer.progress": ("progress", lambda v: _trainer(progress=v)),
    "Trainer.overwrite": ("overwrite", lambda v: _trainer(overwrite=v)),
    "CapturedStep.enabled": ("enabled", lambda v: CapturedStep(abs, enabled=v)),
}


def _loader_splits(batch_first):
    from torch.utils.data import DataLoader
    from spikefuse.data import loader_splits
    return loader_splits(DataLoader([(torch.zeros(2, 3), 0)]), batch_first=batch_first)


FLAGS.update({
    "EventStore.from_samples.progress": ("progress", lambda v: _from_samples(progress=v)),
    "tonic_sets.pack.progress": ("progress", lambda v: tonic_pack(
        _samples(), (4, 1, 1), "x", progress=v)),
    "cached_store.resident": ("resident", lambda v: _cached(resident=v)),
    "PipelineTrainer.pack_spikes": ("pack_spikes", lambda v: _pipeline_trainer(pack_spikes=v)),
    "pipeline_step.pack_spikes": ("pack_spikes", lambda v: _pipeline_step(pack_spikes=v)),
    "pipeline_step.return_outputs": ("return_outputs", lambda v: _pipeline_step(return_outputs=v)),
    "chunked_step.return_outputs": ("return_outputs", lambda v: _chunked(return_outputs=v)),
    "load.progress": ("progress", lambda v: load("digits", progress=v)),
    "loader_splits.batch_first": ("batch_first", _loader_splits),
    "DataParallel.shard.pad": ("pad", lambda v: DataParallel(0, 2, torch.device("cpu")).shard(_dense(), pad=v)),
    "Shard.batches.shuffle": ("shuffle", lambda v: next(_shard().batches(2, shuffle=v))),
    "EventStore.load.mmap": ("mmap", lambda v: _saved_store(mmap=v)),
    "EventStore.to.resident": ("resident", lambda v: _store().to("cpu", resident=v)),
})


@pytest.mark.parametrize("value", [math.nan, 0, 1, "no"], ids=repr)
@pytest.mark.parametrize("entry", FLAGS)
def test_flags_are_bools(entry, value):
    name, call = FLAGS[entry]
    _refused(lambda: call(value), name)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3", 2**40, 1e300, 1e-320, math.nan])
def test_fit_and_the_cli_share_one_check(value):
    """Trainer's keywords and `spikefuse train`'s options (config.make) say the same words."""
    for option, keyword, field in (("epochs", "epochs", "epochs"), ("batch-size", "batch_size", "batch_size"),
                                   ("seed", "seed", "seed"), ("clip-grad", "clip_grad_norm", "clip_grad")):
        if field != "clip_grad" and isinstance(value, float) and not math.isnan(value) and value > 1:
            continue  # 1e300 as an int option: a type error on both sides, checked above
        try:
            make({field: value})
            cli = None
        except ConfigError as e:
            cli = str(e).replace(option, keyword, 1)
        try:
            _trainer(**{keyword: value})
            fit = None
        except ValueError as e:
            fit = str(e)
        assert cli == fit, (option, value)


@pytest.mark.parametrize("value", [math.nan, 3, True, None, 2**70], ids=repr)
def test_load_root_and_device(value):
    """A cache root that is no path raised os.fspath's TypeError; device 2**70 an OverflowError."""
    _refused(lambda: load("shd-synthetic", root=value), "root")
    _refused(lambda: load("digits", device=value), "device")


@pytest.mark.parametrize("value", [math.nan, "3", 2.5, 2**70], ids=repr)
def test_parallel_devices_and_shapes(value):
    """PipelineTrainer's device: NaN was taken and ignored, 2**70 or '3' failed inside Module.to;
    plan's input_shape: a bare number raised "'float' object is not iterable"; init_data_parallel's
    timeout (a timedelta) and device are checked before the environment is read."""
    _refused(lambda: _pipeline_trainer(device=value), "device")
    _refused(lambda: _plan(input_shape=value), "input_shape")
    _refused(lambda: init_data_parallel(timeout=value), "timeout")
    _refused(lambda: init_data_parallel(device=value), "device")


@pytest.mark.parametrize("value", [math.nan, math.inf, 2.5, 0, -1, True, "3", 2**31, 2**70], ids=repr)
def test_event_store_sensor_size(value):
    """EventStore ran int() over sensor_size: NaN raised from int(), 2.5 was truncated to 2, 0 and
    2**70 were kept; from_samples raised from int() on NaN. One check now (events.check_sensor_size),
    shared with ToFrame and load's data set objects."""
    _refused(lambda: _store((value, 1, 1)), "sensor_size")
    _refused(lambda: _from_samples((1, value, 1)), "sensor_size")
    _refused(lambda: tonic_pack(_samples(), (1, 1, value), "x", progress=False), "sensor_size")
    _refused(lambda: _store(value), "sensor_size")  # not a triple


@pytest.mark.parametrize("value", [math.nan, 2.5, -1, True, "3", 2**70], ids=repr)
def test_event_store_total_and_device(value):
    """from_samples' total (tqdm's bar) took NaN, "3" and -1; a device of NaN or 2**70 failed inside
    torch.device, in EventStore and in cached_store."""
    _refused(lambda: _from_samples(total=value), "total")
    _refused(lambda: _store(device=value), "device")
    _refused(lambda: _cached(device=value), "device")


@pytest.mark.parametrize("value", [math.nan, 3, None], ids=repr)
def test_cache_and_tonic_roots(value):
    """A root that is no path raised os.fspath's TypeError (cached_store, entry_path, open_split)."""
    from spikefuse.data.cache import entry_path
    _refused(lambda: _cached(root=value), "root")
    _refused(lambda: entry_path(value, "x", "train", {}), "root")
    _refused(lambda: open_split("shd", "train", value), "root")


@pytest.mark.parametrize("value", [math.nan, "", "../../escape", "a/b", ".hidden", None], ids=repr)
def test_cache_names_stay_inside_the_cache(value):
    """name="../../escape" wrote its entry two folders above the cache; NaN made a folder "nan-..."."""
    _refused(lambda: _cached(name=value), "name")
    _refused(lambda: _cached(split=value), "split")


@pytest.mark.parametrize("value", ["nope", math.nan, None], ids=repr)
def test_tonic_names_and_splits_before_tonic(value):
    """open_split checks before importing Tonic: an unknown name raised KeyError (after the import),
    a NaN or 'valid' split (not an SHD split) went on to Tonic's download."""
    _refused(lambda: open_split(value, "train", "/nonexistent"), "name")
    _refused(lambda: open_split("shd", value, "/nonexistent"), "split")
    _refused(lambda: open_split("nmnist", "valid", "/nonexistent"), "split")


@pytest.mark.parametrize("value", NOT_INTS + [-1, 2**70], ids=repr)
def test_bench_warm_ups_may_be_zero(value):
    """median_ms' warmup: NaN skipped the warm-up, 2**70 warmed up for ever; 0 is no warm-up."""
    _refused(lambda: median_ms(abs, warmup=value), "warmup")


@pytest.mark.parametrize("value", [math.nan, 2.5, -1, 2, True, "3", 2**70], ids=repr)
def test_shard_rank_is_one_of_world_size(value):
    """A rank past world_size (or NaN) was kept: every batch came out empty, or failed at the first."""
    _refused(lambda: _shard(rank=value), "rank")


@pytest.mark.parametrize("value", [math.nan, 0, "3", True, lambda: 0], ids=["nan", "0", "'3'", "True", "a function"])
def test_shard_generator_is_a_generator(value):
    """Any object reached torch.randperm's generator= (a TypeError listing its signatures)."""
    _refused(lambda: next(_shard().batches(2, shuffle=True, generator=value)), "generator")


@pytest.mark.parametrize("value", [math.nan, 3, "group", True], ids=repr)
def test_convert_sync_batchnorm(value):
    """A non-module raised AttributeError; any object was kept as the group until the first
    training forward's all-reduce."""
    _refused(lambda: convert_sync_batchnorm(value), "module")
    _refused(lambda: convert_sync_batchnorm(torch.nn.Linear(2, 2), value), "process_group")


@pytest.mark.parametrize("helper", ["profile_layers", "saved_bytes", "step_seconds", "chunked_seconds"])
@pytest.mark.parametrize("value", [math.nan, 3, None, "x", torch.tensor(1.0), torch.zeros(3)], ids=repr)
def test_planner_helpers_take_a_time_major_x_and_a_list_of_layers(helper, value):
    """A non-tensor x raised AttributeError deep in the helper; a bare number as layers "not iterable"."""
    _refused(lambda: _measure(helper, x=value), "x")
    if not isinstance(value, torch.Tensor):
        _refused(lambda: _measure(helper, layers=value), "layers")


@pytest.mark.parametrize("value", [math.nan, "cuda:0", ("cpu", "cpu"), ("cuda:0",), ("cuda:0", math.nan)], ids=repr)
def test_measure_link_devices(value):
    """Two CUDA devices, checked before torch.cuda is touched (a CPU pair failed in synchronize)."""
    _refused(lambda: measure_link(value), "devices")


@pytest.mark.parametrize("value", [math.nan, 3, None, True], ids=repr)
def test_event_store_load_and_to_check_before_reading(value):
    """load: a number as directory raised Path's TypeError; the device was checked only after the
    whole split was read. to: device 0 or -1 failed inside Tensor.to, after the columns' copy began."""
    _refused(lambda: _saved_store(value), "directory")
    _refused(lambda: _saved_store("/nonexistent", device=value), "device")  # before the missing files
    _refused(lambda: _store().to(value), "device")


def test_event_store_sample_index():
    """-1 returned an empty sample (offsets[-1]:offsets[0]); len() raised numpy's IndexError."""
    store = _store()
    for bad in (-1, len(store), 2**70, 1.5, math.nan, "0", True):
        _refused(lambda: store.sample(bad), "i")
    assert len(store.sample(len(store) - 1)) == 1


def test_betas_must_be_a_pair():
    for bad in (0.9, (0.9,), "ab", None):
        _refused(lambda: _adam(betas=bad), "betas")


def test_messages_do_not_depend_on_the_backend():
    """BNLIF checks at construction, before it knows which backend runs."""
    for backend in ("reference", "fused", "auto"):
        with pytest.raises(ValueError, match=r"^eps must be a number > 0, got nan$"):
            BNLIF(3, eps=math.nan, backend=backend)


# ---- valid edge values still work ---------------------------------------------------------------------

def test_valid_edges_work():
    assert Dropout(0.0).p == 0.0 and SparseSpikingLinear(2, 2, sparse_below=1).sparse_below == 1.0
    bn = TemporalBatchNorm1d(3, momentum=None)  # torch's cumulative average
    bn(torch.rand(2, 2, 3))
    assert torch.isfinite(bn.running_mean).all()
    assert torch.isfinite(BNLIF(3, eps=1e-3, momentum=1.0, backend="reference")(torch.rand(2, 2, 3))).all()
    assert BNLIF(3, backend="reference")(torch.rand(2, 3), time_steps=2).shape == (2, 2, 3)
    x = torch.rand(4, 5)
    # normalize: tau cancels, so any finite tau gives the same spikes (1e300 used to give none)
    assert torch.equal(encode.latency(x, 6, tau=1e300), encode.latency(x, 6))
    assert encode.rate(x, 1, gain=2**70).shape == (1, 4, 5)  # a huge gain: every step fires
    p = torch.nn.Parameter(torch.ones(2, 2))
    opt = LazyAdam([p], lr=0, betas=(0, 0), eps=0)
    p.grad = torch.ones(2, 2)
    opt.step()
    assert torch.equal(p.detach(), torch.ones(2, 2))
    import numpy as np
    assert SpikingLinear(np.int64(3), 2).in_features == 3  # numpy ints are ints
    assert build_model("cifar-small", (3, 8, 8), 2, None, width=1 / 64).time_steps == 10  # None: the default
    assert len(SyntheticSHD("test", samples=2, seed=-1, noise=1.0)[0][0]) > 0  # negative seeds as the other sets
    assert _trainer(epochs=2**31 - 1, seed=-(2**63), clip_grad_norm=3.4e38, capture=None).epochs == 2**31 - 1
    assert _trainer(max_rate=None, rate_l1=0.0, rate_weight=3.4e38).regularizer is None  # no rate term
    assert CapturedStep(abs, warmup=1, max_graphs=2**31 - 1, enabled=False)(torch.tensor(-1.0)) == 1
    assert _loader_splits(False).train.batch_first is False
    assert split_stages(_layers(), 4, costs=[0, 0, 0, 0], slack=0) == [range(i, i + 1) for i in range(4)]
    assert _pipeline_trainer(4, stages=1, timeout=2.5, pack_spikes=False, device="cpu").chunks == 4
    loss, outputs = _chunked(4, return_outputs=True)  # chunks == T
    assert outputs.shape == (4, 2, 2) and math.isfinite(loss.item())
    many = _plan(rate=1.0, gpus=2**31 - 1)  # more GPUs than layers: noted, not refused
    assert many.gpus == 2**31 - 1 and many.chosen is many.best  # (which row is best is timed: reps=1 on a busy CPU)
    assert median_ms(int, warmup=0, min_reps=1, max_reps=1, budget_s=0, warmup_s=0)[1].__len__() == 1
    assert in_rounds(lambda call: call(), {"a": int}, 1) == ({"a": [0]}, {})
    import numpy as np
    from pathlib import Path
    from spikefuse.data.cache import entry_path
    store = _store((np.int64(2**31 - 1), 1, 1), device=torch.device("cpu"))
    assert store.sensor_size == (2**31 - 1, 1, 1) and isinstance(store.sensor_size[0], int)
    assert len(_from_samples([4, 1, 1], total=0)) == 1  # a list; total is the bar's only
    assert entry_path(Path("~"), "obj-x", "valid", {}).parent.name == "cache"
    shard = DataParallel(1, 2, torch.device("cpu")).shard(_dense(), pad=False)
    assert [len(y) for _, y in shard.batches(4, shuffle=True, generator=torch.Generator())] == [2]
    assert _shard(world_size=1).world_size == 1 and convert_sync_batchnorm(_lif_net()) is not None
    assert len(_measure("profile_layers", memory_steps=2**31 - 1)) == 4 and _measure("saved_bytes") is not None
    assert _measure("chunked_seconds", chunks=4) >= 0  # chunks == T
    assert len(_saved_store(mmap=False).to(torch.device("cpu"), resident=False)) == 2
    assert len(_store().sample(np.int64(0))) == 1
    graph = to_nir(_lif_net(), [3], 2**30, readout="integrator", dt=2**70)
    assert graph.metadata["time_steps"] == 2**30 and graph.metadata["dt"] == 2.0**70
