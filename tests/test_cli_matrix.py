"""The command line a user types, on CUDA: every model of `spikefuse train --help` in every
mode (captured, --no-capture, --compile, bf16, fp16, --sparse where the model has it), resumed
after an interruption, exported to NIR; `--gpus 2`; each `spikefuse bench` part's quick mode
and `spikefuse plan`.

A run passes when it exits 0 with complete metrics and nothing on stderr but spikefuse's own
one-line messages (no traceback, no raw library warning), or, for a combination listed in
spikefuse.refusals, exits 2 with that one line. Each run is its own process, as a user's is;
they are independent, so `pytest -n N` spreads them over the GPU.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from spikefuse import refusals
from spikefuse.models import MODELS, trains_sparse

# model -> (data set, extra options): the smallest runs that still exercise the whole path
RUNS = {
    "mlp": ("digits", []),
    "deep-lif": ("digits", ["--time-steps", "8"]),
    "shd": ("shd-synthetic", ["--time-steps", "20"]),
    **dict.fromkeys(("cifar-small", "cifar-medium", "cifar-large", "resnet18", "resnet34"),
                    ("cifar-synthetic", ["--time-steps", "2"])),
    "dvs-gesture": ("dvsgesture-synthetic", ["--time-steps", "4"]),
    **dict.fromkeys(("ipu-shd", "ipu-shd-recurrent"), ("shd-synthetic", ["--time-steps", "20"])),
    **dict.fromkeys(("ipu-nmnist", "ipu-nmnist-recurrent"), ("nmnist-synthetic", ["--time-steps", "10"])),
    **dict.fromkeys(("ipu-dvsgesture", "ipu-dvsgesture-recurrent"), ("dvsgesture-synthetic", ["--time-steps", "4"])),
}
MODES = {
    "captured": [],
    "no-capture": ["--no-capture"],
    "compile": ["--compile"],
    "bf16": ["--precision", "bf16"],
    "fp16": ["--precision", "fp16"],
    "sparse": ["--sparse"],
}
METRICS = ("epoch", "lr", "train_loss", "train_acc", "train_rate", "samples_per_s", "train_time_s",
           "test_loss", "test_acc", "test_rate", "firing_rates")


def test_every_model_has_a_run():  # on every machine: a new model must join the matrix
    assert set(RUNS) == set(MODELS)


def spikefuse(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spikefuse.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the user's path: kernels compiled on the GPU
    # NVLink multicast stays off (it can take a shared host's GPUs down)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    return env


def assert_clean(result: subprocess.CompletedProcess, what: str):
    """Exit 0, and stderr holds only spikefuse's own one-line messages."""
    foreign = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("spikefuse")]
    assert result.returncode == 0 and not foreign, (
        f"{what}: exit {result.returncode}\n--- stderr ---\n{result.stderr[-4000:]}\n--- stdout ---\n"
        f"{result.stdout[-2000:]}")


def assert_refused(result: subprocess.CompletedProcess, reason: str, what: str):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and reason in lines[0], (
        f"{what}: expected exit 2 and one line naming {reason!r}; got exit {result.returncode}\n{result.stderr[-3000:]}")


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_complete(records: list[dict], epochs: int, what: str):
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1)), what
    for r in records:
        missing = [k for k in METRICS if k not in r]
        assert not missing, f"{what}: metrics lack {missing}"
        numbers = [r[k] for k in METRICS if k != "firing_rates"]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers), f"{what}: {r}"
        assert r["firing_rates"] and all(math.isfinite(v) for v in r["firing_rates"].values()), f"{what}: {r}"


def train_argv(model: str, run_dir, *extra: str) -> list[str]:
    dataset, options = RUNS[model]
    return ["train", "--model", model, "--dataset", dataset, *options, "--batch-size", "32", "--quiet",
            "--out", str(run_dir), *extra]


def _cases():
    for model in RUNS:
        for mode in MODES:
            if mode != "sparse" or trains_sparse(model):
                yield pytest.param(model, mode, id=f"{model}-{mode}")


@pytest.mark.gpu
@pytest.mark.parametrize("model, mode", list(_cases()))
def test_train(model, mode, tmp_path):
    run_dir = tmp_path / "run"
    argv = train_argv(model, run_dir, "--epochs", "1", *MODES[mode])
    result = spikefuse(*argv)
    what = f"spikefuse {' '.join(argv)}"
    assert_clean(result, what)
    assert_complete(read_metrics(run_dir), 1, what)
    if mode == "captured":  # the trained run, exported
        export = spikefuse("export", "--nir", str(run_dir), "--out", str(tmp_path / "model.nir"))
        what = f"spikefuse export --nir ({model})"
        if model in refusals.NIR_EXPORT:
            assert_refused(export, refusals.NIR_EXPORT[model], what)
        else:
            assert_clean(export, what)
            assert (tmp_path / "model.nir").stat().st_size > 0


@pytest.mark.gpu
def test_sparse_compile_is_refused(tmp_path):
    result = spikefuse(*train_argv("ipu-shd", tmp_path / "run", "--epochs", "1", "--sparse", "--compile"))
    assert_refused(result, refusals.SPARSE_COMPILE, "train --sparse --compile")


def interrupted_after_first_epoch(argv: list[str], run_dir) -> subprocess.CompletedProcess:
    """Start a run, Ctrl-C it once its first epoch is recorded (metrics.jsonl is written after
    the checkpoint); the finished process."""
    process = subprocess.Popen([sys.executable, "-m", "spikefuse.cli", *argv], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=_env())
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.stat().st_size) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(RUNS))
def test_resume_after_interruption(model, tmp_path):
    run_dir = tmp_path / "run"
    sparse = ["--sparse"] if trains_sparse(model) else []
    first = interrupted_after_first_epoch(train_argv(model, run_dir, "--epochs", "3", *sparse), run_dir)
    assert first.returncode == 130, f"{model}: expected the Ctrl-C exit 130, got {first.returncode}\n{first.stderr[-3000:]}"
    assert "--resume" in first.stderr
    done = len(read_metrics(run_dir))
    assert 1 <= done < 3
    resumed = spikefuse("train", "--resume", str(run_dir), "--quiet")
    assert_clean(resumed, f"spikefuse train --resume ({model})")
    assert_complete(read_metrics(run_dir), 3, f"{model} resumed after {done} epochs")


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("model, extra", [("mlp", []), ("shd", []), ("cifar-small", []),
                                          ("ipu-shd", ["--sparse"])], ids=["mlp", "shd", "cifar-small", "ipu-shd-sparse"])
def test_two_gpus(model, extra, tmp_path):
    run_dir = tmp_path / "run"
    result = spikefuse(*train_argv(model, run_dir, "--epochs", "2", "--gpus", "2", *extra))
    assert_clean(result, f"train --gpus 2 --model {model} {' '.join(extra)}")
    assert_complete(read_metrics(run_dir), 2, f"{model} on 2 GPUs")


BENCH_PARTS = ("lif", "train", "steps", "sparse", "data", "neurons", "on")


@pytest.mark.gpu
@pytest.mark.parametrize("part", BENCH_PARTS)
def test_bench_quick(part, tmp_path):
    result = spikefuse("bench", part, "--quick", "--out", str(tmp_path))
    assert_clean(result, f"spikefuse bench {part} --quick")
    assert any(tmp_path.iterdir()), f"bench {part} --quick wrote nothing"


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_bench_parallel_quick(tmp_path):
    result = spikefuse("bench", "parallel", "--quick", "--out", str(tmp_path))
    assert_clean(result, "spikefuse bench parallel --quick")


@pytest.mark.gpu
def test_plan():
    result = spikefuse("plan", "--model", "deep-lif", "--time-steps", "256", "--batch", "4")
    assert_clean(result, "spikefuse plan")
    assert result.stdout.startswith("temporal pipeline plan: deep-lif, T=256, B=4")
