"""CIFAR-shaped images (3x32x32, values in [0, 1], 10 classes), for training without the download.

Each class has a template: an oriented grating of its own frequency between two colours,
and a coloured blob at its own place. Classes come in pairs that share their colours and
differ in the grating's orientation (90 degrees apart) and the blob's place, so colour
alone tells only the pair: a conv net has to see orientation and layout, which it learns
in an epoch or two. Every sample jitters its class's template (orientation, frequency,
phase, contrast, colours, brightness, blob place and size), may carry a distractor blob of
a random colour, and gets pixel noise. 2000 train / 500 test images. Sample i depends
only on (seed, split, i); the templates on the seed alone.
"""
from __future__ import annotations

import numpy as np

from .synthetic import balanced_targets, split_size

SHAPE = (3, 32, 32)
NUM_CLASSES = 10
SPLIT_SIZES = {"train": 2000, "test": 500}
SALT = 3232  # keeps this set's random streams apart from the other synthetic sets'


class SyntheticCIFAR:
    """`ds[i] -> (image [3, 32, 32] float32, target)`; `ds.arrays()`: all of them at once."""

    shape = SHAPE
    classes = [str(c) for c in range(NUM_CLASSES)]

    def __init__(self, split: str = "train", *, samples: int | None = None, seed: int = 0):
        n = split_size(split, SPLIT_SIZES, samples, seed)
        self.split, self.seed = split, seed
        key = seed % 2**64  # numpy seeds are >= 0
        rng = np.random.default_rng([key, SALT, 0])
        pairs = NUM_CLASSES // 2
        base = rng.permutation(pairs) * np.pi / (2 * pairs) + rng.uniform(0, np.pi / (2 * pairs))
        self.templates = {
            "angle": np.stack([base, base + np.pi / 2], axis=1).reshape(-1),  # class 2k and 2k+1: 90 degrees apart
            "freq": rng.uniform(0.08, 0.2, NUM_CLASSES),  # cycles per pixel
            "colours": np.repeat(rng.uniform(0.1, 0.9, (pairs, 2, 3)), 2, axis=0),  # the pair's two colours
            "blob_at": rng.uniform(8, 24, (NUM_CLASSES, 2)),
            "blob_colour": rng.uniform(0, 1, (NUM_CLASSES, 3)),
        }
        self._key = (key, SALT, 1 + list(SPLIT_SIZES).index(split))
        self.targets = balanced_targets(self._key, NUM_CLASSES, n)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        images, targets = self.arrays([i])
        return images[0], int(targets[0])

    def arrays(self, indices=None) -> tuple[np.ndarray, np.ndarray]:
        """(images [n, 3, 32, 32] float32, targets [n] int64) of `indices` (default: all), rendered together."""
        idx = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        cls = self.targets[idx]
        tp = {k: v[cls] for k, v in self.templates.items()}
        rngs = [np.random.default_rng([*self._key, 2, int(i)]) for i in idx]
        # every sample's own draws, from its own stream: [n, ...] per parameter
        draws = [(r.normal(0, np.radians(5)), r.uniform(0.85, 1.15), r.uniform(0, 2 * np.pi),
                  r.uniform(0.3, 1.0), r.normal(0, 0.08, (2, 3)), r.normal(0, 0.08),
                  r.normal(0, 2.5, 2), r.uniform(3, 6), r.uniform(0.5, 1.0),
                  r.random() < 0.5, r.uniform(0, 32, 2), r.uniform(0, 1, 3), r.uniform(3, 6),
                  r.uniform(0.03, 0.1), r.standard_normal(SHAPE)) for r in rngs]
        (tilt, stretch, phase, contrast, colour_shift, brightness, blob_shift, blob_r, blob_alpha,
         has_distractor, distractor_at, distractor_colour, distractor_r, noise, pixels) = (
            np.array(column) for column in zip(*draws))
        yy, xx = np.mgrid[0:32, 0:32].astype(np.float64)
        angle = (tp["angle"] + tilt)[:, None, None]
        wave = np.cos(2 * np.pi * (tp["freq"] * stretch)[:, None, None]
                      * (xx * np.cos(angle) + yy * np.sin(angle)) + phase[:, None, None])
        mix = (0.5 + 0.5 * contrast[:, None, None] * wave)[:, None]  # [n, 1, H, W]: 1 = first colour
        colours = np.clip(tp["colours"] + colour_shift, 0, 1)[..., None, None]  # [n, 2, 3, 1, 1]
        image = colours[:, 0] * mix + colours[:, 1] * (1 - mix)
        image = _blend(image, tp["blob_at"] + blob_shift, blob_r, tp["blob_colour"], blob_alpha, xx, yy)
        image = _blend(image, distractor_at, distractor_r, distractor_colour, 0.8 * has_distractor, xx, yy)
        image += brightness[:, None, None, None] + noise[:, None, None, None] * pixels
        return np.clip(image, 0, 1).astype(np.float32), cls.astype(np.int64)


def _blend(image, at, radius, colour, alpha, xx, yy):
    """image [n, 3, H, W] with a soft disc of `colour` [n, 3] at `at` [n, 2] (x, y) laid over it."""
    d2 = (xx - at[:, 0, None, None]) ** 2 + (yy - at[:, 1, None, None]) ** 2
    cover = (alpha[:, None, None] / (1 + np.exp(np.sqrt(d2) - radius[:, None, None])))[:, None]
    return image * (1 - cover) + colour[:, :, None, None] * cover
