"""Data sets by name, or as data set objects: `DATASETS` and `load(name_or_dataset, ...) -> Splits`."""
from __future__ import annotations

import torch

from ..errors import require
from ..neuron_options import MAX_INT
from . import embedded, foreign, memory, synthetic, synthetic_events, synthetic_images
from .cache import cached_store, check_root
from .dataset import DenseSpikeDataset, EventSpikeDataset, Splits, StaticImageDataset
from .events import check_device, check_flag
from .framing import ToFrame
from .store import EventStore
from .tonic_sets import PRE, TONIC_SETS, open_split, pack

# generated event sets: name -> (generator class, the Tonic set whose sensor, classes, framing
# and default time steps it copies, so a model trains on it as on that set)
SYNTHETIC_EVENTS = {
    "shd-synthetic": (synthetic.SyntheticSHD, "shd"),
    "nmnist-synthetic": (synthetic_events.SyntheticNMNIST, "nmnist"),
    "dvsgesture-synthetic": (synthetic_events.SyntheticDVSGesture, "dvsgesture"),
}

DATASETS = {
    "digits": "scikit-learn's digits 8x8 (64 inputs, vendored), rate coded: Bernoulli p = pixel/16 per step; 10 classes, no download",
    "digits-latency": "scikit-learn's digits 8x8 (64 inputs, vendored), latency coded: one spike, brighter = earlier; 10 classes, no download",
    "randman": "Zenke's random manifold task: 100 units, one spike each, timing is the class; 10 classes, no download",
    "shd-synthetic": "SHD-shaped synthetic events (700 channels, 20 classes, 8156/2264 samples, ~1 s), no download",
    **{name: spec.description for name, spec in TONIC_SETS.items()},
    "cifar-synthetic": "CIFAR-shaped synthetic images (3x32x32, 10 classes, 2000/500): oriented gratings, colours "
                       "and blobs; static input, the model repeats it over T; no download",
    "nmnist-synthetic": "N-MNIST-shaped synthetic events (2x34x34, 10 classes, 2000/500): digit strokes under "
                        "three saccades, framed as nmnist; no download",
    "dvsgesture-synthetic": "DVS128-Gesture-shaped synthetic events (2x128x128, 11 classes, 600/200): hands moving "
                            "along each class's path, framed as dvsgesture; no download",
}

DEFAULT_TIME_STEPS = {"digits": 20, "digits-latency": 20, "randman": 50,
                      **{name: TONIC_SETS[like].time_steps for name, (_, like) in SYNTHETIC_EVENTS.items()},
                      **{name: spec.time_steps for name, spec in TONIC_SETS.items()},
                      "cifar-synthetic": 4}  # the ResNets' default T; the images are repeated, not encoded


def load(name, *, test=None, time_steps: int | None = None, sensor_size=None, num_classes: int | None = None,
         framing: str | None = None, root: str = "~/.cache/spikefuse", seed: int = 0, device="cpu",
         progress: bool = True) -> Splits:
    """Load a data set's train and test splits, batches coming out on `device`.

    name: a name from DATASETS; or a data set object, the train split, with the test split as
    `test=` (or both as a pair `(train, test)`): a Tonic data set, or any map-style torch
    Dataset whose items are (events, target), events a structured numpy array with fields
    t, x, [y], p (see spikefuse.data.foreign). For those:
        sensor_size: (W, H, P); default the object's `sensor_size` attribute (Tonic's).
        num_classes: default len(obj.classes) (Tonic's), else the largest target + 1.
        framing: "bins" (default: each sample's span cut into time_steps bins) or "window"
            (time_steps equal windows over the first second); a Tonic class spikefuse knows
            (SHD, SSC, NMNIST, DVSGesture) defaults to that set's framing and time steps.
        time_steps: required unless the class is one of those.
    Embedded sets are encoded once into a tensor on `device`. Event sets are packed once into
    a disk-cached store under `root`, kept on the GPU when they fit, and framed per batch.
    cifar-synthetic's images are rendered once into a tensor on `device`; its batches are
    static, x [B, 3, 32, 32] (StaticImageDataset): the model repeats them over time_steps.
    progress: a progress bar (stderr) while an event set is packed for its cache.
    """
    # root and progress are used only where an event set is packed: checked for every set
    check_root(root)
    check_flag("progress", progress)  # a string or NaN was taken as truthy
    if not isinstance(name, str):
        return _load_objects(name, test, time_steps, sensor_size, num_classes, framing, root, device, progress)
    for arg, value in (("test", test), ("sensor_size", sensor_size), ("num_classes", num_classes),
                       ("framing", framing)):
        if value is not None:
            raise ValueError(f"{arg}: only for data set objects; the named set {name!r} fixes it")
    if name not in DATASETS:
        raise ValueError(f"name: unknown data set {name!r}; valid names: {', '.join(DATASETS)}")
    if time_steps is None:
        time_steps = DEFAULT_TIME_STEPS[name]
    _check_time_steps(time_steps)
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed: expected an int from -2**63 to 2**63 - 1, got {seed!r}")
    device = check_device(device)

    if name in ("digits", "digits-latency", "randman"):
        peak, spikes = embedded.encode_bytes(name, time_steps)
        hint = "lower time_steps (--time-steps)"
        memory.require(peak, "cpu", f"encoding {name} at {time_steps} time steps", hint)
        if device.type != "cpu":
            memory.require(spikes, device, f"{name} at {time_steps} time steps", hint)
        if name == "randman":
            parts = embedded.randman(time_steps=time_steps, seed=seed)
            num_classes = 10
        else:
            coding = "rate" if name == "digits" else "latency"
            parts = embedded.digits(time_steps, coding=coding, seed=seed)
            num_classes = 10
        x_tr, y_tr, x_te, y_te = (p.to(device) for p in parts)
        train, test = DenseSpikeDataset(x_tr, y_tr), DenseSpikeDataset(x_te, y_te)
        return Splits(name, train, test, num_classes, train.input_shape, time_steps)

    if name == "cifar-synthetic":
        parts = [synthetic_images.SyntheticCIFAR(split, seed=seed).arrays() for split in ("train", "test")]
        train, test = (StaticImageDataset(torch.from_numpy(x).to(device), torch.from_numpy(y), time_steps)
                       for x, y in parts)
        return Splits(name, train, test, synthetic_images.NUM_CLASSES, synthetic_images.SHAPE, time_steps)

    if name in SYNTHETIC_EVENTS:
        generator, like = SYNTHETIC_EVENTS[name]
        spec = TONIC_SETS[like]
        sources = {split: generator(split, seed=seed) for split in ("train", "test")}
        params = {"generator": generator.version, "seed": seed, "mean_events": sources["train"].mean_events}

        def build(split):
            src = sources[split]
            return EventStore.from_samples((src[i] for i in range(len(src))), spec.sensor_size, total=len(src),
                                           desc=f"{name} {split}", progress=progress)
    else:
        spec = TONIC_SETS[name]

        def build(split):
            return pack(open_split(name, split, root), spec.sensor_size, f"{name} {split}", progress)
        params = {"tonic": require("tonic", f"the {name} data set").__version__, "pre": PRE}

    sensor, num_classes, input_shape, framing = spec.sensor_size, spec.num_classes, spec.input_shape, spec.framing
    stores = _cached_stores(root, name, {"train": params, "test": params}, build, device)
    frame = frame_for(framing, sensor, time_steps)
    train, test = (EventSpikeDataset(s, frame, time_steps, input_shape) for s in stores)
    return Splits(name, train, test, num_classes, input_shape, time_steps)


def _check_time_steps(time_steps) -> None:
    # at most the CLI's 2**31 - 1: 2**70 was taken by the event sets, failing when framed
    if not isinstance(time_steps, int) or isinstance(time_steps, bool) or not 1 <= time_steps <= MAX_INT:
        raise ValueError(f"time_steps: expected a positive int (at most 2**31 - 1), got {time_steps!r}")


def _cached_stores(root, name: str, params: dict, build, device) -> list[EventStore]:
    """Each split's store from the disk cache (built by build(split) once), on `device` when it fits."""
    out = []
    for split, p in params.items():
        store = cached_store(root, name, split, p, lambda s=split: build(s), device=device)
        out.append(store.to(device, resident=True) if fits_on(store, device) else store)
    return out


def _load_objects(data, test, time_steps, sensor_size, num_classes, framing, root, device, progress) -> Splits:
    """load() for data set objects: packed through the named Tonic sets' path, cached the same way."""
    train, test = foreign.split_pair(data, test)
    spec = next((s for s in TONIC_SETS.values() if type(train).__module__.startswith("tonic")
                 and type(train).__name__ == s.tonic_class), None)
    if time_steps is None:
        if spec is None:
            raise ValueError(f"time_steps: required for a {type(train).__name__} data set (frames per sample)")
        time_steps = spec.time_steps
    _check_time_steps(time_steps)
    framing = framing or (spec.framing if spec is not None else "bins")
    if framing not in ("bins", "window"):
        raise ValueError(f"framing: expected 'bins' or 'window', got {framing!r}")
    device = check_device(device)
    sensor = foreign.sensor_of(train, test, sensor_size)
    sets = {"train": train, "test": test}
    params = {split: foreign.cache_params(ds, split, sensor, PRE) for split, ds in sets.items()}
    name = foreign.cache_name(train)

    def build(split):
        try:
            return pack(foreign.Checked(sets[split], split), sensor, f"{type(sets[split]).__name__} {split}", progress)
        except ValueError as e:
            raise ValueError(f"{split}: {e}") from e
    stores = _cached_stores(root, name, params, build, device)  # each split keyed by its own contents
    has_y = "y" in stores[0].events.dtype.names
    if ("y" in stores[1].events.dtype.names) != has_y:
        raise ValueError("test: its events have other fields than the train set's (one has y, the other not)")
    input_shape = foreign.input_shape_for(sensor, has_y)
    classes = foreign.num_classes_of(train, stores, num_classes)
    frame = frame_for(framing, sensor, time_steps)
    train_ds, test_ds = (EventSpikeDataset(s, frame, time_steps, input_shape) for s in stores)
    return Splits(type(train).__name__, train_ds, test_ds, classes, input_shape, time_steps)


def frame_for(framing: str, sensor_size, time_steps: int) -> ToFrame:
    """"window": time_steps equal windows over the first second from t = 0 (later events are cut,
    as in the SHD recipe); "bins": each sample's own span cut into time_steps bins."""
    if framing == "window":
        window = 1_000_000 // time_steps if 1_000_000 % time_steps == 0 else 1_000_000 / time_steps
        return ToFrame(sensor_size, time_window=window, start_time=0, include_incomplete=True)
    return ToFrame(sensor_size, n_time_bins=time_steps)


def fits_on(store: EventStore, device: torch.device, share: float = 0.5) -> bool:
    """GPU residency when the events take at most `share` of the free memory; on the CPU the
    memory map already is the cheapest copy."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return store.nbytes <= share * free
