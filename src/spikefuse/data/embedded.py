"""Data sets that need no download: the digits of scikit-learn (vendored) as spike trains, and Randman.

Everything is computed once as a small uint8 tensor [T, N, features] (a batch is then a
slice) and is a pure function of its arguments and seed.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

DIGITS_FILE = Path(__file__).with_name("digits.npz")  # the split is fixed, whatever the encoding seed
SIZES = {"digits": (1797, 64), "randman": (10 * 500, 100)}  # (samples, features) at the defaults
# peak host bytes per spike cell [T, N, F] while encoding: rate coding draws float64 noise and
# compares it (8 + 1 + 1); latency coding writes uint8; randman scatters, then copies each split
BYTES_PER_CELL = {"rate": 10, "latency": 1, "randman": 2}


def encode_bytes(name: str, time_steps: int) -> tuple[int, int]:
    """(peak host bytes while encoding, bytes of the encoded uint8 spikes) of a whole set."""
    samples, features = SIZES["randman" if name == "randman" else "digits"]
    cells = time_steps * samples * features
    coding = "randman" if name == "randman" else "latency" if name == "digits-latency" else "rate"
    return BYTES_PER_CELL[coding] * cells, cells


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits (1797 x 64, values 0..16) split 80/20 stratified: x_train (in [0, 1]), y_train,
    x_test, y_test. Vendored in digits.npz (47 KB) as scikit-learn's load_digits split by its
    train_test_split(test_size=0.2, stratify=y, random_state=0): the same arrays, without
    importing scikit-learn (3.5 s, and a 40 MB dependency, for 115 KB of data). The data are
    the UCI optical recognition of handwritten digits test set (Alpaydin & Kaynak, 1998)."""
    with np.load(DIGITS_FILE) as f:
        return (f["x_train"] / 16.0, f["y_train"].astype(np.int64), f["x_test"] / 16.0,
                f["y_test"].astype(np.int64))


def rate_code(intensity: torch.Tensor, time_steps: int, generator: torch.Generator) -> torch.Tensor:
    """Bernoulli spikes, p = intensity in [0, 1] at every step: [N, F] -> uint8 [T, N, F]."""
    noise = torch.rand((time_steps, *intensity.shape), generator=generator, dtype=torch.float64)
    return (noise < intensity).to(torch.uint8)


def latency_code(intensity: torch.Tensor, time_steps: int) -> torch.Tensor:
    """One spike per feature, brighter = earlier: step round((1 - intensity) * (T - 1)); zero never fires."""
    step = torch.round((1 - intensity) * (time_steps - 1)).to(torch.int64)
    spikes = torch.zeros((time_steps, *intensity.shape), dtype=torch.uint8)
    fires = intensity > 0
    n_idx, f_idx = fires.nonzero(as_tuple=True)
    spikes[step[fires], n_idx, f_idx] = 1
    return spikes


def digits(time_steps: int = 20, coding: str = "rate", seed: int = 0):
    """(train_spikes, train_targets, test_spikes, test_targets); spikes uint8 [T, N, 64]."""
    if coding not in ("rate", "latency"):
        raise ValueError(f"coding: expected 'rate' or 'latency', got {coding!r}")
    x_tr, y_tr, x_te, y_te = digits_split()
    g = torch.Generator().manual_seed(seed)
    out = []
    for x, y in ((x_tr, y_tr), (x_te, y_te)):
        x = torch.from_numpy(x)
        spikes = rate_code(x, time_steps, g) if coding == "rate" else latency_code(x, time_steps)
        out += [spikes, torch.from_numpy(y).to(torch.int64)]
    return tuple(out)


def _random_function(x: torch.Tensor, n_out: int, alpha: float, g: torch.Generator, precision=1e-3):
    """Smooth random maps [0,1]^D -> R^n_out: per output and latent dimension a random Fourier
    series with amplitudes falling as 1/k^alpha (cut where they drop below `precision`),
    multiplied over the latent dimensions."""
    n, dim = x.shape
    cutoff = min(int(math.ceil(precision ** (-1 / alpha))), 1000)
    k = torch.arange(cutoff, dtype=torch.float64)
    spectrum = 1.0 / (k + 1) ** alpha
    a, b, c = (torch.rand((n_out, dim, cutoff), generator=g, dtype=torch.float64) for _ in range(3))
    # phase[n, out, dim, k] = 2 pi (k * b * x + c)
    phase = 2 * math.pi * (k * b * x[:, None, :, None] + c)
    return (a * spectrum * torch.sin(phase)).sum(-1).prod(-1)  # [n, n_out]


def randman(time_steps: int = 50, n_classes: int = 10, n_units: int = 100, samples_per_class: int = 500,
            manifold_dim: int = 1, alpha: float = 2.0, test_fraction: float = 0.2, seed: int = 0):
    """Zenke & Vogels' random manifold task: each class is a smooth random manifold in the space of
    spike times; a sample is a random point on its class manifold, each unit firing once at the
    time given by the manifold coordinate (min-max scaled per class and unit to the T steps).
    Returns (train_spikes, train_targets, test_spikes, test_targets), spikes uint8 [T, N, n_units]."""
    g = torch.Generator().manual_seed(seed)
    times, labels = [], []
    for cls in range(n_classes):
        point = torch.rand((samples_per_class, manifold_dim), generator=g, dtype=torch.float64)
        y = _random_function(point, n_units, alpha, g)
        lo, hi = y.min(0).values, y.max(0).values
        y = (y - lo) / (hi - lo + 1e-12)
        times.append(torch.clamp((y * time_steps).long(), max=time_steps - 1))
        labels.append(torch.full((samples_per_class,), cls, dtype=torch.int64))
    times, labels = torch.cat(times), torch.cat(labels)
    order = torch.randperm(len(labels), generator=g)
    times, labels = times[order], labels[order]
    spikes = torch.zeros((time_steps, len(labels), n_units), dtype=torch.uint8)
    spikes.scatter_(0, times[None], 1)
    n_test = int(round(test_fraction * len(labels)))
    return spikes[:, n_test:].contiguous(), labels[n_test:], spikes[:, :n_test].contiguous(), labels[:n_test]
