"""Issue 36, run directories and `spikefuse train`, by class of attack: checkpoints that
cannot be resumed as they are, numeric options outside what training can take, run
directory paths that cannot be directories, LazyAdam on dtypes it cannot update,
time-major model outputs under fit, models that cannot take the data set's shape.
Each is the right answer or one line naming the argument (exit 2 from the command line),
and nothing in the run directory changes."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from torch import nn

from spikefuse.cli import main
from spikefuse.train import checkpoint, metrics, rundir
from spikefuse.train.loop import Trainer, fit
from test_train_data import install, make_splits
from helpers import one_thread  # noqa: F401  (the fixture)

QUICK = ["--dataset", "standin", "--batch-size", "64", "--quiet"]


pytestmark = pytest.mark.usefixtures("one_thread")  # helpers.one_thread, for every test here


def failure(argv, capsys, command="train"):
    """Exit code 2, one line on stderr naming the command, no traceback; returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if ": warning: " not in line and line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"spikefuse {command}: error: "), lines[0]
    return lines[0]


def snapshot(run):
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != rundir.LOCK_NAME}


def quick_run(run, epochs: int):
    """`spikefuse train` on the stand-in data for `epochs` into `run` (for module fixtures,
    which cannot use the monkeypatch fixture); returns run."""
    with pytest.MonkeyPatch.context() as mp:
        install(mp.setattr)
        assert main(["train", *QUICK, "--epochs", str(epochs), "--out", str(run)]) == 0
    return run


# ---- resume: the checkpoint is checked before anything resumes ----

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-epoch `spikefuse train` run of 3 epochs' options, stopped after epoch 2."""
    run = quick_run(tmp_path_factory.mktemp("base") / "run", 3)
    state = checkpoint.load(run / checkpoint.FILENAME)  # as if interrupted after epoch 2
    state["epoch"], state["history"] = 2, state["history"][:2]
    checkpoint.save(state, run / checkpoint.FILENAME)
    metrics.rewrite(run / metrics.FILENAME, state["history"])
    return run


def edit_state(**changes):
    return lambda state: state.update(changes)


def keep_state(state):
    pass


# (what is done to the checkpoint, what to metrics.jsonl's records, words of the error)
BROKEN = {
    "unknown version": (edit_state(version=99), None, "format version 99; this release reads version 1"),
    "version as text": (edit_state(version="1"), None, "format version '1'"),
    "version as bool": (edit_state(version=True), None, "format version True"),
    "no version": (lambda s: s.pop("version"), None, "has no format version"),
    "negative epoch": (edit_state(epoch=-1), None, "is at epoch -1; expected a whole number >= 0"),
    "fractional epoch": (edit_state(epoch=1.5), None, "is at epoch 1.5"),
    "epoch as bool": (edit_state(epoch=True), None, "is at epoch True"),
    "epoch past the history": (edit_state(epoch=1), None, "is at epoch 1 but its history holds epochs 1, 2"),
    "history unordered": (lambda s: s["history"].reverse(), None, "its history holds epochs 2, 1"),
    "history not a list": (edit_state(history=None), None, "its history holds no list"),
    "epoch past the run's epochs": (lambda s: s.update(epoch=4, history=s["history"] + [
        dict(s["history"][-1], epoch=3), dict(s["history"][-1], epoch=4)]), None,
        "past the 3 epochs of the run"),
    "duplicated metrics line": (keep_state, lambda r: r + [r[-1]], "holds epochs 1, 2, 2, not epochs 1, 2, 3"),
    "unordered metrics": (keep_state, lambda r: r[::-1], "holds epochs 2, 1, not epochs 1, 2, 3"),
    "metrics restarting": (keep_state, lambda r: r + r, "holds epochs 1, 2, 1, 2"),
    "metrics missing epochs": (lambda s: s.update(epoch=3, history=s["history"] + [dict(s["history"][-1], epoch=3)]),
                               lambda r: r[:1], "holds epochs 1, but"),
    "metrics of another run": (keep_state, lambda r: [dict(r[0], train_loss=123.0), r[1]],
                               "differs from the history in"),
}


def broken_copy(finished_run, tmp_path, edit, lines):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    state = checkpoint.load(run / checkpoint.FILENAME)
    edit(state)
    checkpoint.save(state, run / checkpoint.FILENAME)
    if lines is not None:
        records = lines(metrics.read(run / metrics.FILENAME))
        (run / metrics.FILENAME).write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.parametrize("case", BROKEN)
def test_resume_refuses_a_checkpoint_it_cannot_continue(case, finished_run, tmp_path, capsys, monkeypatch):
    install(monkeypatch.setattr)
    edit, lines, words = BROKEN[case]
    run = broken_copy(finished_run, tmp_path, edit, lines)
    before = snapshot(run)
    assert words in failure(["train", "--resume", str(run), "--quiet"], capsys)
    assert snapshot(run) == before  # nothing trained, nothing rewritten


def python_trainer(run_dir, epochs=3):
    checkpoint.seed_everything(0)
    splits = make_splits()
    model = nn.Sequential(nn.Flatten(0, 1), nn.Linear(16, 4), nn.Unflatten(0, (8, -1)))  # [T, B, 4]
    model = TimeMean(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Trainer(model, splits, opt, epochs=epochs, batch_size=64, run_dir=run_dir, progress=False)


class TimeMean(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).mean(0)


@pytest.mark.parametrize("case", ["unknown version", "negative epoch", "epoch past the history",
                                  "epoch past the run's epochs", "duplicated metrics line", "metrics of another run"])
def test_trainer_resume_refuses_the_same_checkpoints(case, tmp_path):
    run = tmp_path / "run"
    python_trainer(run, epochs=2).fit()
    edit, lines, words = BROKEN[case]
    run = broken_copy(run, tmp_path / "copy", edit, lines)
    before = snapshot(run)
    trainer = python_trainer(run, epochs=3)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(checkpoint.CheckpointError, match=words.replace("(", r"\(").replace(".", r"\.")):
        trainer.resume()
    assert trainer.epoch == 0 and trainer.history == []
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in weights.items())
    assert snapshot(run) == before


@pytest.mark.parametrize("lines, kept", [
    (lambda r: r[:1], "lagging by one line (killed between the checkpoint and the metrics line)"),
    (lambda r: r + [dict(r[-1], epoch=3, train_loss=None)], "ahead by a diverged epoch's line"),
    (lambda r: r + [dict(r[-1], epoch=3), dict(r[-1], epoch=4)], "ahead by two lines"),
])
def test_resume_cuts_back_or_completes_metrics_of_the_same_run(lines, kept, finished_run, tmp_path, capsys,
                                                               monkeypatch):
    install(monkeypatch.setattr)
    run = broken_copy(finished_run, tmp_path, keep_state, lines)
    assert main(["train", "--resume", str(run), "--quiet"]) == 0, kept
    assert [r["epoch"] for r in metrics.read(run / metrics.FILENAME)] == [1, 2, 3], kept


# ---- numeric options: checked before the run directory is touched ----

@pytest.mark.parametrize("argv, words", [
    (["--threads", "100000"], "threads must be at most 1024, got 100000"),  # was a segfault, lock left behind
    (["--threads", "1025"], "threads must be at most 1024"),
    (["--threads", "0"], "threads must be at least 1"),
    (["--threads=-3"], "threads must be at least 1"),
    (["--lr", "1e300"], "lr must lie in float32's normal range"),  # was exit 1, RuntimeError from Adam
    (["--lr", "3.5e38"], "lr must lie in float32's normal range"),
    (["--lr", "1e38"], "lr must be at most 3.4e+37: Adam's first step divides it by 1 - beta1 = 0.1"),  # was exit 1
    (["--lr", "1e-320"], "lr must lie in float32's normal range"),  # float32 0: nothing would train
    (["--lr=-1e-3"], "lr must be a finite number > 0, got -0.001"),
    (["--lr", "0"], "lr must be a finite number > 0, got 0.0"),
    (["--lr=-inf"], "lr must be a finite number > 0, got -inf"),
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--clip-grad", "1e300"], "clip-grad must lie in float32's normal range"),
    (["--clip-grad", "5e-324"], "clip-grad must lie in float32's normal range"),
    (["--clip-grad", "inf"], "clip-grad must be a finite number > 0, got inf"),
    (["--clip-grad", "nan"], "clip-grad must be a finite number > 0, got nan"),
])
def test_numeric_options_out_of_range_are_refused_before_the_run_directory(argv, words, tmp_path, capsys):
    out = tmp_path / "run"
    assert words in failure(["train", *argv, "--epochs", "1", "--quiet", "--out", str(out)], capsys)
    assert not out.exists()  # no directory, no lock left behind


def test_the_same_ranges_hold_in_a_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    for text, words in (("threads = 100000\n", "threads must be at most 1024"),
                        ("lr = 1e300\n", "lr must lie in float32's normal range"),
                        ("clip-grad = -1.0\n", "clip-grad must be a finite number > 0")):
        cfg.write_text(text)
        assert words in failure(["train", "--config", str(cfg)], capsys)


# ---- --out and --resume paths that cannot be run directories ----

def bad_paths(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "dangling").symlink_to("nowhere")
    (tmp_path / "file").write_text("x")
    return {
        "symlink loop": (tmp_path / "loop", "Too many levels of symbolic links"),
        "two-link loop": (tmp_path / "a", "Too many levels of symbolic links"),
        "below a loop": (tmp_path / "loop" / "run", "Too many levels of symbolic links"),
        "dangling link": (tmp_path / "dangling", "leads through the symbolic link"),
        "below a dangling link": (tmp_path / "dangling" / "run", "leads through the symbolic link"),
        "a file": (tmp_path / "file", "is a file"),
        "below a file": (tmp_path / "file" / "run", "Not a directory"),
        "name too long": (tmp_path / ("n" * 300), "File name too long"),
    }


@pytest.mark.parametrize("case", ["symlink loop", "two-link loop", "below a loop", "dangling link",
                                  "below a dangling link", "a file", "below a file", "name too long"])
def test_out_that_cannot_be_a_directory_is_a_usage_error(case, tmp_path, capsys):
    path, words = bad_paths(tmp_path)[case]
    listing = sorted(os.listdir(tmp_path))
    err = failure(["train", "--epochs", "1", "--quiet", "--out", str(path)], capsys)
    assert f"--out {path}" in err and words in err
    err = failure(["train", "--resume", str(path)], capsys)
    assert "cannot resume: --resume" in err and (words in err or "does not exist" in err)
    assert sorted(os.listdir(tmp_path)) == listing
    with pytest.raises(ValueError, match=f"^run_dir: .*{words}"):  # fit's run_dir alike
        python_trainer(path, epochs=1).fit()


def test_out_through_a_good_link_still_works(tmp_path, capsys, monkeypatch):
    install(monkeypatch.setattr)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    assert main(["train", *QUICK, "--epochs", "1", "--out", str(tmp_path / "link" / "run")]) == 0
    assert (tmp_path / "real" / "run" / checkpoint.FILENAME).is_file()


# ---- LazyAdam: dtypes it cannot update are refused where they enter ----

@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.int64])
def test_lazy_adam_refuses_parameters_it_would_update_in_float32(dtype):
    from spikefuse.optim import LazyAdam

    p = torch.zeros(3, 4, dtype=dtype)
    with pytest.raises(TypeError, match=f"params\\[1\\] of group 0 is {dtype}"):
        LazyAdam([torch.zeros(3, requires_grad=True), p])
    opt = LazyAdam([torch.zeros(3, requires_grad=True)])
    with pytest.raises(TypeError, match=f"params\\[0\\] of group 1 is {dtype}"):
        opt.add_param_group({"params": [p]})
    assert len(opt.param_groups) == 1  # refused before the group was added


def test_lazy_adam_refuses_a_model_made_float64_after_construction():
    from spikefuse.optim import LazyAdam

    model = nn.Linear(4, 3)
    opt = LazyAdam(model.parameters(), lr=0.1)
    model.double()
    model(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    weight = model.weight.detach().clone()
    with pytest.raises(TypeError, match="is torch.float64"):
        opt.step()
    assert torch.equal(model.weight, weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lazy_adam_takes_the_float_dtypes_it_updates(dtype):
    from spikefuse.optim import LazyAdam

    p = torch.ones(3, 4, dtype=dtype, requires_grad=True)
    opt = LazyAdam([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()
    assert (p.detach().float() < 1).all() and opt.state[p]["exp_avg"].dtype == torch.float32


# ---- fit with a model returning time-major [T, B, C] ----

@pytest.mark.parametrize("loss", ["membrane_cross_entropy", "rate_cross_entropy", "count_mse"])
def test_fit_trains_a_time_major_output_with_the_snn_losses(loss, tmp_path):
    import spikefuse.loss

    checkpoint.seed_everything(0)
    splits = make_splits()
    model = nn.Sequential(nn.Flatten(0, 1), nn.Linear(16, 4), nn.Unflatten(0, (8, -1)))  # [T, B, C]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = fit(model, splits, opt, epochs=2, batch_size=64, loss_fn=getattr(spikefuse.loss, loss),
                  progress=False, run_dir=tmp_path / "run")  # a run_dir: the raster reads predictions too
    assert [r["epoch"] for r in history] == [1, 2]
    for r in history:
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["test_acc"] <= 1
    mean_model = nn.Sequential(model, TimeMeanOnly())  # the accuracy is that of the mean over time
    trainer = Trainer(mean_model, splits, opt, epochs=1, batch_size=64, progress=False)
    assert trainer.evaluate()["test_acc"] == history[-1]["test_acc"]


class TimeMeanOnly(nn.Module):
    def forward(self, x):
        return x.mean(0)


def test_a_time_major_output_under_the_default_loss_is_one_line_naming_loss_fn(tmp_path):
    """cross_entropy (fit's default) on [T, B, C] said 'Expected input batch_size (8) to match
    target batch_size (64)': T taken for the batch."""
    model = nn.Sequential(nn.Flatten(0, 1), nn.Linear(16, 4), nn.Unflatten(0, (8, -1)))  # [T, B, C]
    trainer = Trainer(model, make_splits(), torch.optim.Adam(model.parameters()), epochs=1, batch_size=64,
                      progress=False, run_dir=tmp_path / "run")
    for step in (trainer.fit, trainer.evaluate):
        with pytest.raises(ValueError, match=r"^loss_fn: the model returns a time-major \[T, B, C\] \(8, 64, 4\).*"
                                             r"membrane_cross_entropy"):
            step()
    assert not (tmp_path / "run").exists()


# ---- models that cannot take the data set's input shape ----

@pytest.mark.parametrize("model", ["resnet18", "resnet34", "cifar-small", "dvs-gesture"])
def test_image_models_on_flat_data_are_refused_naming_both(model, tmp_path, capsys):
    out = tmp_path / "run"
    err = failure(["train", "--model", model, "--dataset", "digits", "--epochs", "1", "--quiet",
                   "--out", str(out)], capsys)
    assert f"--model {model!r} does not fit --dataset 'digits'" in err and "(64,)" in err
    assert "max() arg" not in err and "unpack" not in err  # nothing of the builders' insides
    assert not out.exists()
