"""PNG pictures of a run: curves.png (loss and accuracy), firing_rates.png (per layer, per
epoch) and raster.png (one test sample's input and the spikes of every spiking layer).

Spikes are time-major here as everywhere in spikefuse: [T, B, C] (time steps, samples,
neurons), or [T, B, ...] whose trailing axes are flattened into neurons. A raster draws a
dot per spike, time step on x and neuron index on y, one colour per sample (or per class
when labels are given); the samples of one time step sit side by side within its width.

    from spikefuse.train.plots import plot_spikes
    plot_spikes(spikes, "raster.png", labels=y)   # or no path: returns the Figure (notebooks)

The figures are plain matplotlib Figures (no pyplot, no display, no backend switch).
plot_run writes a run directory's three pictures, each atomically (a temp file renamed into
place); Trainer.fit and `spikefuse train` both call it. Without matplotlib it writes
nothing and says so in one line on stderr.
"""
from __future__ import annotations

import math
import os
import sys
import secrets
from pathlib import Path

import torch

from . import metrics
from .spikes import SpikeMonitor

LAYOUT = ("time-major [T, B, C] (time steps, samples, neurons), or [T, B, ...] whose trailing "
          "axes are flattened into neurons")
DPI = 110


def _figure(**kwargs):
    from matplotlib.figure import Figure
    return Figure(layout="constrained", **kwargs)


def _save(fig, path) -> Path:
    """fig as an image at `path` (format from the suffix, PNG by default), atomically."""
    path = Path(path)
    # not mkstemp: its files are 0600; a picture gets the mode any new file gets (the umask's)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=path.suffix.lstrip(".").lower() or "png", dpi=DPI)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _finish(fig, path):
    if path is not None:
        _save(fig, path)
    return fig


# ---- spikes ----

def _check_spikes(spikes, name: str) -> torch.Tensor:
    """`spikes` as a tensor of rank >= 3 with no empty axis; ValueError naming `name` otherwise."""
    if not isinstance(spikes, torch.Tensor):
        try:
            spikes = torch.as_tensor(spikes)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"{name}: expected a tensor or array, {LAYOUT}; got {type(spikes).__name__} "
                             f"({e})") from None
    shape = tuple(spikes.shape)
    if spikes.dim() < 3:
        hint = f"; for one sample [T, C] pass {name}[:, None]" if spikes.dim() == 2 else ""
        raise ValueError(f"{name}: expected {LAYOUT}; got shape {shape}{hint}")
    if 0 in shape:
        raise ValueError(f"{name}: expected {LAYOUT} with at least one time step, sample and neuron; "
                         f"got shape {shape}")
    if spikes.is_complex():
        raise ValueError(f"{name}: expected real-valued spikes, got {spikes.dtype}")
    return spikes


def as_raster(spikes, name: str = "spikes") -> torch.Tensor:
    """`spikes` [T, B, C] or [T, B, ...] as a float CPU tensor [T, B, neurons]."""
    spikes = _check_spikes(spikes, name)
    T, B = spikes.shape[:2]
    return spikes.detach().reshape(T, B, math.prod(spikes.shape[2:])).float().cpu()


def _labels(labels, samples: int, name: str) -> list[int] | None:
    if labels is None:
        return None
    if isinstance(labels, (int, bool)) or (isinstance(labels, torch.Tensor) and labels.dim() == 0):
        labels = [labels]
    try:
        values = torch.as_tensor(labels).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        values = None
    if values is None or values.is_complex() or values.is_floating_point() and \
            not bool((values == values.round()).all()):
        raise ValueError(f"{name}: expected integer class labels, one per sample; got {labels!r}")
    if len(values) != samples:
        raise ValueError(f"{name}: expected one label per sample ({samples}, axis B of [T, B, ...]); "
                         f"got {len(values)}")
    return [int(v) for v in values.tolist()]


def _colours(keys: list[int]) -> list:
    """A colour per key: tab10/tab20 by the key itself while keys are small (class k keeps
    its colour from one picture to the next), else spread over turbo."""
    import matplotlib
    top = max(keys)
    if min(keys) >= 0 and top < 20:
        cmap = matplotlib.colormaps["tab10" if top < 10 else "tab20"]
        return [cmap(k) for k in keys]
    cmap = matplotlib.colormaps["turbo"]
    return [cmap(0.05 + 0.9 * i / max(len(keys) - 1, 1)) for i in range(len(keys))]


def _dot_diameter(ax, columns: int, rows: int) -> float:
    """Dot diameter (points) that fills about one cell of the time x neuron grid, 1.5 to 6 pt."""
    box = ax.get_position()
    width = box.width * ax.figure.get_figwidth() * 72
    height = box.height * ax.figure.get_figheight() * 72
    return min(max(0.9 * min(width / columns, height / rows), 1.5), 6.0)


def _draw_raster(ax, s: torch.Tensor, labels: list[int] | None, title: str) -> None:
    """Dots for the nonzero entries of s [T, B, N] on `ax`: one scatter (one colour, one
    legend entry) per sample, or per class with labels."""
    T, B, N = s.shape
    t, b, n = (s != 0).nonzero(as_tuple=True)
    offset = torch.linspace(-0.3, 0.3, B) if B > 1 else torch.zeros(1)  # samples side by side
    if labels is None:
        keys = list(range(B))
        groups = [(f"sample {i}", b == i) for i in keys]
    else:
        keys = sorted(set(labels))
        of = torch.tensor(labels)[b] if len(b) else torch.zeros(0, dtype=torch.long)
        groups = [(f"class {k}", of == k) for k in keys]
    size = _dot_diameter(ax, T * B, N)
    for (text, mask), colour in zip(groups, _colours(keys)):
        ax.scatter((t[mask] + offset[b[mask]]).numpy(), n[mask].numpy(), s=size ** 2, color=colour,
                   marker="o", linewidths=0, label=text)
    ax.set(xlim=(-0.5, T - 0.5), ylim=(-0.5, N - 0.5), xlabel="time step", ylabel="neuron")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{title}: {N} neurons, rate {s.mean():.3f}", fontsize=9, loc="left")
    if 1 < len(groups) <= 20:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.2,
                  markerscale=max(1.0, 5.0 / size), handletextpad=0.2, frameon=False)


def plot_spikes(spikes, path=None, *, labels=None, title: str = "spikes", ax=None):
    """Spike raster of `spikes`, time-major [T, B, C] (or [T, B, ...], flattened to neurons):
    a dot per nonzero entry, time step on x, neuron on y, one colour per sample, or per
    class when `labels` (B ints) are given. Draws on `ax` if given, else on a new figure;
    with `path` the figure is also written there (atomically). Returns the Figure."""
    s = as_raster(spikes, "spikes")
    labels = _labels(labels, s.shape[1], "labels")
    if ax is None:
        fig = _figure(figsize=(8, 3))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    _draw_raster(ax, s, labels, title)
    return _finish(fig, path)


# ---- a run's pictures ----

def plot_curves(history: list[dict], path=None):
    """Loss and accuracy per epoch, train and test (train alone when no test split ran)."""
    if not history:
        raise ValueError("history: no epochs to plot (an empty list)")
    fig = _figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    epochs = [r["epoch"] for r in history]
    nan = float("nan")
    splits = [split for split in ("train", "test") if any(f"{split}_acc" in r for r in history)]
    for split, style in (("train", "-o"), ("test", "-s")):
        if split in splits:
            ax_loss.plot(epochs, [r.get(f"{split}_loss", nan) for r in history], style, ms=3, label=split)
            ax_acc.plot(epochs, [100 * r.get(f"{split}_acc", nan) for r in history], style, ms=3, label=split)
    ax_loss.set(title="loss", xlabel="epoch", ylabel="cross-entropy")
    last = splits[-1] if splits else "test"
    final = 100 * history[-1].get(f"{last}_acc", nan)
    ax_acc.set(title=f"accuracy (final {last} {final:.1f}%)", xlabel="epoch", ylabel="accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if splits:
            ax.legend()
        ax.xaxis.get_major_locator().set_params(integer=True)
    return _finish(fig, path)


def plot_rates(history: list[dict], path=None):
    """Firing rate per spiking layer and epoch on the test set (the training set's overall
    rate when no test split ran)."""
    if not history:
        raise ValueError("history: no epochs to plot (an empty list)")
    fig = _figure(figsize=(6, 4))
    ax = fig.add_subplot()
    epochs = [r["epoch"] for r in history]
    nan = float("nan")
    for i, layer in enumerate(history[-1].get("firing_rates") or {}):
        ax.plot(epochs, [(r.get("firing_rates") or {}).get(layer, nan) for r in history], "-o", ms=3,
                label=f"spiking layer {i + 1} ({layer})")
    split = "test" if any("test_rate" in r for r in history) else "train"
    ax.plot(epochs, [r.get(f"{split}_rate", nan) for r in history], "k--", lw=1, label="all spiking layers")
    ax.set(title=f"firing rate on the {'test' if split == 'test' else 'training'} set", xlabel="epoch",
           ylabel="spikes / neuron / step", ylim=(0, None))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path)


def _listed(values: list[int]) -> str:
    return " ".join(map(str, values)) if len(values) <= 8 else " ".join(map(str, values[:8])) + " ..."


@torch.no_grad()
def plot_raster(model, x, label=None, path=None):
    """x: input spikes [T, B, ...] (one sample: [T, 1, ...]); label: its class (an int), B
    labels, or None. One panel for the input and one per spiking layer, dots coloured per
    sample (per class with labels). Returns the Figure; with `path` also writes it there."""
    x = _check_spikes(x, "x")
    T, B = x.shape[:2]
    labels = _labels(label, B, "label")
    training = model.training
    model.eval()
    try:
        with SpikeMonitor(model, keep=True) as monitor:
            pred = metrics.predicted(model(x)).tolist()
    finally:
        model.train(training)
    panels = {"input": as_raster(x, "x")}
    panels.update({f"spiking layer {i + 1} ({name})": as_raster(s, f"spikes of layer {name!r}")
                   for i, (name, s) in enumerate(monitor.trains.items())})
    fig = _figure(figsize=(8, 2.2 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (title, s) in zip(axes, panels.items()):
        _draw_raster(ax, s, labels, title)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    what = "one sample" if B == 1 else f"{B} samples"
    if labels is None:
        told = f"predicted {_listed(pred)}"
    elif B == 1:
        told = f"label {labels[0]}, predicted {pred[0]}"
    else:
        right = sum(p == y for p, y in zip(pred, labels))
        told = f"labels {_listed(labels)}, predicted {_listed(pred)}: {right}/{B} right"
    fig.suptitle(f"spike raster of {what} ({told})")
    return _finish(fig, path)


def plot_run(run_dir, history: list[dict], model, test_data, device) -> list[Path]:
    """Write curves.png, firing_rates.png and raster.png (the first sample of `test_data`,
    any split with `batches()`) into run_dir, each atomically; returns their paths. Without
    matplotlib: none, a one-line note on stderr, []. Trainer.fit (given a run_dir) and
    `spikefuse train` write a run's pictures through here."""
    run_dir = Path(run_dir)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"spikefuse: no plots in {run_dir}: matplotlib is not installed (pip install 'spikefuse[plot]')",
              file=sys.stderr)
        return []
    run_dir.mkdir(parents=True, exist_ok=True)
    # a DataLoader's split yields its own batch size: keep the first sample
    x, y = next(iter(test_data.batches(1, shuffle=False)))
    if getattr(test_data, "time_major", True):
        x = x[:, :1]
    else:  # a static input [B, ...] (images) that the model repeats at each step: shown so
        x = x[:1].expand(test_data.time_steps, *x[:1].shape).contiguous()
    paths = [run_dir / "curves.png", run_dir / "firing_rates.png", run_dir / "raster.png"]
    plot_curves(history, paths[0])
    plot_rates(history, paths[1])
    plot_raster(model, x.to(device), int(y[0]), paths[2])
    return paths
