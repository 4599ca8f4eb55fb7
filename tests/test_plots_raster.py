"""Spike rasters as dots: time-major [T, B, C] (and [T, B, ...]) input, a colour per sample or
per class, shape errors that name the argument, and fit() writing a run's pictures."""
from __future__ import annotations

import os
import sys

import matplotlib.image
import pytest
import torch
from matplotlib.collections import PathCollection
from matplotlib.patches import Rectangle

from spikefuse.models import build_model
from spikefuse.train.loop import Trainer, fit
from spikefuse.train.plots import plot_raster, plot_run, plot_spikes
from test_train_data import make_splits

PNG = b"\x89PNG\r\n\x1a\n"


def spikes(T=6, B=3, C=10, seed=0):
    return (torch.rand(T, B, C, generator=torch.Generator().manual_seed(seed)) < 0.3).float()


def dots(ax):
    return [c for c in ax.collections if isinstance(c, PathCollection)]


def no_bars(ax):
    """No bar or image artists: the spikes are dots, not bars."""
    patches = [p for p in ax.patches if isinstance(p, Rectangle)]
    return not patches and not ax.images and not [c for c in ax.collections if not isinstance(c, PathCollection)]


def test_time_major_spikes_are_dots_one_colour_per_sample(tmp_path):
    s = spikes()
    fig = plot_spikes(s, tmp_path / "r.png")
    ax = fig.axes[0]
    groups = dots(ax)
    assert len(groups) == 3 and no_bars(ax)
    assert sum(len(g.get_offsets()) for g in groups) == int(s.sum())  # a dot per spike
    colours = {tuple(g.get_facecolor()[0]) for g in groups}
    assert len(colours) == 3  # one colour per sample
    for b, g in enumerate(groups):  # sample b's dots: its spikes, time on x (dodged within the step), neuron on y
        xy = g.get_offsets()
        t, n = s[:, b].nonzero(as_tuple=True)
        assert sorted(zip(xy[:, 0].round().astype(int).tolist(), xy[:, 1].astype(int).tolist())) == \
            sorted(zip(t.tolist(), n.tolist()))
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("time step", "neuron")
    assert (tmp_path / "r.png").read_bytes()[:8] == PNG
    assert [p for p in os.listdir(tmp_path)] == ["r.png"]  # written atomically: no temp file left


def test_colours_per_class_when_labels_are_given():
    fig = plot_spikes(spikes(B=4), labels=torch.tensor([2, 0, 2, 1]))
    groups = dots(fig.axes[0])
    assert [g.get_label() for g in groups] == ["class 0", "class 1", "class 2"]
    assert len({tuple(g.get_facecolor()[0]) for g in groups}) == 3
    # class 2 holds samples 0 and 2: the same colour, twice the dots of either
    s = spikes(B=4)
    assert len(groups[2].get_offsets()) == int(s[:, [0, 2]].sum())
    # a class keeps its colour from one picture to the next
    other = dots(plot_spikes(spikes(B=1), labels=[2]).axes[0])
    assert tuple(other[0].get_facecolor()[0]) == tuple(groups[2].get_facecolor()[0])


def test_higher_ranks_are_flattened_to_neurons_and_arrays_are_taken():
    s = spikes(T=4, B=2, C=2 * 3 * 5).reshape(4, 2, 2, 3, 5)
    ax = plot_spikes(s).axes[0]
    assert ax.get_ylim() == (-0.5, 29.5)  # 30 neurons
    assert sum(len(g.get_offsets()) for g in dots(ax)) == int(s.sum())
    assert len(dots(plot_spikes(s.numpy().astype(bool)).axes[0])) == 2


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(8, 16), ["spikes:", "[T, B, C]", "(8, 16)", "spikes[:, None]"]),
    (torch.zeros(8), ["spikes:", "[T, B, C]", "(8,)"]),
    (torch.zeros(0, 2, 3), ["spikes:", "[T, B, C]", "(0, 2, 3)"]),
    (torch.zeros(4, 2, 0), ["spikes:", "[T, B, C]", "(4, 2, 0)"]),
    ("spikes", ["spikes:", "[T, B, C]"]),
])
def test_bad_shapes_name_the_argument_and_the_layout(bad, words):
    with pytest.raises(ValueError) as e:
        plot_spikes(bad)
    for w in words:
        assert w in str(e.value)


def test_bad_labels_and_raster_input_are_clear_errors():
    with pytest.raises(ValueError, match=r"labels: expected one label per sample \(3"):
        plot_spikes(spikes(B=3), labels=[0, 1])
    with pytest.raises(ValueError, match="labels: expected integer class labels"):
        plot_spikes(spikes(B=2), labels=[0.5, 1])
    model = build_model("mlp", (10,), 3, 6, hidden=(8,))
    with pytest.raises(ValueError, match=r"x: expected time-major \[T, B, C\].*got shape \(6, 10\)"):
        plot_raster(model, torch.zeros(6, 10), 0)


def test_raster_of_a_model_takes_a_batch_dots_per_sample_and_keeps_one_sample():
    splits = make_splits()
    torch.manual_seed(0)
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(16, 16))
    model.train()
    x, y = next(iter(splits.test.batches(4, shuffle=False)))
    fig = plot_raster(model, x, y)
    assert model.training  # its mode is restored
    assert len(fig.axes) == 3  # input + two spiking layers
    for ax in fig.axes:
        assert dots(ax) and no_bars(ax)
        assert {g.get_label() for g in dots(ax)} == {f"class {k}" for k in set(y.tolist())}
    assert fig.axes[-1].get_xlabel() == "time step" and fig.axes[0].get_ylabel() == "neuron"
    one = plot_raster(model, x[:, :1], int(y[0]))  # what it took before: [T, 1, ...] and an int
    assert "label" in one._suptitle.get_text() and all(len(dots(ax)) == 1 for ax in one.axes)


def test_fit_with_a_run_dir_writes_the_pictures(tmp_path):
    splits = make_splits(n_train=64, n_test=32)
    torch.manual_seed(0)
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(16,))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    fit(model, splits, opt, epochs=1, batch_size=32, run_dir=tmp_path / "run", progress=False)
    for name in ("curves.png", "firing_rates.png", "raster.png"):
        path = tmp_path / "run" / name
        assert path.read_bytes()[:8] == PNG, name
        h, w, _ = matplotlib.image.imread(path).shape
        assert h > 200 and w > 200
    assert not [p for p in os.listdir(tmp_path / "run") if p.endswith(".tmp")]
    # no run directory: no pictures anywhere
    Trainer(model, splits, opt, epochs=1, batch_size=32, progress=False).fit()
    assert os.listdir(tmp_path) == ["run"]


def test_without_matplotlib_the_pictures_are_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    splits = make_splits(n_train=32, n_test=16)
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(8,))
    history = [{"epoch": 1, "train_loss": 1.0, "test_loss": 1.0, "train_acc": 0.5, "test_acc": 0.5,
                "test_rate": 0.1, "firing_rates": {}}]
    assert plot_run(tmp_path, history, model, splits.test, "cpu") == []
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "matplotlib is not installed" in err
    assert not list(tmp_path.iterdir())
