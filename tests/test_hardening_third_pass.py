"""Issue 36, the non-numeric classes, by class of attack: writers that could replace a file
they did not create (a new run over an old one, --overwrite, export over a run's files),
`spikefuse plan` options that name internals or end in an internal error, and the first
hour's Python API (fit run twice in one run_dir). Each case is the right answer or one line
naming the argument (exit 2 from the command line), and nothing is lost unless told."""
from __future__ import annotations

import inspect
import json
import math
import os

import pytest
import torch
from torch import nn

from spikefuse.cli import main
from spikefuse.train import checkpoint, metrics, rundir
from spikefuse.train.loop import Trainer, fit
from test_hardening_rundir import QUICK, failure, quick_run, snapshot
from test_train_data import install, make_splits
from helpers import one_thread  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    """A finished 2-epoch `spikefuse train` run, with a file of the user's beside it."""
    run = quick_run(tmp_path_factory.mktemp("old") / "run", 2)
    (run / "notes.txt").write_text("mine")
    return run


@pytest.fixture
def standin(monkeypatch):
    install(monkeypatch.setattr)


def copy_of(run, tmp_path):
    import shutil
    target = tmp_path / "run"
    shutil.copytree(run, target)
    return target


# ---- a new run where another run lives: refused, unless --overwrite ----

def diverged(run):  # the metrics of a run that stopped (diverged) before its first checkpoint
    (run / checkpoint.FILENAME).unlink()
    metrics.rewrite(run / metrics.FILENAME, [{"epoch": 1, "train_loss": math.nan}])


@pytest.mark.parametrize("held", ["finished", "diverged"])
def test_a_new_run_refuses_a_directory_holding_a_run_and_changes_nothing(held, old_run, tmp_path, capsys, standin):
    run = copy_of(old_run, tmp_path)
    if held == "diverged":
        diverged(run)
    before = snapshot(run)
    line = failure(["train", *QUICK, "--epochs", "1", "--out", str(run)], capsys)
    assert "already holds a run" in line and "--overwrite" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("held", ["finished", "diverged"])
def test_overwrite_replaces_the_old_run_and_keeps_other_files(held, old_run, tmp_path, capsys, standin):
    run = copy_of(old_run, tmp_path)
    if held == "diverged":
        diverged(run)
    assert main(["train", *QUICK, "--epochs", "1", "--out", str(run), "--overwrite"]) == 0
    assert [r["epoch"] for r in metrics.read(run / metrics.FILENAME)] == [1]  # not 1, 2, 1
    state = checkpoint.load(run / checkpoint.FILENAME)
    assert state["epoch"] == 1 and [r["epoch"] for r in state["history"]] == [1]
    assert (run / "notes.txt").read_text() == "mine"  # not a run file: left alone


def test_overwrite_and_resume_together_are_refused(old_run, tmp_path, capsys, standin):
    run = copy_of(old_run, tmp_path)
    before = snapshot(run)
    line = failure(["train", "--resume", str(run), "--overwrite"], capsys)
    assert "--overwrite" in line and "--resume" in line
    assert snapshot(run) == before


def test_overwrite_of_an_empty_or_new_directory_is_an_ordinary_run(tmp_path, standin):
    assert main(["train", *QUICK, "--epochs", "1", "--out", str(tmp_path / "new"), "--overwrite"]) == 0
    assert [r["epoch"] for r in metrics.read(tmp_path / "new" / metrics.FILENAME)] == [1]


def test_clear_run_removes_only_run_files(tmp_path):
    for name in (*rundir.RUN_FILES, "model.nir", "notes.txt"):
        (tmp_path / name).write_text("x")
    removed = rundir.clear_run(tmp_path)
    assert sorted(p.name for p in removed) == sorted(rundir.RUN_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.nir", "notes.txt"]
    assert not rundir.holds_run(tmp_path)


# ---- the Python API: the getting-started snippet run twice with one run_dir ----

def tiny(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(2), nn.Linear(16, 4))


class MeanOverTime(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = tiny()

    def forward(self, x):  # [T, B, F] -> [B, C]
        return self.inner(x).mean(0)


def run_fit(run_dir, **kwargs):
    model = MeanOverTime()
    return fit(model, make_splits(), torch.optim.Adam(model.parameters(), lr=1e-2), epochs=2, batch_size=64,
               run_dir=run_dir, progress=False, **kwargs)


def test_fit_twice_in_one_run_dir_is_refused_and_changes_nothing(tmp_path):
    run_fit(tmp_path / "run")
    before = snapshot(tmp_path / "run")
    with pytest.raises(ValueError, match=r"^run_dir: .* already holds a run.*overwrite=True"):
        run_fit(tmp_path / "run")
    assert snapshot(tmp_path / "run") == before


def test_fit_with_overwrite_replaces_the_run(tmp_path):
    run_fit(tmp_path / "run")
    history = run_fit(tmp_path / "run", overwrite=True)
    assert [r["epoch"] for r in history] == [1, 2]
    assert [r["epoch"] for r in metrics.read(tmp_path / "run" / metrics.FILENAME)] == [1, 2]  # not 1, 2, 1, 2
    assert checkpoint.load(tmp_path / "run" / checkpoint.FILENAME)["epoch"] == 2


@pytest.mark.parametrize("run_dir, words", [("", "must name a directory, got ''"), (" ", "must name a directory"),
                                            ("a\0b", "NUL"), (3, "must be a path"), (b"runs", "must be a path")])
def test_fit_refuses_a_run_dir_that_names_no_directory(run_dir, words, tmp_path, monkeypatch):
    """run_dir='' was the current directory: fit wrote checkpoint.pt, metrics.jsonl and the
    pictures there without a word (the CLI's --out '' was refused already)."""
    monkeypatch.chdir(tmp_path)
    model = tiny()
    with pytest.raises(ValueError, match="^run_dir must ") as error:
        Trainer(model, make_splits(), torch.optim.Adam(model.parameters()), epochs=1, run_dir=run_dir)
    assert words in str(error.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [1, "yes", None])
def test_overwrite_must_be_a_bool(value):
    model = tiny()
    with pytest.raises(ValueError, match=r"^overwrite must be bool, got "):
        Trainer(model, make_splits(), torch.optim.Adam(model.parameters()), epochs=1, overwrite=value)


# ---- export never replaces a file it did not write ----

@pytest.mark.parametrize("name", [checkpoint.FILENAME, metrics.FILENAME, "notes.txt"])
def test_export_refuses_to_replace_a_file_that_is_not_a_nir_graph(name, old_run, tmp_path, capsys):
    pytest.importorskip("nir")
    run = copy_of(old_run, tmp_path)
    before = snapshot(run)
    line = failure(["export", "--nir", str(run), "--out", str(run / name)], capsys, "export")
    assert "is not a NIR graph" in line and "--out" in line
    assert snapshot(run) == before


@pytest.mark.parametrize("argv, words", [(["--nir", ""], "--nir must name a run directory, got ''"),
                                         (["--out", ""], "--out must name a file, got ''")])
def test_export_refuses_blank_paths(argv, words, old_run, tmp_path, capsys, monkeypatch):
    """--nir '' exported the current directory's run, --out '' wrote RUN/model.nir."""
    pytest.importorskip("nir")
    run = copy_of(old_run, tmp_path)
    monkeypatch.chdir(run)
    before = snapshot(run)
    line = failure(["export", *(["--nir", str(run)] if argv[0] == "--out" else []), *argv], capsys, "export")
    assert words in line
    assert snapshot(run) == before


@pytest.mark.parametrize("content, words", [
    ("nir", "it is an HDF5 file (a NIR graph, as spikefuse export writes?), not a checkpoint"),
    (bytes(range(256)), "not a checkpoint written by spikefuse (it holds objects other than tensors"),
], ids=["nir-graph", "other-bytes"])
def test_resume_of_a_file_that_is_no_checkpoint_says_what_it_is(content, words, old_run, tmp_path, capsys):
    """A NIR graph in the checkpoint's place (what the export example wrote) was torch's
    weights-only refusal, whose advice is to load with weights_only=False: run the file's code."""
    run = copy_of(old_run, tmp_path)
    if content == "nir":
        pytest.importorskip("nir")
        assert main(["export", "--nir", str(run)]) == 0
        os.replace(run / "model.nir", run / checkpoint.FILENAME)
    else:
        (run / checkpoint.FILENAME).write_bytes(content)
    line = failure(["train", "--resume", str(run)], capsys)
    assert f"cannot read checkpoint {run / checkpoint.FILENAME}: {words}" in line and "weights_only" not in line


def test_export_through_symbolic_links(old_run, tmp_path, capsys):
    """--out on a link loop or a dangling link replaced the link itself with the graph (exit 0);
    a link to an earlier graph was replaced by a file, the graph it named left as it was."""
    pytest.importorskip("nir")
    run = copy_of(old_run, tmp_path)
    (tmp_path / "loop.nir").symlink_to("loop.nir")
    (tmp_path / "dangling.nir").symlink_to("missing.nir")
    for link, why in (("loop.nir", "Too many levels of symbolic links"), ("dangling.nir", "No such file")):
        line = failure(["export", "--nir", str(run), "--out", str(tmp_path / link)], capsys, "export")
        assert "is a symbolic link that cannot be followed" in line and why in line
        assert (tmp_path / link).is_symlink()
    assert main(["export", "--nir", str(run)]) == 0
    (tmp_path / "graph.nir").symlink_to(run / "model.nir")
    before = (run / "model.nir").read_bytes()
    assert main(["export", "--nir", str(run), "--out", str(tmp_path / "graph.nir"), "--dt", "0.001"]) == 0
    assert (tmp_path / "graph.nir").is_symlink() and (run / "model.nir").read_bytes() != before  # written through


def test_export_replaces_its_own_graph(old_run, tmp_path, capsys):
    pytest.importorskip("nir")
    run = copy_of(old_run, tmp_path)
    assert main(["export", "--nir", str(run)]) == 0
    assert main(["export", "--nir", str(run)]) == 0
    assert (run / "model.nir").is_file()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".model.nir")) == []  # no temp left


# ---- spikefuse plan: every option named as the command line spells it, exit 2 ----

PLAN = ["plan", "--time-steps", "2", "--batch", "1"]


@pytest.mark.parametrize("argv, words", [
    (["--model", "nosuch"], "--model: unknown model 'nosuch'"),
    (["--model", "mlp"], "--model: model 'mlp' has no default input_shape or num_classes"),
    (["--model", "shd"], "--model: 'shd' is not a flat stack of layers"),
    (["--model", "deep-lif", "--width", "inf"], "--width: expected a finite number > 0"),
    (["--model", "deep-lif", "--width", "nan"], "--width: expected a finite number > 0"),
    (["--model", "deep-lif", "--width", "-1"], "--width: expected a finite number > 0"),
    (["--model", "deep-lif", "--width", "0"], "--width: expected a finite number > 0"),
    (["--model", "deep-lif", "--width", "1e30"], "--width: 1e+30 makes a layer of 2048 units"),  # was a TypeError
    (["--model", "deep-lif", "--link", "1e300", "1e300"], "--link: 1e+300 us and 1e+300 GB/s are past float64"),
    (["--model", "deep-lif", "--link", "nan", "nan"], "--link: expected a latency >= 0 us"),
    (["--model", "deep-lif", "--link", "-1", "10"], "--link: expected a latency >= 0 us"),
    (["--model", "deep-lif", "--link", "1", "0"], "--link: expected a latency >= 0 us"),
    (["--model", "deep-lif", "--link", "0", "0"], "--link: expected a latency >= 0 us"),  # the issue's own case
    (["--model", "deep-lif", "--link", "inf", "10"], "--link: expected a latency >= 0 us"),
    (["--model", "deep-lif", "--device", "banana"], "--device:"),
    (["--model", "deep-lif", "--gpus", "0"], "--gpus:"),
])
def test_plan_usage_mistakes_name_the_option(argv, words, capsys):
    line = failure([*PLAN, *argv], capsys, "plan")
    assert words in line and "model_name" not in line and "input_shape=" not in line.split(";")[0]


@pytest.mark.parametrize("argv, words", [
    (["plan", "--time-steps", "0", "--batch", "1", "--model", "deep-lif"], "--time-steps:"),
    (["plan", "--time-steps", "2", "--batch", "-3", "--model", "deep-lif"], "--batch:"),
])
def test_plan_counts_name_the_option(argv, words, capsys):
    assert words in failure(argv, capsys, "plan")


@pytest.mark.parametrize("width", [math.nan, math.inf, 0.0, -1.0, True, "2", 1e30])
def test_every_model_refuses_a_bad_width_naming_it(width):
    """One check (spikefuse.nn.layers.scaled) for every builder that scales its layers."""
    from spikefuse.models import MODELS, build_model

    checked = 0
    for name, (builder, _) in MODELS.items():
        params = inspect.signature(builder).parameters
        shape, classes = (params[k].default for k in ("input_shape", "num_classes"))
        if shape is inspect.Parameter.empty:
            shape, classes = (64,), 10
        try:
            build_model(name, shape, classes, 4, width=1 / 64)
        except TypeError:  # a builder without widths (mlp)
            continue
        with pytest.raises(ValueError, match="^width: "):
            build_model(name, shape, classes, 4, width=width)
        checked += 1
    assert checked >= 10


# ---- the first hour: earlier fixes, kept ----

@pytest.mark.parametrize("argv, words", [
    (["--out", ""], "out must name a directory"),
    (["--out", " "], "out must name a directory, got ' '"),
    (["--threads", "100000"], "threads must be at most 1024"),
    (["--lr", "1e300"], "lr must lie in float32's normal range"),
    (["--model", "resnet18"], "--model 'resnet18' does not fit"),
])
def test_train_usage_mistakes_are_one_line(argv, words, tmp_path, capsys, standin):
    out = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
    line = failure(["train", *QUICK, "--epochs", "1", *out, *argv], capsys)
    assert words in line
    assert not (tmp_path / "run").exists()


def test_a_config_file_setting_one_option_twice_is_refused(tmp_path, capsys, standin):
    config = tmp_path / "c.toml"
    config.write_text("batch_size = 32\nbatch-size = 64\n")
    line = failure(["train", *QUICK, "--config", str(config), "--out", str(tmp_path / "run")], capsys)
    assert "a second time" in line and "batch-size" in line


def test_a_blank_resume_is_refused_not_read_as_a_new_run(tmp_path, capsys, standin, monkeypatch):
    """--resume '' was read as no --resume: a new run in runs/<dataset>-<model>-<time>, exit 0."""
    monkeypatch.chdir(tmp_path)
    for blank in ("", " "):
        line = failure(["train", *QUICK, "--epochs", "1", "--resume", blank], capsys)
        assert f"--resume must name a run directory, got {blank!r}" in line
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_out_holding_a_nul_is_refused_naming_it(tmp_path, capsys, standin):
    config = tmp_path / "c.toml"
    config.write_text('out = "a\\u0000b"\n')  # was os's 'embedded null byte', exit 1
    line = failure(["train", *QUICK, "--config", str(config)], capsys)
    assert "out must name a directory" in line and "NUL" in line


def test_resume_with_an_unknown_format_version_changes_nothing(old_run, tmp_path, capsys, standin):
    run = copy_of(old_run, tmp_path)
    state = checkpoint.load(run / checkpoint.FILENAME)
    state["version"] = 99
    checkpoint.save(state, run / checkpoint.FILENAME)
    before = snapshot(run)
    assert "format version 99" in failure(["train", "--resume", str(run)], capsys)
    assert snapshot(run) == before
    assert json.loads((run / metrics.FILENAME).read_text().splitlines()[-1])["epoch"] == 2
