"""Data parallel on torch.distributed: one process per GPU, started by torchrun (or by
`spikefuse train --gpus N` through torch's elastic launcher), DistributedDataParallel over a
model whose temporal BN layers are synchronised (sync_bn.py), and data cut per rank.

    # torchrun --nproc-per-node N train.py
    dp = init_data_parallel()                        # process group, this rank's device
    model = convert_sync_batchnorm(build_model(...), dp.sync_bn_group)  # the same initial weights everywhere
    trainer = Trainer(model, splits, optimizer, device=dp.device, data_parallel=dp, ...)

A step trains on one global batch: the data set's own order (the same generator on every
rank) cut into batches of the global batch size, each batch cut into world_size equal
slices, slice `rank` on this rank (Shard). DDP averages the ranks' gradients of their mean
losses, which is then exactly the global batch's mean gradient; with SyncBN the whole step
equals one process training on the global batch.
"""
from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import os
import re
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ..data.events import check_flag
from ..data.framing import check_batch_size
from ..neuron_options import check_int
from .grad_reduce import GradientReducer
from .sync_bn import SYNCABLE

TIMEOUT = datetime.timedelta(minutes=30)  # a collective waiting longer than this fails (a hung rank)


def launched() -> bool:
    """Whether this process is one of several started by torchrun (or the elastic launcher)."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel run (its process group initialised)."""

    rank: int
    world_size: int
    device: torch.device
    group: object = None  # None: the default process group
    # SyncBN's own group (the same ranks, another NCCL communicator): collectives of one
    # group run one after another, and on DDP's group a BN layer's backward all-reduce, on the
    # step's critical path, would queue behind the gradient buckets in flight
    sync_bn_group: object = None
    # PyTorch's notes on CUDA graphs: DDP needs 11 eager iterations before its step is
    # captured (its reducer samples runtime statistics on the host in the first 10)
    capture_warmup: ClassVar[int] = 11
    # spikefuse's GradientReducer learns its buckets in the first step
    reducer_warmup: ClassVar[int] = 3

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs and writes the run directory."""
        return self.rank == 0

    def wrap(self, model: nn.Module, *, stream: torch.cuda.Stream | None = None, static_graph: bool = True,
             bucket_cap_mb: float | None = None):
        """`model` in DistributedDataParallel: gradients all-reduced bucket by bucket while
        backward still runs, written straight into the buckets (gradient_as_bucket_view).
        static_graph: the model uses the same parameters at every step (DDP then skips its
        per-step search for unused ones). Buffers are broadcast from rank 0 at every forward
        unless every module holding buffers is a synchronised BN layer (equal on all ranks).
        stream: construct on this CUDA stream, the side stream the captured step warms up and
        captures on (CapturedStep(stream=...)): DDP's gradient hooks and the parameters'
        AccumulateGrad nodes run on the stream they were made on, and a backward on another
        stream makes PyTorch synchronise the two (and warn). bucket_cap_mb: DDP's bucket size
        (None: its default, 25 MB)."""
        from torch.nn.parallel import DistributedDataParallel

        options = dict(device_ids=[self.device.index] if self.device.type == "cuda" else None,
                       process_group=self.group, gradient_as_bucket_view=True, static_graph=static_graph)
        if bucket_cap_mb is not None:
            options["bucket_cap_mb"] = bucket_cap_mb
        if not _local_buffers(model):  # torch 2.13 renamed the option
            sync = inspect.signature(DistributedDataParallel).parameters
            options["forward_sync_buffers" if "forward_sync_buffers" in sync else "broadcast_buffers"] = False
        if stream is None:
            return DistributedDataParallel(model, **options)
        main = torch.cuda.current_stream(self.device)
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            wrapped = DistributedDataParallel(model, **options)
        main.wait_stream(stream)
        return wrapped

    def reducer(self, model: nn.Module, *, bucket_mb: float | None = None, transport: str = "auto",
                optimizer: torch.optim.Optimizer | None = None) -> GradientReducer:
        """A GradientReducer for `model` over this run's group (what the Trainer uses instead of
        wrap: the same averaged gradients, without DDP's bookkeeping inside the step). Buffers
        of modules that are not synchronised BN layers are broadcast by sync_buffers().
        transport: how the buckets travel; optimizer: stepped by the reducer, bucket by bucket
        in captured steps (GradientReducer)."""
        options = {} if bucket_mb is None else {"bucket_mb": bucket_mb}
        return GradientReducer(model, self.group, buffers=_local_buffers(model), transport=transport,
                               optimizer=optimizer, **options)

    def shard(self, dataset, *, pad: bool) -> "Shard":
        return Shard(dataset, self.rank, self.world_size, pad=pad)

    def sum_(self, *tensors: torch.Tensor) -> None:
        """Sum each tensor over the ranks, in place."""
        for t in tensors:
            dist.all_reduce(t, group=self.group)

    def total(self, count: int) -> int:
        """A host count summed over the ranks."""
        t = torch.tensor([count], dtype=torch.float64, device=self.device)
        self.sum_(t)
        return int(t.item())

    def all_gather(self, obj) -> list:
        """Every rank's `obj` (picklable), in rank order."""
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the block first (it builds caches), then the others."""
        if not self.is_main:
            dist.barrier(group=self.group)
        yield
        if self.is_main:
            dist.barrier(group=self.group)

    def rank_seed(self, seed: int) -> int:
        """A seed of its own for this rank (dropout masks differ across ranks): rank 0 keeps
        `seed`, rank r > 0 gets another 63-bit value."""
        return (seed + self.rank * 0x9E3779B97F4A7C15) % 2**63


def init_data_parallel(device: str = "auto", timeout: datetime.timedelta = TIMEOUT) -> DataParallel:
    """The process group of this torchrun process (nccl on CUDA, gloo on the CPU) and its
    device: GPU LOCAL_RANK for "auto" (when CUDA is there) or "cuda", the CPU for "cpu".
    Uses an already initialised default group as it is. ValueError on a device that cannot be."""
    # checked before the environment is read: a timeout of 5 (no timedelta) failed inside torch
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device {device!r}: under torchrun each process uses the GPU of its LOCAL_RANK; "
                         "pass cuda, cpu or auto")
    if not isinstance(timeout, datetime.timedelta) or timeout <= datetime.timedelta(0):
        raise ValueError(f"timeout: expected a datetime.timedelta > 0, got {timeout!r}")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device == "cuda":
        if local_rank >= gpus:
            raise ValueError(f"this process is local rank {local_rank} but this machine has {gpus} CUDA "
                             "GPU(s); start at most one process per GPU")
        where = torch.device("cuda", local_rank)
        torch.cuda.set_device(where)
    else:
        where = torch.device("cpu")
    if not dist.is_initialized():
        # device_id: NCCL starts at once (eager), not lazily at the first collective or send/recv.
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo", timeout=timeout,
                                device_id=where if where.type == "cuda" else None)
    if (dist.get_rank(), dist.get_world_size()) != (rank, world):
        raise ValueError(f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, but "
                         f"the environment says rank {rank} of {world}")
    return DataParallel(rank, world, where, sync_bn_group=dist.new_group(ranks=list(range(world)), timeout=timeout))


def _local_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers that ranks may update differently: those of modules other than synchronised BN layers."""
    return [b for m in model.modules() if not (isinstance(m, SYNCABLE) and m.sync is not None)
            for b in m.buffers(recurse=False)]


class Shard:
    """This rank's slices of a data set's global batches (a DistributedSampler over data
    already on the device). Every rank draws the data set's order (torch.randperm with the
    same generator, as SpikeDataset.batches does), cuts it into global batches and keeps
    slice `rank` of each. pad=True (training) repeats the order's first samples up to a
    multiple of world_size, as DistributedSampler does, so that with a global batch size
    divisible by world_size every slice of every batch is equally long.

    dataset: anything with len(), `targets` and `get(idx)` -> x [T, len(idx), ...]
    (spikefuse.data.SpikeDataset)."""

    def __init__(self, dataset, rank: int, world_size: int, *, pad: bool):
        missing = [name for name in ("get", "targets") if not hasattr(dataset, name)]
        if missing:
            raise TypeError(f"data parallel needs data sets with random access; {type(dataset).__name__} "
                            f"has no {' or '.join(missing)} (see spikefuse.data.SpikeDataset)")
        # pad="no" padded, a NaN world_size or a rank past it failed at the first batch (or gave none)
        world_size = check_int("world_size", world_size)
        rank = check_int("rank", rank, 0, world_size - 1)
        self.dataset, self.rank, self.world_size, self.pad = dataset, rank, world_size, check_flag("pad", pad)

    def batches(self, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None):
        """Yield this rank's (x, y) of each global batch of `batch_size` samples."""
        check_batch_size(batch_size)  # SpikeDataset.batches' words: 0 raised range()'s ValueError
        shuffle = check_flag("shuffle", shuffle)
        if not (generator is None or isinstance(generator, torch.Generator)):
            raise ValueError(f"generator: expected a torch.Generator or None, got {generator!r}")
        n = len(self.dataset)
        if self.pad and batch_size % self.world_size:
            raise ValueError(f"batch_size {batch_size} does not split into {self.world_size} equal slices")
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        if self.pad and n:
            order = order[torch.arange(-(-n // self.world_size) * self.world_size) % n]
        targets = self.dataset.targets
        on_device = order.to(targets.device)  # once per pass: no host-device sync per batch
        for start in range(0, len(order), batch_size):
            mine = slice(start, start + batch_size)
            host = order[mine].tensor_split(self.world_size)[self.rank]
            if len(host):
                idx = on_device[mine].tensor_split(self.world_size)[self.rank]
                yield self._get(idx, host), targets[idx]

    def _get(self, idx: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        """x of samples idx (given on the data's device and on the host). A SpikeDataset
        makes it from both without a sync; other data sets through get()."""
        make = getattr(self.dataset, "_get_batches", None)
        return make(idx, host, len(host))[0] if make is not None else self.dataset.get(host)


def lost_peer(e: BaseException) -> bool:
    """Whether `e` is a collective that failed because another rank is gone or stuck."""
    text = str(e)
    return isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and any(
        word in text for word in ("gloo", "NCCL", "Connection reset", "Connection closed", "Broken pipe")))


def peer_error(e: BaseException) -> str:
    """The gist of a failed collective's message: its first sentence, without the source
    location gloo and NCCL put in front."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", (str(e).strip().splitlines() or [""])[0])
    return text.split(". ")[0].rstrip(".") or type(e).__name__


def launch(nproc: int, argv: list[str]) -> int:
    """Run `python -m spikefuse *argv` as `nproc` processes on this machine through torch's
    elastic launcher (what `torchrun --standalone --nproc-per-node nproc` does) and return
    their exit code. Each worker prints its own one-line error; a worker killed by a signal
    is reported here (spikefuse.errors.RunError). The other workers are stopped when one fails."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ..errors import RunError
    from .pipeline import check_count

    nproc = check_count("nproc", nproc)  # NaN or 2.5 failed inside the launcher's config
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
    agent_log = logging.getLogger("torch.distributed.elastic")
    level = agent_log.level
    agent_log.setLevel(logging.CRITICAL)  # the workers' one-line errors say it; no agent tables
    # the agent installs its own handlers (Ctrl-C raises its SignalException): put ours back after
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        elastic_launch(config, sys.executable)("-m", "spikefuse", *argv)
        return 0
    except ChildFailedError as e:
        rank, failure = _root_failure(e.failures)
        if failure.exitcode > 0:  # it exited on its own, after printing why
            return failure.exitcode
        name = _signal_name(-failure.exitcode)
        why = " (out of host memory?)" if name == "SIGKILL" else ""
        raise RunError(f"rank {rank} of {nproc} was killed by {name}{why}; the other ranks were stopped") from None
    except SignalException as e:  # Ctrl-C or a kill reached the launcher: the workers have it too
        return 128 + int(e.sigval)
    finally:
        agent_log.setLevel(level)
        if threading.current_thread() is threading.main_thread():
            for number, handler in handlers.items():
                signal.signal(number, handler)


def _root_failure(failures: dict):
    """The failure that caused the others: the earliest worker that exited on its own (the
    launcher then stops the rest with SIGTERM), else the earliest."""
    order = sorted(failures.items(), key=lambda item: item[1].timestamp)
    own = [item for item in order if item[1].exitcode > 0]
    return (own or order)[0]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
