"""`SpikeDataset` (what the trainer iterates) and `Splits` (what `load` returns).

Batches are cut on the device the data lives on: no DataLoader, no workers. A dense set
is one precomputed tensor [T, N, *shape] and a batch is an index_select; an event set is
a packed `EventStore` and a batch is gathered and framed on the store's device. Several
consecutive batches are made in one pass (`group`), so the per-launch host cost is paid
once per group rather than once per batch. A static set (`StaticImageDataset`: images)
has no time axis: its batches are [B, *shape] and the model repeats them over its steps.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..neuron_options import ArgumentError, check_int
from .events import class_indices
from .framing import ToFrame, check_batch_size
from .store import EventStore


# Batches made in one pass by default: a group's frames and its framing temporaries exist at
# once, so the group is capped by bytes (`batch_bytes`): GROUP_BYTES, or on a GPU 1/32 of its
# memory if that is more; and by a count. Every pass costs the host a fixed ~1 ms of launches
# that the GPU waits through between two training steps, so fewer, larger groups keep it busier.
GROUP_BYTES = 2**30
GROUP_MEMORY_FRACTION = 32
MAX_GROUP = 64
# framing temporaries per event of a group: int64 indices and the gathered per-sample table
FRAMING_BYTES_PER_EVENT = 96


class SpikeDataset:
    """Base: `len(ds)`, `ds.targets` (int64), `ds.batches(...)` -> (x [T, B, *shape] float32, y [B]).

    time_major False (StaticImageDataset): x is [B, *shape] wherever this says [T, B, *shape].
    """

    time_major = True

    def __init__(self, targets: torch.Tensor, input_shape: tuple[int, ...], time_steps: int):
        self.targets = class_indices(targets)  # casting would make 2.5 class 2 and keep -1
        # int() truncated 2.5, read "3" and True as steps and raised on NaN; 0, -1 and a shape
        # of the wrong size failed at the first batch, if at all
        if not isinstance(input_shape, (tuple, list)):
            raise ArgumentError(f"input_shape must be a tuple of ints, got {input_shape!r}")
        self.input_shape = tuple(check_int("input_shape", d) for d in input_shape)
        self.time_steps = check_int("time_steps", time_steps)

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def device(self) -> torch.device:
        return self.targets.device

    def batches(self, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None,
                drop_last: bool = False, group: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (x, y), x float32 time-major [T, B, *input_shape] (contiguous); order fixed by `generator`.

        group: how many consecutive batches are made in one pass (one set of launches, then a
        view per batch); default `default_group(batch_size)`. Memory: about group times
        `batch_bytes(batch_size)`. The batches are the same whatever the group.
        """
        check_batch_size(batch_size)
        # check_int's bound (2**31 - 1): any group past the batch count makes them all at once
        group = self.default_group(batch_size) if group is None else check_int("group", group)
        n = len(self)
        stop = n - n % batch_size if drop_last else n
        # the permutation is drawn on the CPU so a CPU generator gives one order on every device
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        # a host copy of the order lets event sets plan batches without a device sync
        order_dev = order.to(self.device)
        edges = _group_edges(stop, batch_size, group)

        def make(bounds):
            lo, hi = bounds
            idx = order_dev[lo:hi]
            return self.targets[idx].split(batch_size), self._get_batches(idx, order[lo:hi], batch_size)
        yield from _made_ahead(make, zip(edges, edges[1:]), self.device)

    def default_group(self, batch_size: int) -> int:
        """Batches made at once by default: as many as fit in the byte budget, 1 to MAX_GROUP."""
        budget = GROUP_BYTES
        if self.device.type == "cuda":
            budget = max(budget, torch.cuda.get_device_properties(self.device).total_memory // GROUP_MEMORY_FRACTION)
        return max(1, min(MAX_GROUP, budget // max(self.batch_bytes(batch_size), 1)))

    def batch_bytes(self, batch_size: int) -> int:
        """Device memory one batch of a group accounts for: its float32 frames three times
        (the group being used, the next one made ahead on a GPU, and the previous one the
        consumer's last batch may still hold)."""
        return 3 * self.frame_bytes(batch_size)

    def frame_bytes(self, batch_size: int) -> int:
        """Bytes of one batch's float32 frames."""
        return 4 * self.time_steps * batch_size * math.prod(self.input_shape)

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        """x [T, len(idx), *input_shape] of samples `idx`."""
        # the host copy costs a sync only when idx lives on a GPU
        return self._get_batches(idx.to(self.device), idx.cpu(), max(len(idx), 1))[0]

    def _get_batches(self, idx: torch.Tensor, host_idx: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
        """x of every run of `batch_size` samples of idx (the last may be shorter), each
        contiguous, made in one pass; idx given both on the device and on the host."""
        raise NotImplementedError


class DenseSpikeDataset(SpikeDataset):
    """Spikes precomputed once as `data` [T, N, *input_shape] (any dtype; cast per batch)."""

    def __init__(self, data: torch.Tensor, targets: torch.Tensor):
        if data.dim() < 3 or data.shape[1] != len(targets):
            raise ValueError(f"data: expected [T, N, ...] with N = {len(targets)}, got {tuple(data.shape)}")
        super().__init__(targets.to(data.device), data.shape[2:], data.shape[0])
        self.data = data

    def batch_bytes(self, batch_size):
        # plus the gathered samples in data's dtype, before the cast to float32
        return super().batch_bytes(batch_size) + self.frame_bytes(batch_size) * self.data.element_size() // 4

    def _get_batches(self, idx, host_idx, batch_size):
        x = self.data.index_select(1, idx)
        full = len(idx) - len(idx) % batch_size
        # [T, G*B, ...] -> [G, T, B, ...]: one copy both casts and makes every batch contiguous
        out = list(_float32_copy(x[:, :full].unflatten(1, (-1, batch_size)).movedim(1, 0)))
        if full < len(idx) or not out:
            out.append(_float32_copy(x[:, full:]))
        return out


class StaticImageDataset(SpikeDataset):
    """Static inputs `data` [N, *input_shape] (images; any dtype, cast per batch): batches
    x [B, *input_shape], no time axis. The model repeats x at each of its `time_steps` steps (direct encoding, as the CIFAR
    nets and ResNets of spikefuse.models do with a 4-d input, convolving the image once), so
    a batch is not T copies; `time_steps` is the T the model is built with."""

    time_major = False

    def __init__(self, data: torch.Tensor, targets: torch.Tensor, time_steps: int):
        if data.dim() < 2 or data.shape[0] != len(targets):
            raise ValueError(f"data: expected [N, ...] with N = {len(targets)}, got {tuple(data.shape)}")
        super().__init__(targets.to(data.device), data.shape[1:], time_steps)
        self.data = data

    def frame_bytes(self, batch_size):
        return 4 * batch_size * math.prod(self.input_shape)

    def batch_bytes(self, batch_size):
        # plus the gathered samples in data's dtype, before the cast to float32
        return super().batch_bytes(batch_size) + self.frame_bytes(batch_size) * self.data.element_size() // 4

    def _get_batches(self, idx, host_idx, batch_size):
        # rows of one contiguous gathered tensor: every batch is a contiguous view of it
        return list(self.data.index_select(0, idx).to(torch.float32).split(batch_size))


def _group_edges(stop: int, batch_size: int, group: int) -> list[int]:
    """Sample offsets where groups start and end: the first group is one batch (nothing runs
    beside its making, so it is kept short); the rest is split into the fewest groups of at
    most `group` batches, of near-equal size (a short last group would cost a whole framing
    pass for a few batches)."""
    if not stop:
        return []
    first = min(batch_size, stop)
    batches = -(-(stop - first) // batch_size)
    groups = -(-batches // group)
    per_group = -(-batches // groups) if groups else 0
    return [0, *range(first, stop, per_group * batch_size), stop] if groups else [0, stop]


def _made_ahead(make, starts, device: torch.device):
    """Yield (x, y), batch by batch, of make(start) for each start (here: a group's bounds; make
    returns the group's targets and xs). On a GPU the next group is made on a side stream while the
    consumer trains on the current one: the framing kernels then overlap the training step's (small,
    launch-bound) kernels instead of running between steps."""
    starts = list(starts)
    if device.type != "cuda":  # made when needed: nothing would overlap
        return _batches_of_groups(make, lambda made: made, starts, ahead=False)
    main, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    written = torch.cuda.Event()  # the order and the store, written on the main stream before now
    written.record(main)

    def launch(start):
        side.wait_event(written)  # (not the main stream as it is later: the next group overlaps the steps)
        with torch.cuda.stream(side):
            made = make(start)
        done = torch.cuda.Event()
        done.record(side)
        return made, done

    def take(launched):
        (targets, xs), done = launched
        main.wait_event(done)
        for t in (*targets, *xs):  # made on the side stream, used on the main one
            t.record_stream(main)
        return targets, xs
    return _batches_of_groups(launch, take, starts, ahead=True)


def _batches_of_groups(launch, take, starts: list, ahead: bool):
    """(x, y) of each group launch(start) makes, take(launched) hands over. With `ahead`, the next
    group is launched once the consumer asks for the current group's second batch: the first step
    starts after the first group's making alone (one batch), not also the second's (the rest of the
    epoch), and a cold first step asks for its kernels' compiles that much sooner."""
    pending = launch(starts[0]) if starts else None
    for k in range(len(starts)):
        targets, xs = take(pending)
        pending = None
        for x, y in zip(xs, targets):
            yield x, y
            if ahead and pending is None and k + 1 < len(starts):  # the consumer ran its first batch
                pending = launch(starts[k + 1])
        if pending is None and k + 1 < len(starts):
            pending = launch(starts[k + 1])


def _float32_copy(x: torch.Tensor) -> torch.Tensor:
    """x as a new contiguous float32 tensor: one kernel casts and lays out whatever x's strides."""
    return torch.empty_like(x, dtype=torch.float32, memory_format=torch.contiguous_format).copy_(x)


class EventSpikeDataset(SpikeDataset):
    """Events in a packed store, framed per group of batches by `frame` to exactly `time_steps` frames."""

    def __init__(self, store: EventStore, frame: ToFrame, time_steps: int, input_shape: tuple[int, ...]):
        super().__init__(store.targets_tensor(), input_shape, time_steps)
        cells = math.prod(frame.sensor_size)  # a frame per sample and step: (P, H, W) of the sensor
        if math.prod(self.input_shape) != cells:  # the batches' view raised torch's shape error
            raise ValueError(f"input_shape: {self.input_shape} holds {math.prod(self.input_shape)} values per step, "
                             f"but frame's sensor_size {tuple(frame.sensor_size)} gives {cells}")
        self.store, self.frame = store, frame

    def batch_bytes(self, batch_size):
        events = len(self.store.events) * batch_size // max(len(self.store), 1)
        return super().batch_bytes(batch_size) + FRAMING_BYTES_PER_EVENT * events

    def _get_batches(self, idx, host_idx, batch_size):
        steps = self.time_steps
        xs = self.frame.batches_from_store(self.store, host_idx, batch_size, num_frames=steps)
        if xs is None:  # modes and stores the fast path does not cover (host syncs)
            cols, offsets = self.store.gather(host_idx)
            xs = self.frame.batches(cols, offsets, batch_size, num_frames=steps, validate=False)
        return [x.view(steps, x.shape[1], *self.input_shape) for x in xs]


@dataclass
class Splits:
    """A data set's train and test splits plus what a model needs to know about them."""

    name: str
    train: SpikeDataset
    test: SpikeDataset
    num_classes: int
    input_shape: tuple[int, ...]
    time_steps: int
