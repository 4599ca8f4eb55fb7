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


def test_help_and_the_package_import_do_not_import_torch():
    """`spikefuse --help` answers before torch loads (issue 37: within 0.5 s of `python -c
    pass`; torch alone takes seconds): the package loads its modules on first use."""
    def run(code):
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    imported = run("import sys, spikefuse; before = 'torch' in sys.modules; spikefuse.functional\n"
                   "print(before, 'torch' in sys.modules)")
    assert imported.stdout.split() == ["False", "True"], imported  # and the first use loads it
    helped = run("import sys; from spikefuse.cli import main\n"
                 "try:\n    main(['--help'])\nexcept SystemExit:\n    print('torch' in sys.modules)")
    assert "train a network" in helped.stdout and helped.stdout.split()[-1] == "False", helped


@pytest.mark.parametrize("argv, words", [
    (["--lr", "-1e-3"], "lr must be a finite number > 0, got -0.001"),  # argparse: "expected one argument"
    (["--clip-grad", "-inf"], "clip-grad must be a finite number > 0, got -inf"),
    (["--lr", "-NaN"], "lr must be a finite number > 0, got nan"),
    (["--epochs", "-2"], "epochs must be at least 1, got -2"),
])
def test_negative_numbers_reach_the_options_own_check(argv, words, tmp_path, capsys):
    assert main(["train", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


# ---- issue 14: every failure one line, exit 2 (usage) or 1 (fault), no traceback ----

def failure(argv, capsys, code):
    """Runs the CLI in-process; returns stderr after checking the exit code, one line, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if ": warning: " not in line and line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_empty_checkpoint_on_resume(tmp_path, capsys):
    (tmp_path / "checkpoint.pt").write_bytes(b"")  # the error handler itself used to crash (IndexError)
    assert "is empty (0 bytes)" in failure(["train", "--resume", str(tmp_path)], capsys, 2)


def test_binary_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(bytes(range(256)) * 4)
    assert "is not a TOML text file" in failure(["train", "--config", str(cfg)], capsys, 2)


def test_out_naming_a_file(tmp_path, capsys, standin):
    out = tmp_path / "a_file"
    out.write_text("x")
    assert "is a file" in failure(["train", "--dataset", "standin", "--out", str(out), *QUICK], capsys, 2)
    assert "is a file" in failure(["train", "--resume", str(out)], capsys, 2)


def test_model_that_does_not_fit_the_data_set(tmp_path, capsys):
    err = failure(["train", "--model", "cifar-small", "--dataset", "digits", "--out", str(tmp_path / "r"),
                   *QUICK], capsys, 2)
    assert "--model 'cifar-small' does not fit --dataset 'digits'" in err and "(64,)" in err and "(3, 32, 32)" in err
    assert not (tmp_path / "r").exists()  # a run that never started leaves no directory behind


@pytest.mark.parametrize("argv, expected", [
    (["--seed", str(2**70)], "seed must be an integer from -2**63 to 2**63 - 1"),
    (["--lr", "inf"], "lr must be a finite number > 0, got inf"),
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--batch-size", str(2**40)], "batch-size must be at most"),
])
def test_numeric_options_are_range_checked(argv, expected, capsys):
    assert expected in failure(["train", *argv], capsys, 2)


def test_time_steps_beyond_memory_are_refused_before_allocating(tmp_path, capsys, monkeypatch):
    from spikefuse.data import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device, **_: 8 * 10**9)  # the same on every machine
    err = failure(["train", "--time-steps", "100000", "--out", str(tmp_path / "r"), *QUICK], capsys, 2)
    assert "digits at 100000 time steps needs about 115 GB of host memory, 8 GB is available" in err
    assert "--time-steps" in err


def test_resume_whose_options_contradict_the_checkpoint(tmp_path, capsys, standin):
    from spikefuse.train import checkpoint

    run = tmp_path / "run"
    assert main(["train", "--dataset", "standin", "--out", str(run), *QUICK]) == 0
    state = checkpoint.load(run / "checkpoint.pt")
    state["config"]["options"]["dataset"] = "digits"  # 64 inputs; the saved weights take 16
    checkpoint.save(state, run / "checkpoint.pt")
    err = failure(["train", "--resume", str(run), "--quiet"], capsys, 2)
    assert f"cannot resume {run}" in err and "model 'mlp' for input (16,)" in err and "(64,)" in err
    state["config"]["model"].update(input_shape=[64], num_classes=10, time_steps=20)  # weights of another shape
    checkpoint.save(state, run / "checkpoint.pt")
    err = failure(["train", "--resume", str(run), "--quiet"], capsys, 2)
    assert "does not fit the model and optimizer" in err and "size mismatch" in err


def test_out_of_memory_is_one_line_naming_what_to_lower(tmp_path, capsys, standin, monkeypatch):
    from spikefuse.train.loop import Trainer

    def oom(self):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.\nmore text")
    monkeypatch.setattr(Trainer, "fit", oom)
    err = failure(["train", "--dataset", "standin", "--out", str(tmp_path / "r"), *QUICK], capsys, 1)
    assert "out of memory" in err and "--batch-size 64" in err and "lower --batch-size or --time-steps" in err


def test_full_disk_is_one_line_and_leaves_no_temp_file(tmp_path, capsys, standin, monkeypatch):
    import errno

    def full(obj, f):
        f.write(b"part of a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(torch, "save", full)
    run = tmp_path / "r"
    err = failure(["train", "--dataset", "standin", "--out", str(run), *QUICK], capsys, 1)
    assert "no space left on the disk" in err
    assert not list(run.glob("*.tmp")) and not list(run.glob(".*.tmp"))


def test_ctrl_c_says_where_the_last_checkpoint_is(tmp_path, capsys, standin, monkeypatch):
    import spikefuse.data as data

    load = data.load

    def interrupted_load(*a, **k):
        splits = load(*a, **k)
        inner, calls = splits.train.batches, []

        def batches(*b, **c):
            calls.append(1)
            for i, batch in enumerate(inner(*b, **c)):
                if len(calls) == 2 and i == 2:
                    raise KeyboardInterrupt  # Ctrl-C in the middle of epoch 2
                yield batch
        splits.train.batches = batches
        return splits
    monkeypatch.setattr(data, "load", interrupted_load)
    run = tmp_path / "r"
    err = failure(["train", "--dataset", "standin", "--out", str(run), "--epochs", "3", "--quiet"], capsys, 130)
    assert err == (f"spikefuse train: interrupted; last checkpoint at epoch 1 in {run}; "
                   f"continue with `spikefuse train --resume {run}`")


def test_second_run_on_a_directory_in_use_fails_at_once(tmp_path, capsys, standin):
    run = tmp_path / "r"
    run.mkdir()
    holder = subprocess.Popen(  # another process holding the run directory's lock, as a run does
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, str(os.getpid()).encode())\nprint('held', flush=True)\ntime.sleep(120)",
         str(run / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = failure(["train", "--dataset", "standin", "--out", str(run), *QUICK], capsys, 1)
        assert f"run directory {run} is in use by another run (process {holder.pid}" in err
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock, nothing stale is left
        holder.wait()
    assert main(["train", "--dataset", "standin", "--out", str(run), *QUICK]) == 0


def test_stale_temp_files_are_removed_at_the_next_start(tmp_path, capsys, standin):
    run = tmp_path / "r"
    assert main(["train", "--dataset", "standin", "--out", str(run), *QUICK, "--epochs", "2"]) == 0
    stale = [run / ".checkpoint.pt.k1ll3d.tmp", run / ".metrics.jsonl.tmp"]  # as a killed write leaves them
    for path in stale:
        path.write_bytes(b"half")
    other = run / ".notes.tmp"  # not ours: kept
    other.write_text("x")
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert not any(p.exists() for p in stale) and other.exists()


def test_diverged_training_stops_with_one_line_and_valid_json_metrics(tmp_path, capsys, standin, monkeypatch):
    import json

    from spikefuse.train import command

    build = command._build_model

    def nan_model(*a, **k):
        model = build(*a, **k)
        with torch.no_grad():
            model.layers[-1].bias.fill_(float("nan"))
        return model
    monkeypatch.setattr(command, "_build_model", nan_model)
    run = tmp_path / "r"
    assert main(["train", "--dataset", "standin", "--out", str(run), *QUICK]) == 1
    warning, err = capsys.readouterr().err.strip().splitlines()  # one line each
    # NaN weights give NaN spikes (never silent zeros), so the spike rate is not finite either
    assert warning == ("spikefuse train: warning: training diverged at epoch 1: train_loss, train_rate, "
                       "train_firing_rates.layers.2, train_firing_rates.layers.4 not finite, written as null")
    assert "training diverged: the training loss of epoch 1 is nan" in err and "--no-stop-on-nan" in err
    line = (run / "metrics.jsonl").read_text().splitlines()[0]
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert record["train_loss"] is None and record["epoch"] == 1
    assert not (run / "checkpoint.pt").exists()  # the diverged epoch is not checkpointed


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys, standin, monkeypatch):
    from spikefuse.train.loop import Trainer

    def boom(self):
        raise RuntimeError("something broke\nsecond line")
    monkeypatch.setattr(Trainer, "fit", boom)
    argv = ["train", "--dataset", "standin", *QUICK]
    err = failure([*argv, "--out", str(tmp_path / "a")], capsys, 1)
    assert err == "spikefuse train: error: RuntimeError: something broke (run with --debug for the traceback)"
    for debug in (["--debug", *argv], [*argv, "--debug"]):
        assert main([*debug, "--out", str(tmp_path / "b")]) == 1
        err = capsys.readouterr().err
        assert "Traceback" in err and err.strip().splitlines()[-1].startswith("spikefuse train: error: RuntimeError")


def test_sparse_needs_a_model_with_a_sparse_path(capsys):
    err = error_of(["train", "--sparse", "--model", "mlp", *QUICK], capsys)
    assert "--sparse: model 'mlp' has no sparse training path" in err and "ipu-shd" in err and "cifar" not in err
    err = error_of(["train", "--sparse", "--model", "ipu-shd", "--compile", *QUICK], capsys)
    assert "--sparse and --compile" in err and "drop --compile" in err


def test_sparse_training_runs_with_lazy_adam_and_resumes(tmp_path, capsys, standin, monkeypatch):
    """--sparse: the IPU network with sparse=True (its hidden LIFs cut per batch, the sparse
    Linear backward), the fluctuation-driven init, LazyAdam; the options and the model's
    arguments are saved, so --resume rebuilds the same model and optimizer."""
    from spikefuse import models
    from spikefuse.models.ipu import IPUNet
    from spikefuse.optim import LazyAdam
    from spikefuse.train import checkpoint, loop

    def tiny(input_shape, num_classes, time_steps=None, **kwargs):
        return IPUNet(input_shape, num_classes, hidden=(24, 20), **kwargs)
    tiny.sparse_training = True
    monkeypatch.setitem(models.MODELS, "ipu-tiny", (tiny, "a small IPUNet for tests"))
    built = []
    real_init = loop.Trainer.__init__

    def record(self, model, splits, optimizer, **kwargs):
        built.append((model, optimizer))
        real_init(self, model, splits, optimizer, **kwargs)
    monkeypatch.setattr(loop.Trainer, "__init__", record)

    out = tmp_path / "run"
    assert main(["train", "--dataset", "standin", "--model", "ipu-tiny", "--sparse", "--out", str(out),
                 "--epochs", "2", "--batch-size", "32", "--quiet"]) == 0
    assert "fluctuation-driven init for sparse training" in capsys.readouterr().out
    model, optimizer = built[0]
    assert isinstance(optimizer, LazyAdam) and isinstance(model, IPUNet)
    assert [m.grad_scope for m in model.modules() if hasattr(m, "grad_scope")] == ["batch", "batch"]
    # dispatch may have sent it dense after an epoch here (most outputs carry at this size)
    assert [m.backward_mode for m in model.modules() if hasattr(m, "carrying_share")] == ["auto"]
    state = checkpoint.load(out / "checkpoint.pt")
    assert state["config"]["options"]["sparse"] and state["config"]["model"]["kwargs"] == {"sparse": True}
    assert main(["train", "--resume", str(out), "--quiet"]) == 0  # the finished run: rebuilt and loaded
    assert isinstance(built[1][1], LazyAdam)
    assert "fluctuation-driven init" not in capsys.readouterr().out  # a resumed run keeps its weights


def test_an_empty_out_and_a_key_given_twice_are_refused(tmp_path, capsys, monkeypatch):
    """`--out ''` used to train into the default directory; a config setting both batch_size
    and batch-size used to take one of them silently."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--out", "", "--epochs", "1", "--quiet"]) == 2
    assert "out must name a directory" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    config = tmp_path / "c.toml"
    config.write_text("batch_size = 8\nbatch-size = 16\n")
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a second time" in err[0]
