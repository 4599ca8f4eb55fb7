"""The pictures of a run: curves, firing rates and a raster with a panel per spiking layer."""
from __future__ import annotations

import matplotlib.image
import torch

from spikefuse.models import build_model
from spikefuse.train.plots import plot_run
from test_train_data import make_splits


def history(epochs=3):
    return [{"epoch": e, "train_loss": 1 / e, "test_loss": 1.2 / e, "train_acc": 1 - 0.3 / e,
             "test_acc": 1 - 0.35 / e, "test_rate": 0.1 * e, "firing_rates": {"layers.2": 0.1, "layers.4": 0.05 * e}}
            for e in range(1, epochs + 1)]


def test_plots_are_written_as_png(tmp_path):
    splits = make_splits()
    torch.manual_seed(0)
    heights = []
    for hidden in ((16,), (16, 16)):
        model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=hidden)
        run = tmp_path / str(len(hidden))
        run.mkdir()
        paths = plot_run(run, history(), model, splits.test, "cpu")
        assert [p.name for p in paths] == ["curves.png", "firing_rates.png", "raster.png"]
        for p in paths:
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            h, w, _ = matplotlib.image.imread(p).shape
            assert h > 200 and w > 200
        heights.append(matplotlib.image.imread(run / "raster.png").shape[0])
    assert heights[1] > heights[0]  # one more spiking layer, one more raster panel
