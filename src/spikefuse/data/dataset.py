"""`SpikeDataset` (what the trainer iterates) and `Splits` (what `load` returns).

Batches are cut on the device the data lives on: no DataLoader, no workers. A dense set
is one precomputed tensor [T, N, *shape] and a batch is an index_select; an event set is
a packed `EventStore` and a batch is gathered and framed on the store's device.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .framing import ToFrame
from .store import EventStore


class SpikeDataset:
    """Base: `len(ds)`, `ds.targets` (int64), `ds.batches(...)` -> (x [T, B, *shape] float32, y [B])."""

    def __init__(self, targets: torch.Tensor, input_shape: tuple[int, ...], time_steps: int):
        self.targets = torch.as_tensor(targets, dtype=torch.int64)
        self.input_shape = tuple(input_shape)
        self.time_steps = int(time_steps)

    def __len__(self) -> int:
        return len(self.targets)

    @property
    def device(self) -> torch.device:
        return self.targets.device

    def batches(self, batch_size: int, *, shuffle: bool, generator: torch.Generator | None = None,
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (x, y), x float32 time-major [T, B, *input_shape]; order fixed by `generator`."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
        n = len(self)
        # the permutation is drawn on the CPU so a CPU generator gives one order on every device
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        # a host copy of the order lets event sets plan batches without a device sync
        order_dev = order.to(self.device)
        for i in range(0, n, batch_size):
            idx = order_dev[i:i + batch_size]
            if drop_last and len(idx) < batch_size:
                break
            yield self._get(idx, order[i:i + batch_size]), self.targets[idx]

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _get(self, idx: torch.Tensor, host_idx: torch.Tensor) -> torch.Tensor:
        """`get` given the same indices both on the device and on the host."""
        return self.get(idx)


class DenseSpikeDataset(SpikeDataset):
    """Spikes precomputed once as `data` [T, N, *input_shape] (any dtype; cast per batch)."""

    def __init__(self, data: torch.Tensor, targets: torch.Tensor):
        if data.dim() < 3 or data.shape[1] != len(targets):
            raise ValueError(f"data: expected [T, N, ...] with N = {len(targets)}, got {tuple(data.shape)}")
        super().__init__(targets.to(data.device), data.shape[2:], data.shape[0])
        self.data = data

    def get(self, idx):
        return self.data.index_select(1, idx).to(torch.float32)


class EventSpikeDataset(SpikeDataset):
    """Events in a packed store, framed per batch by `frame` to exactly `time_steps` frames."""

    def __init__(self, store: EventStore, frame: ToFrame, time_steps: int, input_shape: tuple[int, ...]):
        super().__init__(store.targets_tensor(), input_shape, time_steps)
        self.store, self.frame = store, frame

    def get(self, idx):
        return self._get(idx, idx.cpu())  # a sync only when idx lives on a GPU

    def _get(self, idx, host_idx):
        x = self.frame.batch_from_store(self.store, host_idx, num_frames=self.time_steps)
        if x is not None:  # the fast path: a few launches, no host sync
            return x.reshape(self.time_steps, len(host_idx), *self.input_shape)
        cols, offsets = self.store.gather(host_idx)
        x = self.frame.batch(cols, offsets, num_frames=self.time_steps, validate=False)
        return x.reshape(self.time_steps, len(idx), *self.input_shape)


@dataclass
class Splits:
    """A data set's train and test splits plus what a model needs to know about them."""

    name: str
    train: SpikeDataset
    test: SpikeDataset
    num_classes: int
    input_shape: tuple[int, ...]
    time_steps: int
