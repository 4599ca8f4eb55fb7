"""Spiking data: embedded sets, Tonic event sets, GPU framing, packed event stores and caches.

    splits = spikefuse.data.load("digits", device="cuda")
    for x, y in splits.train.batches(128, shuffle=True, generator=g):  # x: [T, B, *input_shape]
        ...                                   # (static images, as cifar-synthetic's: [B, *input_shape])

    splits = spikefuse.data.load(train_set, test=test_set, time_steps=30)  # Tonic / map-style data sets
    fit(model, (train_loader, test_loader), opt, ...)  # DataLoaders of (x [B, T, ...], y): loader_splits
"""
from .dataset import DenseSpikeDataset, EventSpikeDataset, SpikeDataset, Splits, StaticImageDataset
from .foreign import LoaderSplits, loader_splits
from .framing import Downsample, ToFrame
from .registry import DATASETS, load
from .store import EventStore
from .tonic_sets import DatasetUnavailable

__all__ = [
    "DATASETS", "load", "Splits", "SpikeDataset", "DenseSpikeDataset", "EventSpikeDataset", "StaticImageDataset",
    "ToFrame", "Downsample", "EventStore", "DatasetUnavailable", "loader_splits", "LoaderSplits",
]
