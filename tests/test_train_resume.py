"""Kill a training run with SIGKILL in the middle of an epoch, resume it, and get exactly
the metrics of an uninterrupted run; the checkpoint must load at every moment.

Run as a script, this file is the run that gets killed: the stand-in data reports its
progress to a file and stalls in epoch 2, so the kill always lands mid-epoch.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from test_train_data import StandInDataset, install

ARGS = ["train", "--dataset", "standin", "--epochs", "3", "--batch-size", "32", "--lr", "0.01",
        "--seed", "3", "--quiet"]
KEYS = ("epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "firing_rates")
STALL_EPOCH, STALL_BATCH = 2, 3


def read_metrics(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: json.loads(line)[k] for k in KEYS} for line in lines]


def test_killed_run_resumes_to_the_same_result(tmp_path, monkeypatch):
    from spikefuse.cli import main
    from spikefuse.train import checkpoint

    install(monkeypatch.setattr)
    assert main(ARGS + ["--out", str(tmp_path / "full")]) == 0

    cut, progress = tmp_path / "cut", tmp_path / "progress"
    proc = subprocess.Popen([sys.executable, __file__, str(progress), *ARGS, "--out", str(cut)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    loads, deadline = 0, time.monotonic() + 120
    try:
        while not (progress.exists() and progress.read_text() == f"{STALL_EPOCH} {STALL_BATCH}"):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the run never reached the middle of epoch 2"
            if (cut / "checkpoint.pt").exists():
                checkpoint.load(cut / "checkpoint.pt")  # never half-written
                loads += 1
            time.sleep(0.01)
    finally:
        proc.kill()  # SIGKILL: no cleanup handlers run
        proc.wait()
    state = checkpoint.load(cut / "checkpoint.pt")
    assert state["epoch"] == STALL_EPOCH - 1
    assert not list(cut.glob(".*.tmp"))

    assert main(["train", "--resume", str(cut), "--quiet"]) == 0
    full = read_metrics(tmp_path / "full")
    assert [r["epoch"] for r in full] == [1, 2, 3]
    assert read_metrics(cut) == full
    assert torch.equal(checkpoint.load(cut / "checkpoint.pt")["model"]["layers.1.weight"],
                       checkpoint.load(tmp_path / "full" / "checkpoint.pt")["model"]["layers.1.weight"])


class ReportingDataset(StandInDataset):
    """Training batches write 'epoch batch' to a file, and stall at the chosen batch."""

    epoch = 0

    def __init__(self, inner, progress):
        super().__init__(inner.x, inner.targets)
        self.progress = Path(progress)

    def batches(self, batch_size, *, shuffle, generator=None, drop_last=False):
        ReportingDataset.epoch += 1
        for i, batch in enumerate(super().batches(batch_size, shuffle=shuffle, generator=generator), 1):
            self.progress.write_text(f"{self.epoch} {i}")
            if (self.epoch, i) == (STALL_EPOCH, STALL_BATCH):
                time.sleep(600)  # wait here for the SIGKILL
            yield batch


if __name__ == "__main__":
    import spikefuse.data as data
    from spikefuse.cli import main

    progress_file, argv = sys.argv[1], sys.argv[2:]
    install()
    load = data.load

    def reporting_load(*args, **kwargs):
        splits = load(*args, **kwargs)
        splits.train = ReportingDataset(splits.train, progress_file)
        return splits

    data.load = reporting_load
    sys.exit(main(argv))
