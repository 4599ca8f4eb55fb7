"""`spikefuse bench parallel` on the CPU: the pipeline part run for real on 2 gloo processes
(through torch's launcher, as on GPUs); the order of the runs and the usage errors with the
launcher replaced (no GPUs here)."""
import json
import subprocess

import pytest
import torch

from spikefuse import cli
from spikefuse.bench import parallel, parallel_ddp


@pytest.mark.slow  # ~30 s on a 2-core CPU (torchrun, two processes importing torch); test_pipeline checks the sums
def test_pipeline_on_two_cpu_processes_matches_one_process_exactly(tmp_path, capfd):
    out = tmp_path / "results"
    assert cli.main(["bench", "parallel", "--parts", "pipeline", "--device", "cpu", "--gpus", "2",
                     "--width", "0.005", "--time-steps", "8", "--chunks", "2", "--out", str(out)]) == 0
    (path,) = out.glob("pipeline-*.json")  # pipeline-cpu.json where the CPU has no name
    assert path.with_suffix(".md").exists()
    payload = json.loads(path.read_text())
    assert payload["gpus"] == 2 and payload["width"] == 0.005
    assert payload["exactness"]["max_relative_grad_error_vs_chunked"] == 0  # the same sums, in the same order
    (result,) = payload["results"]
    assert result["T"] == 8 and 2 in {run["chunks"] for run in result["pipeline"]}
    assert capfd.readouterr().out.count("wrote ") == 2  # rank 0 writes, once


@pytest.fixture
def gpus(monkeypatch):
    """A machine with `count` CUDA GPUs, whose launcher only records what it is asked to run."""
    launched = []
    # every bench module imported first, on the real (CPU) torch: some launch set-up code at
    # import (ops.launch), which a faked CUDA breaks; alone, this file failed on that
    cli.build_parser(["bench"])

    def machine(count: int):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(parallel, "launch", lambda n, module, argv: launched.append((n, module, argv)) or 0)
        monkeypatch.setattr(parallel_ddp, "main", lambda argv: launched.append(("merge", argv)) or 0)
        return launched
    return machine


def test_ddp_runs_one_process_then_all_then_the_merge(gpus):
    launched = gpus(4)
    assert cli.main(["bench", "parallel", "--out", "R", "--time-steps", "256", "--width", "0.5"]) == 0
    assert launched == [(1, "spikefuse.bench.parallel_ddp", ["--out", "R"]),
                        (4, "spikefuse.bench.parallel_ddp", ["--out", "R"]),
                        ("merge", ["--merge", "--out", "R"]),
                        (4, "spikefuse.bench.parallel_pipeline",
                         ["--out", "R", "--device", "cuda", "--time-steps", "256", "--width", "0.5"])]


def test_a_failed_run_is_one_line_and_exit_code_1(monkeypatch, capsys):
    envs = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda command, env: envs.append(env) or subprocess.CompletedProcess(command, 1))
    assert cli.main(["bench", "parallel", "--parts", "pipeline", "--device", "cpu", "--gpus", "2"]) == 1
    err = capsys.readouterr().err
    assert err == "spikefuse bench: error: the pipeline failed; the output above says why\n"
    assert envs[0]["OMP_NUM_THREADS"] == "1"  # set for torchrun, which would print a banner setting it


@pytest.mark.parametrize("machine, argv, expected", [
    (0, ["--parts", "ddp", "--device", "cpu", "--gpus", "2"], "the ddp part needs CUDA GPUs"),
    (0, ["--parts", "pipeline", "--device", "cpu", "--gpus", "1"],
     "--gpus 1: the pipeline part needs 2 or more processes"),
    (0, ["--parts", "pipeline", "--device", "cpu"], "the pipeline part needs --gpus 2 or more on the CPU"),
    (1, ["--parts", "pipeline"], "the pipeline part needs 2 or more CUDA GPUs (one stage on each process); "
                                 "this machine has 1"),
    (1, ["--parts", "ddp"], "the ddp part needs 2 or more CUDA GPUs (it compares 1 GPU with N); this machine has 1"),
    (4, ["--gpus", "1"], "--gpus 1: the pipeline part needs 2 or more processes"),
    (2, ["--gpus", "3"], "--gpus 3: this machine has 2 CUDA GPUs"),
    (0, ["--parts", "pipeline", "--gpus", "2"], "--gpus 2: this machine has 0 CUDA GPUs"),
    (2, ["--parts", "ddp,nccl"], "--parts ddp,nccl: pick from ddp, pipeline"),
    (2, ["--parts", "pipeline", "--time-steps", "0"], "--time-steps: expected whole numbers >= 1, got 0"),
    (2, ["--parts", "pipeline", "--chunks", "4", "-1"], "--chunks: expected whole numbers >= 1, got 4 -1"),
    (2, ["--parts", "pipeline", "--width", "0"], "--width: expected a number > 0, got 0.0"),
])
def test_usage_errors_are_one_line_before_anything_runs(gpus, machine, argv, expected, capsys):
    launched = gpus(machine)
    assert cli.main(["bench", "parallel", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert not launched


@pytest.mark.slow  # ~30 s on a CPU: the pipeline's run above, with --quick
def test_quick_pipeline_on_two_cpu_processes_is_named_and_marked_quick(tmp_path, capfd):
    out = tmp_path / "results"
    assert cli.main(["bench", "parallel", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    assert "ddp: skipped, it needs 2 or more CUDA GPUs" in capfd.readouterr().out
    (path,) = out.glob("pipeline-*.json")
    assert path.name.startswith("pipeline-quick-") and path.with_suffix(".md").read_text().startswith("**Quick run")
    payload = json.loads(path.read_text())
    assert payload["quick"] is True and payload["gpus"] == 2 and [r["T"] for r in payload["results"]] == [4]


def test_quick_passes_quick_to_every_run_on_two_gpus(monkeypatch):
    launched = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(parallel, "launch", lambda n, module, argv: launched.append((n, module, argv)) or 0)
    monkeypatch.setattr(parallel_ddp, "main", lambda argv: launched.append(("merge", argv)) or 0)
    assert cli.main(["bench", "parallel", "--quick", "--out", "R"]) == 0
    assert launched == [(1, "spikefuse.bench.parallel_ddp", ["--out", "R", "--quick"]),
                        (2, "spikefuse.bench.parallel_ddp", ["--out", "R", "--quick"]),  # 2 of the 4 GPUs
                        ("merge", ["--merge", "--out", "R", "--quick"]),
                        (2, "spikefuse.bench.parallel_pipeline", ["--out", "R", "--device", "cuda", "--quick"])]


def test_quick_ddp_merge_reads_quick_runs_only(tmp_path):
    def run_file(name, gpus, quick, ms):
        case = {"mode": "captured", "precision": "fp32", "gpus": gpus, "step_ms": ms,
                "samples_per_s": gpus * 8 / ms * 1e3, "captured": True}
        payload = {"gpus": gpus, "environment": {"device": "cpu", "date": "-", "versions": {}},
                   "cases": [case], "capture_check": None, "quick": quick, "batch_per_gpu": 8, "time_steps": 4}
        (tmp_path / name).write_text(json.dumps(payload))
    run_file("ddp-1gpu-quick.json", 1, True, 2.0)
    run_file("ddp-2gpu-quick.json", 2, True, 2.5)
    run_file("ddp-1gpu.json", 1, False, 99.0)  # a full run's: left alone
    assert parallel_ddp.main(["--merge", "--quick", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("ddp-scaling-*.json")
    payload = json.loads(path.read_text())
    assert path.name.startswith("ddp-scaling-quick-") and payload["quick"] is True
    assert payload["results"][0]["step_ms_1gpu"] == 2.0 and payload["time_steps"] == 4
