"""`spikefuse train` from the command line: help, a short run, and every user mistake
answered by one line naming the problem and the valid choices, exit code 2, no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from spikefuse.cli import main
from test_train_data import install

QUICK = ["--epochs", "1", "--batch-size", "64", "--quiet"]


@pytest.fixture
def standin(monkeypatch):
    install(monkeypatch.setattr)


def error_of(argv, capsys):
    """Runs the CLI in-process; returns stderr after checking exit code 2 and one line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_help_lists_data_sets_and_models(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("digits", "randman", "shd", "nmnist", "mlp", "--resume", "--precision"):
        assert name in out


def test_short_run_prints_accuracy_and_writes_the_run(tmp_path, capsys, standin):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "standin", "--out", str(out), *QUICK]) == 0
    assert "test accuracy" in capsys.readouterr().out
    for name in ("checkpoint.pt", "metrics.jsonl", "curves.png", "raster.png", "firing_rates.png"):
        assert (out / name).is_file(), name


def test_config_file_with_command_line_winning(tmp_path, capsys, standin):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'dataset = "standin"\nepochs = 5\nbatch-size = 32\nout = "{tmp_path / "run"}"\nquiet = 1\n')
    assert "unknown key 'quiet'" in error_of(["train", "--config", str(cfg)], capsys)
    cfg.write_text(f'dataset = "standin"\nepochs = 5\nbatch-size = 32\nout = "{tmp_path / "run"}"\n')
    assert main(["train", "--config", str(cfg), "--epochs", "1", "--quiet"]) == 0
    from spikefuse.train import checkpoint
    options = checkpoint.load(tmp_path / "run" / "checkpoint.pt")["config"]["options"]
    assert (options["epochs"], options["batch_size"], options["dataset"]) == (1, 32, "standin")


@pytest.mark.parametrize("argv, expected", [
    (["--dataset", "mnist"], ["unknown data set 'mnist'", "digits", "randman", "shd-synthetic"]),
    (["--model", "vgg"], ["unknown model 'vgg'", "mlp"]),
    (["--epochs", "0"], ["epochs must be at least 1"]),
    (["--device", "tpu"], ["unknown device 'tpu'", "available here:", "cpu"]),
])
def test_bad_options(argv, expected, capsys):
    err = error_of(["train", *argv], capsys)
    for text in expected:
        assert text in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_unavailable_device(capsys):
    err = error_of(["train", "--device", "cuda"], capsys)
    assert "device 'cuda' is not available on this machine; available here: auto, cpu" in err


def test_bad_config_files(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("learning_rate = 0.1\n")
    err = error_of(["train", "--config", str(cfg)], capsys)
    assert "unknown key 'learning_rate'" in err and "valid keys: dataset, model, epochs, batch-size, lr" in err
    cfg.write_text("lr = [0.1\n")
    assert "is not valid TOML" in error_of(["train", "--config", str(cfg)], capsys)
    cfg.write_text('epochs = "ten"\n')
    assert "epochs must be int, got 'ten'" in error_of(["train", "--config", str(cfg)], capsys)
    assert "cannot read config file" in error_of(["train", "--config", str(tmp_path / "nope.toml")], capsys)


def test_resume_errors(tmp_path, capsys, standin):
    err = error_of(["train", "--resume", str(tmp_path)], capsys)
    assert f"cannot resume: {tmp_path} has no checkpoint.pt" in err
    assert "does not exist" in error_of(["train", "--resume", str(tmp_path / "nope")], capsys)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert "cannot read checkpoint" in error_of(["train", "--resume", str(tmp_path)], capsys)
    run = tmp_path / "run"
    assert main(["train", "--dataset", "standin", "--out", str(run), *QUICK]) == 0
    err = error_of(["train", "--resume", str(run), "--lr", "0.1"], capsys)
    assert "drop --lr" in err and "allowed with --resume: --device" in err
    err = error_of(["train", "--dataset", "standin", "--out", str(run), *QUICK], capsys)
    assert f"continue it with --resume {run}" in err


def test_the_installed_command_exits_2_without_traceback():
    """The real entry point, in a fresh process."""
    entry = "import sys; from spikefuse.cli import main; sys.exit(main())"  # what the `spikefuse` script runs
    proc = subprocess.run([sys.executable, "-c", entry, "train", "--model", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "spikefuse train: error: unknown model 'nope'; expected one of: " + \
        ", ".join(__import__("spikefuse.models", fromlist=["MODELS"]).MODELS)
