"""The Trainer, checkpoints, metrics and the spike monitor, on the small stand-in data."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from spikefuse.models import build_model
from spikefuse.nn import LIF
from spikefuse.train import checkpoint, metrics
from spikefuse.train.config import ConfigError, make, read_toml
from spikefuse.train.loop import Trainer
from spikefuse.train.spikes import SpikeMonitor
from test_train_data import make_splits
from helpers import one_thread  # noqa: F401  (the fixture)

DETERMINISTIC = ("epoch", "lr", "train_loss", "train_acc", "train_rate", "test_loss", "test_acc",
                 "test_rate", "firing_rates")


pytestmark = pytest.mark.usefixtures("one_thread")  # helpers.one_thread, for every test here


def make_trainer(run_dir=None, epochs=3, seed=0):
    checkpoint.seed_everything(seed)
    splits = make_splits()
    model = build_model("mlp", splits.input_shape, splits.num_classes, splits.time_steps, hidden=(32,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    return Trainer(model, splits, opt, epochs=epochs, batch_size=32, scheduler=sched, seed=seed,
                   run_dir=run_dir, progress=False, config={"note": "test"})


def strip(history):
    return [{k: r[k] for k in DETERMINISTIC} for r in history]


def test_fit_learns_and_writes_metrics_and_checkpoint(tmp_path):
    history = make_trainer(tmp_path).fit()
    assert [r["epoch"] for r in history] == [1, 2, 3]
    assert history[-1]["test_acc"] > 0.9
    assert 0 < history[-1]["test_rate"] < 1 and set(history[-1]["firing_rates"]) == {"layers.2"}
    assert strip(metrics.read(tmp_path / "metrics.jsonl")) == strip(history)
    state = checkpoint.load(tmp_path / "checkpoint.pt")
    assert state["epoch"] == 3 and state["config"] == {"note": "test"}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_resume_from_a_checkpoint_replays_exactly(tmp_path):
    full = make_trainer(tmp_path / "full").fit()
    first = make_trainer(tmp_path / "cut", epochs=3)
    first.epochs = 2  # stop early, as if interrupted after epoch 2
    first.fit()
    torch.manual_seed(999)  # disturb every RNG: resume must restore them
    resumed = make_trainer(tmp_path / "cut", seed=0)
    resumed.resume()
    assert resumed.epoch == 2
    assert strip(resumed.fit()) == strip(full)
    assert strip(metrics.read(tmp_path / "cut" / "metrics.jsonl")) == strip(full)


def test_bf16_autocast_trains(tmp_path):
    trainer = make_trainer(epochs=1)
    trainer.precision = "bf16"
    assert trainer.fit()[0]["train_loss"] > 0


def test_checkpoint_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    checkpoint.save({"epoch": 1, "w": torch.ones(3)}, path)

    def broken_save(obj, f):  # dies half-way through writing
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"epoch": 2}, path)
    assert checkpoint.load(path)["epoch"] == 1  # the old one is untouched
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # and no temp file is left behind


def test_rng_state_round_trip():
    import random

    import numpy as np

    g = torch.Generator().manual_seed(5)
    state = checkpoint.rng_state(g)
    a = (torch.rand(2), np.random.rand(), random.random(), torch.rand(2, generator=g))
    checkpoint.set_rng_state(state, g)
    b = (torch.rand(2), np.random.rand(), random.random(), torch.rand(2, generator=g))
    assert torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] == b[2] and torch.equal(a[3], b[3])


def test_spike_monitor_counts_rates():
    model = torch.nn.Sequential(LIF(decay=0.5), torch.nn.Identity(), LIF(decay=0.5, threshold=10.0))
    x = torch.zeros(4, 2, 5)
    x[:, 0] = 2.0  # sample 0 fires every step, sample 1 never
    with SpikeMonitor(model, keep=True) as mon:
        model(x)
    assert mon.rates() == {"0": 0.5, "2": 0.0}
    assert mon.rate() == 0.25 and mon.trains["0"].shape == (4, 2, 5)
    model(x)  # hooks are gone after the with block
    assert mon.rates()["0"] == 0.5


def test_config_layers_and_errors(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('epochs = 3\nbatch-size = 16\nlr = 1\ndataset = "x"\n')
    cfg = make(read_toml(f), {"epochs": 5})
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.dataset, cfg.model) == (5, 16, 1.0, "x", "mlp")
    f.write_text("epoch = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'epoch'; valid keys: dataset, model, epochs"):
        read_toml(f)
    f.write_text("epochs = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(f)
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_toml(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="epochs must be int"):
        make({"epochs": "3"})
    with pytest.raises(ConfigError, match="batch-size must be at least 1"):
        make({"batch_size": 0})
    with pytest.raises(ConfigError, match="precision"):
        make({"precision": "fp8"})


# ---- issue 14: empty splits, the non-finite policy for metrics, stop-on-nan, the run-directory lock ----

def nan_loss(logits, y, **kw):
    return torch.nn.functional.cross_entropy(logits, y, **kw) * float("nan")


def strict_json(path):
    import json

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_fit_on_an_empty_split_is_a_clear_error(tmp_path):
    for split, n in (("train", dict(n_train=0)), ("test", dict(n_test=0))):
        trainer = make_trainer(tmp_path / split)
        trainer.splits = make_splits(**n)
        with pytest.raises(ValueError, match=f"splits.{split}: the split is empty"):
            trainer.fit()  # used to be a ZeroDivisionError
    with pytest.raises(ValueError, match="batch_size"):
        Trainer(torch.nn.Linear(2, 2), make_splits(), torch.optim.SGD([torch.zeros(1)], lr=1), epochs=1, batch_size=0)


def test_diverged_metrics_are_written_as_null_with_a_warning(tmp_path):
    trainer = make_trainer(tmp_path, epochs=2)
    trainer.loss_fn, trainer.stop_on_nan = nan_loss, False
    # NaN weights give NaN spikes (never silent zeros): the spike rates are not finite either
    with pytest.warns(metrics.DivergedWarning, match="training diverged at epoch [12]: train_loss, .*test_loss.* not finite"):
        history = trainer.fit()
    assert len(history) == 2 and history[0]["train_loss"] != history[0]["train_loss"]  # NaN in memory
    records = strict_json(tmp_path / "metrics.jsonl")  # used to hold bare NaN: not JSON
    assert [r["train_loss"] for r in records] == [None, None] and records[1]["train_acc"] is not None


def test_stop_on_nan_stops_at_the_epoch_read_and_keeps_the_last_finite_checkpoint(tmp_path):
    from spikefuse.train.loop import TrainingDiverged

    trainer = make_trainer(tmp_path, epochs=3)
    trainer.epochs = 1
    trainer.fit()  # one good epoch, checkpointed
    trainer.epochs, trainer.loss_fn = 3, nan_loss
    with pytest.warns(metrics.DivergedWarning), \
            pytest.raises(TrainingDiverged, match=r"epoch 2 is nan; stopped \(last checkpoint: epoch 1 in"):
        trainer.fit()
    assert checkpoint.load(tmp_path / "checkpoint.pt")["epoch"] == 1
    assert [r["train_loss"] is None for r in strict_json(tmp_path / "metrics.jsonl")] == [False, True]


def test_metrics_append_leaves_no_half_line(tmp_path, monkeypatch):
    import errno

    path = tmp_path / "metrics.jsonl"
    metrics.append(path, {"epoch": 1})
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError):
        metrics.append(path, {"epoch": 2, "loss": 0.5})
    monkeypatch.undo()
    metrics.append(path, {"epoch": 3})
    assert metrics.read(path) == [{"epoch": 1}, {"epoch": 3}]


def test_ctrl_c_while_a_complete_line_is_synced_keeps_it(tmp_path, monkeypatch):
    """The GPU CLI matrix's resume test found it: Ctrl-C during the fsync truncated the whole
    line of an epoch whose checkpoint was already written."""
    path = tmp_path / "metrics.jsonl"

    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        metrics.append(path, {"epoch": 1})
    monkeypatch.undo()
    assert metrics.read(path) == [{"epoch": 1}]


def test_run_directory_lock_is_reentrant_here_and_exclusive_across_processes(tmp_path):
    import subprocess
    import sys

    from spikefuse.train import rundir

    run = tmp_path / "r"
    probe = ("import fcntl, os, sys\nfd = os.open(sys.argv[1] + '/.lock', os.O_RDWR)\n"  # a plain flock, as another run
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('got')\nexcept BlockingIOError: print('busy')")
    with rundir.lock(run), rundir.lock(run):  # the command and the Trainer both take it
        (run / "checkpoint.pt").write_bytes(b"x")
        out = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "busy", out.stderr
    out = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "got", out.stderr
    with rundir.lock(tmp_path / "unused"):
        pass
    assert not (tmp_path / "unused").exists()  # created for a run that wrote nothing: removed again


def test_a_new_run_in_a_directory_that_holds_one_is_refused(tmp_path):
    """The getting-started snippet run twice with one run_dir used to mix both runs' metrics."""
    make_trainer(tmp_path, epochs=1).fit()
    before = (tmp_path / "metrics.jsonl").read_text(), (tmp_path / "checkpoint.pt").read_bytes()
    with pytest.raises(ValueError, match=r"^run_dir: .* already holds a run .*trainer.resume\(\)"):
        make_trainer(tmp_path, epochs=1).fit()
    assert ((tmp_path / "metrics.jsonl").read_text(), (tmp_path / "checkpoint.pt").read_bytes()) == before
    (tmp_path / "checkpoint.pt").unlink()  # a run that stopped before its first checkpoint: metrics only
    with pytest.raises(ValueError, match="already holds a run"):
        make_trainer(tmp_path, epochs=1).fit()
    resumed = make_trainer(tmp_path / "other", epochs=1)
    resumed.fit()
    again = make_trainer(tmp_path / "other", epochs=2)
    again.resume()  # resuming is how a run directory is reused
    assert [r["epoch"] for r in again.fit()] == [1, 2]


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1e-3])
def test_a_learning_rate_that_is_not_finite_or_negative_is_refused(lr):
    """fit from Python, as the CLI's --lr: caught before the first step, naming the group."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["lr"] = lr  # torch's own constructors refuse some of these; a scheduler may not
    with pytest.raises(ValueError, match=r"^optimizer: parameter group 0 has learning rate"):
        Trainer(model, SimpleNamespace(train=[], test=[]), optimizer, epochs=1)


@pytest.mark.parametrize("make, lr", [(torch.optim.Adam, 1e38), (torch.optim.AdamW, 1e38),
                                      (lambda p, lr: torch.optim.Adam(p, lr, betas=(0.99, 0.999)), 1e37)])
def test_a_learning_rate_whose_first_adam_step_overflows_is_refused(make, lr):
    """Adam's first step is lr / (1 - beta1): 1e38 passed the range check and Adam raised
    'value cannot be converted to type float without overflow' at the first step."""
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"^optimizer: parameter group 0's lr must be at most .*Adam's first step"):
        Trainer(model, SimpleNamespace(train=[], test=[]), make(model.parameters(), lr), epochs=1)
    Trainer(model, SimpleNamespace(train=[], test=[]), make(model.parameters(), 1e36), epochs=1)  # fits
