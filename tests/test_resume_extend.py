"""`spikefuse train --resume RUN --epochs N` extends a run to N epochs in all (issue 37, item
4): the added epochs run a new cosine from the run's initial learning rate down to 0, the run
directory then holds N epochs' metrics and a checkpoint whose options say N, and an extension
cut short resumes to the same result. A total below the run's is refused; the run's own
total continues it as --resume alone does."""
from __future__ import annotations

import json
import math

import pytest

from spikefuse.cli import main
from spikefuse.train import checkpoint
from test_hardening_rundir import QUICK, failure
from helpers import one_thread  # noqa: F401  (the fixture)
from test_train_data import install

pytestmark = pytest.mark.usefixtures("one_thread")  # helpers.one_thread, for every test here

LR = 0.01


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.endswith(("_per_s", "_time_s"))} for r in rows]


@pytest.fixture
def two_epochs(tmp_path, monkeypatch):
    install(monkeypatch.setattr)
    run = tmp_path / "run"
    assert main(["train", *QUICK, "--epochs", "2", "--lr", str(LR), "--out", str(run)]) == 0
    return run


def test_a_finished_run_extends_with_a_new_cosine(two_epochs, capsys):
    capsys.readouterr()
    assert main(["train", "--resume", str(two_epochs), "--epochs", "5"]) == 0
    assert "extending" in capsys.readouterr().out
    rows = metrics(two_epochs)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    added = [r["lr"] for r in rows[2:]]  # a cosine over 3 epochs, from LR
    assert added == pytest.approx([LR * (1 + math.cos(math.pi * k / 3)) / 2 for k in range(3)])
    assert checkpoint.load(two_epochs / checkpoint.FILENAME)["config"]["options"]["epochs"] == 5


def test_an_extension_cut_short_resumes_to_the_same_result(two_epochs, tmp_path, monkeypatch):
    from spikefuse.train.loop import Trainer

    whole = tmp_path / "whole"
    whole.mkdir()
    for f in two_epochs.iterdir():  # a copy of the 2-epoch run, extended without a stop
        if f.is_file() and f.name != ".lock":
            (whole / f.name).write_bytes(f.read_bytes())
    assert main(["train", "--resume", str(whole), "--epochs", "4", "--quiet"]) == 0

    train_epoch = Trainer.train_epoch

    def stop_at_epoch_4(self, epoch):
        if epoch == 3:
            raise KeyboardInterrupt  # Ctrl-C after epoch 3 was checkpointed
        return train_epoch(self, epoch)
    monkeypatch.setattr(Trainer, "train_epoch", stop_at_epoch_4)
    assert main(["train", "--resume", str(two_epochs), "--epochs", "4", "--quiet"]) == 130
    monkeypatch.setattr(Trainer, "train_epoch", train_epoch)
    assert main(["train", "--resume", str(two_epochs), "--quiet"]) == 0  # its options now say 4
    assert without_timings(metrics(two_epochs)) == without_timings(metrics(whole))


def test_a_total_below_the_runs_is_refused_and_its_own_continues_it(two_epochs, capsys):
    line = failure(["train", "--resume", str(two_epochs), "--epochs", "1"], capsys)
    assert "--epochs 1: " in line and "is a run of 2 epochs" in line
    before = metrics(two_epochs)
    assert main(["train", "--resume", str(two_epochs), "--epochs", "2", "--quiet"]) == 0  # as without it
    assert metrics(two_epochs) == before
