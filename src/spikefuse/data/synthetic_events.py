"""Event streams shaped like N-MNIST and DVS128 Gesture, for training without the download.

A DVS pixel fires when the light on it changes, so a bright shape moving over a dark
scene fires along its outline: ON (p = 1) on the side it moves towards, OFF (p = 0) on
the side it leaves, at a rate proportional to the speed across the edge |v . n| (an edge
sliding along itself fires nothing). Both sets draw their events that way, plus 5%
uniform background noise, with microsecond timestamps sorted in time (t, x, y, p):

- `SyntheticNMNIST`: 34x34x2, 10 classes, 2000 train / 500 test. A digit's strokes (a
  hand-drawn skeleton of 0-9), randomly rotated, sheared, scaled and shifted, seen
  through N-MNIST's three saccades (a triangle of ~100 ms moves): ~3000 events, ~0.3 s.
- `SyntheticDVSGesture`: 128x128x2, 11 classes, 600 train / 200 test. One or two
  "hands" (discs) moving along a class's trajectory (claps, waves, circles either way
  round on either side, arm roll, drums, guitar, and "other": a random path), with a
  per-sample place, size, speed and phase: ~6000 events over 1-1.5 s.

Sample i depends only on (seed, split, i): any sample can be made alone, and the classes
are balanced in every run of 10 (11) consecutive samples.
"""
from __future__ import annotations

import numpy as np

from .events import event_dtype
from .synthetic import balanced_targets, check_mean_events, split_size

NOISE = 0.05  # share of background events: uniform in space and time, random polarity
JITTER = 0.35  # px: spread of an event around its edge point


def _arc(cx, cy, rx, ry, start, stop):
    """Points of an elliptic arc (angles in degrees; y grows downwards, so rising angles turn clockwise)."""
    a = np.radians(np.linspace(start, stop, max(8, int(abs(stop - start) / 6))))
    return np.stack([cx + rx * np.cos(a), cy + ry * np.sin(a)], axis=1)


def _line(*points):
    return np.array(points, dtype=float)


# digit skeletons in a unit box (x right, y down): a list of strokes, each a polyline
DIGITS = [
    [_arc(.5, .5, .28, .42, 0, 360)],
    [_line((.3, .22), (.55, .05), (.55, .95))],
    [np.vstack([_arc(.5, .3, .28, .24, 190, 380), _line((.2, .95), (.82, .95))])],
    [_arc(.48, .28, .26, .22, 200, 450), _arc(.48, .72, .3, .23, 270, 520)],
    [_line((.65, .95), (.65, .05), (.15, .68), (.85, .68))],
    [np.vstack([_line((.8, .05), (.28, .05), (.24, .45)), _arc(.48, .68, .3, .27, 225, 510)])],
    [np.vstack([_line((.68, .05), (.35, .35)), _arc(.5, .7, .28, .25, 180, 540)])],
    [_line((.18, .05), (.82, .05), (.4, .95))],
    [_arc(.5, .27, .22, .22, 0, 360), _arc(.5, .72, .28, .23, 0, 360)],
    [_arc(.48, .3, .27, .25, 0, 360), _line((.75, .3), (.6, .95))],
]


def _outline(strokes, spacing: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Points every `spacing` along the strokes and their unit normals, each [K, 2]."""
    points, normals = [], []
    for stroke in strokes:
        arc = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(stroke, axis=0), axis=1))])
        s = np.linspace(0, arc[-1], max(2, int(arc[-1] / spacing)))
        p = np.stack([np.interp(s, arc, stroke[:, 0]), np.interp(s, arc, stroke[:, 1])], axis=1)
        tangent = np.gradient(p, axis=0)
        tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
        points.append(p)
        normals.append(np.stack([-tangent[:, 1], tangent[:, 0]], axis=1))
    return np.concatenate(points), np.concatenate(normals)


def _render(rng, xy, normal, ahead, t, duration: float, sensor_size) -> np.ndarray:
    """Events at edge points of a moving bright shape, plus background noise: an (x, y, t, p)
    structured array sorted by t, the events outside the sensor dropped.

    xy, normal [n, 2]: where on the edge (px) and its unit normal; ahead [n]: whether the
    normal points the way the edge moves; t [n]: when (seconds, within `duration`). Each
    event lands on one side of the edge: ON if that side is the one the shape moves into."""
    width, height, _ = sensor_size
    n = len(t)
    side = rng.random(n) < 0.5
    xy = xy + (np.where(side, 0.5, -0.5)[:, None] * normal) + rng.normal(0, JITTER, (n, 2))
    noise = rng.poisson(n * NOISE / (1 - NOISE))
    xy = np.floor(np.concatenate([xy, rng.uniform(0, (width, height), (noise, 2))]))
    t = np.concatenate([t, rng.uniform(0, duration, noise)])
    p = np.concatenate([side == ahead, rng.random(noise) < 0.5])
    inside = (xy[:, 0] >= 0) & (xy[:, 0] < width) & (xy[:, 1] >= 0) & (xy[:, 1] < height)
    t = (t * 1e6).astype(np.int64)
    order = np.flatnonzero(inside)[np.argsort(t[inside], kind="stable")]
    events = np.empty(len(order), dtype=event_dtype(has_y=True, sensor_size=sensor_size))
    events["t"] = t[order]
    events["x"] = xy[order, 0]
    events["y"] = xy[order, 1]
    events["p"] = p[order]
    return events


def _pick(rng, weights: np.ndarray, n: int) -> np.ndarray:
    """n flat indices into `weights` (any shape, >= 0), each drawn with probability
    proportional to its weight; in rising order (a multinomial count per index: several
    times faster than a search per draw, and the events are sorted by time later anyway)."""
    p = weights.ravel() / weights.sum()
    return np.repeat(np.arange(p.size), rng.multinomial(n, p))


class _Generator:
    """Indexable like a Tonic data set: `ds[i] -> (events, target)`; sample i from (seed, split, i) alone."""

    sensor_size: tuple[int, int, int]
    classes: list[str]
    split_sizes: dict[str, int]
    salt: int  # keeps one set's random streams apart from another's

    def __init__(self, split: str = "train", *, samples: int | None = None, seed: int = 0,
                 mean_events: int | None = None):
        n = split_size(split, self.split_sizes, samples, seed)
        mean_events = check_mean_events(self.mean_events if mean_events is None else mean_events)
        self.split, self.seed, self.mean_events = split, seed, mean_events
        self._key = (seed % 2**64, self.salt, list(self.split_sizes).index(split))  # numpy seeds are >= 0
        self.targets = balanced_targets(self._key, len(self.classes), n)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        target = int(self.targets[i])
        rng = np.random.default_rng([*self._key, 2, i])
        return self._events(rng, target), target

    def _events(self, rng, target: int) -> np.ndarray:
        raise NotImplementedError


class SyntheticNMNIST(_Generator):
    """N-MNIST-shaped events: a digit's strokes under three saccades (see the module docstring)."""

    sensor_size = (34, 34, 2)
    classes = [str(d) for d in range(10)]
    split_sizes = {"train": 2000, "test": 500}
    salt = 3401
    mean_events = 3000
    version = 1  # part of the cache key: bump it when the events change
    box = 20.0  # px: the unit box of DIGITS on the sensor, before the per-sample scale
    # px: the triangle (3 px a side) the three saccades trace, from its first corner back to it
    corners = 3.0 * np.array([[-0.5, 0.29], [0.5, 0.29], [0.0, -0.58], [-0.5, 0.29]])
    outlines = [_outline(strokes) for strokes in DIGITS]

    def _events(self, rng, target):
        points, normals = self.outlines[target]
        angle, shear = rng.normal(0, np.radians(10)), rng.normal(0, 0.15)
        scale = self.box * rng.uniform(0.85, 1.1)
        rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        a = scale * rot @ np.array([[1.0, shear], [0.0, 1.0]])
        centre = np.array(self.sensor_size[:2]) / 2 + rng.normal(0, 1.5, 2)
        points = (points - 0.5) @ a.T + centre
        normals = normals @ np.linalg.inv(a)  # normals map by the inverse transpose
        normals /= np.linalg.norm(normals, axis=1, keepdims=True)
        duration = 0.3 * rng.uniform(0.9, 1.1)
        n = rng.poisson(self.mean_events * (1 - NOISE))
        # an edge fires in proportion to the speed across it, |v . n|: during move j (direction
        # d_j) point k fires in proportion to |d_j . n_k|, and in time as the move's speed,
        # which eases in and out as sin(pi u) over the move's part u of its time
        steps = np.diff(self.corners, axis=0)
        across = steps @ normals.T / np.linalg.norm(steps, axis=1, keepdims=True)  # [3, K]
        j, k = np.divmod(_pick(rng, np.abs(across), n), len(points))
        done = rng.random(n)  # the share of the move behind: the inverse of its (1 - cos(pi u)) / 2
        t = (j + np.arccos(1 - 2 * done) / np.pi) * duration / 3
        xy = points[k] + self.corners[j] + done[:, None] * steps[j]
        return _render(rng, xy, normals[k], across[j, k] > 0, t, duration, self.sensor_size)


def _gap(u):
    return 0.08 + 0.15 * (1 + np.cos(u))


# class -> its hands' positions [(x, y), ...] at phase u (radians), in half-widths from the
# sensor's centre (x right, y down); o [2, 3]: the random path's coefficients ("other gestures")
GESTURES = {
    "hand clap": lambda u, o: [(-_gap(u), .15 + 0 * u), (_gap(u), .15 + 0 * u)],
    "right hand wave": lambda u, o: [(.45 + .2 * np.sin(u), -.3 + .06 * np.cos(2 * u))],
    "left hand wave": lambda u, o: [(-.45 - .2 * np.sin(u), -.3 + .06 * np.cos(2 * u))],
    "right arm clockwise": lambda u, o: [(.4 + .3 * np.cos(u), .3 * np.sin(u))],
    "right arm counter clockwise": lambda u, o: [(.4 + .3 * np.cos(u), -.3 * np.sin(u))],
    "left arm clockwise": lambda u, o: [(-.4 + .3 * np.cos(u), .3 * np.sin(u))],
    "left arm counter clockwise": lambda u, o: [(-.4 + .3 * np.cos(u), -.3 * np.sin(u))],
    "arm roll": lambda u, o: [(.15 * np.cos(u), .1 + .15 * np.sin(u)), (-.15 * np.cos(u), .1 - .15 * np.sin(u))],
    "air drums": lambda u, o: [(-.3 + 0 * u, .25 + .15 * np.sin(u)), (.3 + 0 * u, .25 - .15 * np.sin(u))],
    "air guitar": lambda u, o: [(.2 + 0 * u, .3 + .2 * np.sin(2 * u)), (-.45 + .05 * np.sin(u), -.05 - .05 * np.sin(u))],
    "other gestures": lambda u, o: [(o[0] @ [np.sin(u), np.cos(u), np.sin(2 * u)],
                                     o[1] @ [np.sin(u), np.cos(u), np.sin(3 * u)])],
}


def _hands(target: int, u: np.ndarray, other: np.ndarray) -> np.ndarray:
    """The hands' positions [len(u), hands, 2] of class `target` at phases u."""
    return np.stack([np.stack(xy, axis=-1) for xy in list(GESTURES.values())[target](u, other)], axis=1)


class SyntheticDVSGesture(_Generator):
    """DVS128-Gesture-shaped events: hands moving along a class's trajectory (see the module docstring)."""

    sensor_size = (128, 128, 2)
    classes = list(GESTURES)
    split_sizes = {"train": 600, "test": 200}
    salt = 12802
    mean_events = 6000
    version = 1  # part of the cache key: bump it when the events change
    grid = 1000  # the hands' paths are evaluated at this many instants per sample (~1 ms apart)

    def _events(self, rng, target):
        half = self.sensor_size[0] / 2
        scale = half * rng.uniform(0.85, 1.15)
        centre = half + rng.normal(0, 5, 2)
        radius = rng.uniform(7, 10)
        duration = rng.uniform(1.0, 1.5)
        phase, cycles = rng.uniform(0, 2 * np.pi), rng.uniform(1.5, 2.5)
        other = rng.uniform(-0.3, 0.3, (2, 3))
        u = phase + 2 * np.pi * cycles * (np.arange(self.grid) + 0.5) / self.grid
        du = 1e-3
        hands = centre + scale * _hands(target, u, other)  # [grid, hands, 2] px
        vel = (_hands(target, u + du, other) - _hands(target, u - du, other)) * (
            scale * 2 * np.pi * cycles / duration / (2 * du))  # px/s
        speed = np.linalg.norm(vel, axis=2)
        n = rng.poisson(self.mean_events * (1 - NOISE))
        # a disc's outline fires in proportion to |v . n|: in all, to the speed (instant g, hand h);
        # around it as |cos psi|, psi the normal's angle from the motion: arcsin(2r - 1) draws the
        # leading half's psi, and half of the events move to the trailing half (psi + pi)
        g, h = np.divmod(_pick(rng, speed, n), hands.shape[1])
        ahead = rng.random(n) < 0.5
        theta = (np.arctan2(vel[g, h, 1], vel[g, h, 0]) + np.arcsin(2 * rng.random(n) - 1)
                 + np.where(ahead, 0, np.pi))
        normal = np.stack([np.cos(theta), np.sin(theta)], axis=1)
        t = (g + rng.random(n)) * duration / self.grid
        return _render(rng, hands[g, h] + radius * normal, normal, ahead, t, duration, self.sensor_size)
