"""PNG pictures of a run (matplotlib, Agg backend: no display needed):
curves.png (loss and accuracy), firing_rates.png (per layer, per epoch) and
raster.png (one test sample's input and the spikes of every spiking layer)."""
from __future__ import annotations

from pathlib import Path

import torch

from .spikes import SpikeMonitor


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(history: list[dict], path) -> None:
    plt = _pyplot()
    epochs = [r["epoch"] for r in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for split, style in (("train", "-o"), ("test", "-s")):
        ax_loss.plot(epochs, [r[f"{split}_loss"] for r in history], style, ms=3, label=split)
        ax_acc.plot(epochs, [100 * r[f"{split}_acc"] for r in history], style, ms=3, label=split)
    ax_loss.set(title="loss", xlabel="epoch", ylabel="cross-entropy")
    final = history[-1]["test_acc"] * 100
    ax_acc.set(title=f"accuracy (final test {final:.1f}%)", xlabel="epoch", ylabel="accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rates(history: list[dict], path) -> None:
    plt = _pyplot()
    epochs = [r["epoch"] for r in history]
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for i, layer in enumerate(history[-1]["firing_rates"]):
        ax.plot(epochs, [r["firing_rates"].get(layer, float("nan")) for r in history], "-o", ms=3,
                label=f"spiking layer {i + 1} ({layer})")
    ax.plot(epochs, [r["test_rate"] for r in history], "k--", lw=1, label="all spiking layers")
    ax.set(title="firing rate on the test set", xlabel="epoch", ylabel="spikes / neuron / step", ylim=(0, None))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def plot_raster(model, x: torch.Tensor, label: int, path) -> None:
    """x: one sample [T, 1, ...]; one panel for the input and one per spiking layer."""
    plt = _pyplot()
    model.eval()
    with SpikeMonitor(model, keep=True) as monitor:
        pred = int(model(x).argmax(1)[0])
    panels = {"input": x.detach().float().cpu()}
    panels.update({f"spiking layer {i + 1} ({name})": s.float() for i, (name, s) in enumerate(monitor.trains.items())})
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)), sharex=True,
                             constrained_layout=True, squeeze=False)
    for ax, (title, s) in zip(axes[:, 0], panels.items()):
        s = s[:, 0].reshape(s.shape[0], -1)  # [T, neurons]
        # an image, not a scatter: every spike stays visible however few steps there are
        ax.imshow((s > 0).T.numpy(), aspect="auto", interpolation="nearest", cmap="Greys", origin="lower",
                  vmin=0, vmax=1, extent=(-0.5, s.shape[0] - 0.5, -0.5, s.shape[1] - 0.5))
        ax.set_ylabel("neuron")
        ax.set_title(f"{title}: {s.shape[1]} neurons, rate {s.mean():.3f}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time step")
    axes[-1, 0].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(f"spike raster of one test sample (label {label}, predicted {pred})")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_run(run_dir, history: list[dict], model, test_data, device) -> list[Path]:
    """Write all three pictures into run_dir; returns their paths."""
    run_dir = Path(run_dir)
    x, y = next(iter(test_data.batches(1, shuffle=False)))
    paths = [run_dir / "curves.png", run_dir / "firing_rates.png", run_dir / "raster.png"]
    plot_curves(history, paths[0])
    plot_rates(history, paths[1])
    plot_raster(model, x.to(device), int(y[0]), paths[2])
    return paths
