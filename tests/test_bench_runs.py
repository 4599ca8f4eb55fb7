"""`spikefuse bench runs` (issue 38): whole training runs of the same network in spikefuse,
SpikingJelly, snnTorch and Norse, timed to a common test accuracy. On the CPU the harness runs
at --quick sizes (the flow, not the timings): every library present runs or is reported
skipped with its reason, the cross-check of equations is recorded, and the target and times
to it follow the issue's rule."""
from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import one_thread  # noqa: F401  (the fixture)
from spikefuse import cli
from spikefuse.bench import all as bench_all
from spikefuse.bench import runs, runs_peers
from spikefuse.bench.report import QUICK_NOTE

pytestmark = pytest.mark.usefixtures("one_thread")  # small per-step ops: one CPU thread, as the CLI


def quick_payload(out):
    (path,) = out.glob("runs-quick-*.json")
    assert not [p for p in out.glob("runs-*.json") if p != path]  # never a full run's name
    assert path.with_suffix(".md").read_text().startswith(f"**{QUICK_NOTE}")
    return path, json.loads(path.read_text())


def test_every_task_runs_quick_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the synthetic SHD events' disk cache
    out = tmp_path / "r"
    assert cli.main(["bench", "runs", "--quick", "--device", "cpu", "--out", str(out)]) == 0
    path, payload = quick_payload(out)
    assert payload["quick"] is True and payload["benchmark"] == "runs" and payload["recipe"]["epochs"] == 2
    assert [t["task"] for t in payload["tasks"]] == list(runs.TASKS)
    cache = payload["triton_cache"]  # what a reader needs to tell a cold first epoch from a warm one
    assert cache["state"] == ("warm" if cache["entries_at_start"] else "cold")
    for task in payload["tasks"]:
        by_library = {r["run"]: r for r in task["runs"]}
        assert list(by_library) == list(runs.LIBRARIES)
        for name, row in by_library.items():
            installed = name == "spikefuse" or importlib.util.find_spec(name) is not None
            if not installed:
                assert row["status"] == "skipped" and "not installed" in row["reason"]
                continue
            assert row["status"] == "ran", row
            walls = [e["wall_s"] for e in row["epochs"]]
            assert len(walls) == 2 and 0 < walls[0] < walls[1] and row["stopped_by"] == "epochs"
            assert all(e["peak_mib"] is None for e in row["epochs"])  # no GPU: no peak memory
            if name != "spikefuse":  # the same equations and weights: the same spikes and gradients
                check = task["cross_check"][name]  # in float64; snnTorch's spikes and Norse's constants are float32
                assert check["spikes_equal"] and check["passed"], check
                assert max(check["grad_rel_err"].values()) < 1e-6
                # the same batches, weights and equations: the first epoch's loss is spikefuse's, to float32
                # rounding; with convolutions looser (an H100 host's CPU put a peer 2.7e-3 off, likely CPU
                # convolutions rounding otherwise and a flipped spike carrying it into the later steps)
                rel = 1e-2 if "cifar" in task["task"] else 1e-5
                assert row["epochs"][0]["train_loss"] == pytest.approx(by_library["spikefuse"]["epochs"][0]["train_loss"],
                                                                       rel=rel)
        summary = task["summary"]
        ranked = [n for n, e in summary["libraries"].items() if e["ranked"]]
        finals = [by_library[n]["epochs"][-1]["test_acc"] for n in ranked]
        assert summary["target"] == pytest.approx(min(finals) - 0.01)
        assert set(summary["ranking"]) == set(ranked)  # the lowest final accuracy is reached by its own run
        assert len(task["neurons"]) >= 1 and all(n["threshold"] > 0 for n in task["neurons"])
    if importlib.util.find_spec("matplotlib"):
        assert sorted(p.name for p in out.glob("runs-quick-*.png")) == sorted(
            f"{path.stem}-{t.replace(':', '-')}.png" for t in runs.TASKS)


def test_each_library_in_its_own_process_trains_as_in_one(tmp_path, monkeypatch):
    """--isolation process (the default on CUDA): each run in a fresh process, from the same
    initial weights and batches; its row comes back whole, and a process that fails is a row."""
    pytest.importorskip("norse")
    monkeypatch.setenv("HOME", str(tmp_path))
    caches, run_process = [], runs.subprocess.run

    def recording(command, **kwargs):  # the Triton cache each library's process is given
        caches.append((kwargs.get("env") or {}).get("TRITON_CACHE_DIR"))
        return run_process(command, **kwargs)
    monkeypatch.setattr(runs.subprocess, "run", recording)
    assert cli.main(["bench", "runs", "--quick", "--tasks", "randman:mlp", "--libraries", "spikefuse,norse",
                     "--isolation", "process", "--triton-cache-per-task", str(tmp_path / "tc"),
                     "--out", str(tmp_path)]) == 0
    _, payload = quick_payload(tmp_path)
    assert payload["recipe"]["isolation"] == "process"
    (task,) = payload["tasks"]
    own = str(tmp_path / "tc" / "randman-mlp")  # the task's own cache, new: cold
    assert caches == [own, own] and task["triton_cache"]["dir"] == own and task["triton_cache"]["state"] == "cold"
    ours, norse = task["runs"]
    assert [ours["status"], norse["status"]] == ["ran", "ran"] and len(ours["epochs"]) == 2
    assert ours["implementation"].startswith("Trainer.fit") and norse["implementation"].startswith("Norse")
    assert norse["epochs"][0]["train_loss"] == pytest.approx(ours["epochs"][0]["train_loss"], rel=1e-5)
    assert task["cross_check"]["norse"]["passed"]

    args = runs.argparse.Namespace(seed=0, time_cap=1.0)  # no --quick, --epochs...: the worker fails
    row = runs.run_isolated(runs.Setting("randman:mlp", None, {}, {}, 16, args, runs.torch.device("cpu"), "eager"),
                            "norse")
    assert row["run"] == "norse" and row["status"] == "failed" and "exit code 1" in row["error"]


def test_a_peer_that_does_not_import_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(runs.PEER_MODULES, "norse", "no_such_module_for_bench_runs")
    assert cli.main(["bench", "runs", "--quick", "--tasks", "randman:mlp", "--libraries", "spikefuse,norse",
                     "--out", str(tmp_path)]) == 0
    _, payload = quick_payload(tmp_path)
    assert "no_such_module_for_bench_runs" in payload["skipped_libraries"]["norse"]
    (task,) = payload["tasks"]
    assert [(r["run"], r["status"]) for r in task["runs"]] == [("spikefuse", "ran"), ("norse", "skipped")]
    assert task["summary"]["libraries"]["norse"]["ranked"] is False
    assert "not installed" in next(tmp_path.glob("runs-quick-*.md")).read_text()


def test_a_peer_with_other_equations_is_reported_and_not_ranked(tmp_path, monkeypatch):
    pytest.importorskip("snntorch")
    original = runs_peers.SnnTorchLIF.__init__

    def wrong_threshold(self, decay, threshold, detach_reset):  # a peer set up with another threshold
        original(self, decay, threshold * 0.5, detach_reset)
    monkeypatch.setattr(runs_peers.SnnTorchLIF, "__init__", wrong_threshold)
    assert cli.main(["bench", "runs", "--quick", "--tasks", "randman:mlp", "--libraries", "snntorch",
                     "--out", str(tmp_path)]) == 0
    _, payload = quick_payload(tmp_path)
    (task,) = payload["tasks"]
    check, entry = task["cross_check"]["snntorch"], task["summary"]["libraries"]["snntorch"]
    assert check["passed"] is False and not check["spikes_equal"]
    assert entry["ranked"] is False and "cross-check failed" in entry["why_not_ranked"]
    assert task["summary"]["ranking"] == ["spikefuse"]


def curve(name, accuracies, setup=1.0, epoch=2.0, status="ran"):
    """A run's row as bench runs records it: epoch i ends at setup + i * epoch seconds."""
    return {"run": name, "status": status, "setup_s": setup, "stopped_by": "epochs",
            "epochs": [{"epoch": i + 1, "epoch_time_s": epoch, "wall_s": setup + (i + 1) * epoch,
                        "test_acc": a, "peak_mib": None} for i, a in enumerate(accuracies)]}


def test_target_and_time_to_target_on_synthetic_curves():
    rows = [curve("spikefuse", [0.60, 0.80, 0.90], setup=2.0, epoch=1.0),
            curve("spikingjelly", [0.50, 0.70, 0.85], setup=1.0, epoch=3.0),
            curve("snntorch", [0.40, 0.75], setup=0.5, epoch=10.0),  # stopped by the time cap: the lowest final
            curve("norse", [0.10, 0.20, 0.30]),  # its cross-check failed: not ranked, not in the target
            {"run": "extra", "status": "failed", "error": "RuntimeError: out of memory", "epochs": []}]
    checks = {"spikingjelly": {"passed": True}, "snntorch": {"passed": True}, "norse": {"passed": False}}
    summary = runs.summarise(rows, checks, margin_points=1.0)
    assert summary["target"] == pytest.approx(0.74)  # min(0.90, 0.85, 0.75) - 1 point
    libraries = summary["libraries"]
    assert libraries["spikefuse"]["time_to_target_s"] == 4.0  # 2 s set-up + 2 epochs (0.80 >= 0.74)
    assert libraries["spikingjelly"]["time_to_target_s"] == 10.0  # 1 + 3 epochs of 3 s (0.85)
    assert libraries["snntorch"]["time_to_target_s"] == 20.5  # its last epoch
    assert libraries["spikingjelly"]["x_spikefuse"] == pytest.approx(2.5)
    assert summary["ranking"] == ["spikefuse", "spikingjelly", "snntorch"]
    assert libraries["norse"]["ranked"] is False and libraries["norse"]["time_to_target_s"] is None
    assert summary["not_reached"] == ["norse"] and "cross-check failed" in libraries["norse"]["why_not_ranked"]
    assert libraries["extra"] == {"status": "failed", "ranked": False, "why_not_ranked": "RuntimeError: out of memory"}
    assert runs.target_of([], 1.0) is None
    assert runs.summarise([rows[-1]], {}, 1.0)["target"] is None  # nothing ran: no target, nothing ranked


def seeded(seed, times, target=0.9):
    """One seed's result of a task as bench runs records it: library -> time to target (None:
    not reached; "unranked": its cross-check failed)."""
    libraries = {n: {"ranked": t != "unranked", "time_to_target_s": None if t == "unranked" else t}
                 for n, t in times.items()}
    return {"task": "t", "seed": seed, "summary": {"target": target, "libraries": libraries}}


def test_under_seeds_each_library_is_ranked_by_its_median_time_to_target():
    results = [seeded(0, {"spikefuse": 5.0, "spikingjelly": 4.0, "norse": None}),  # one seed's crossing decides
               seeded(1, {"spikefuse": 3.0, "spikingjelly": 4.5, "norse": 20.0}),
               seeded(2, {"spikefuse": 3.5, "spikingjelly": 4.2, "norse": "unranked"})]
    (median,) = runs.medians(results).values()
    libraries = median["libraries"]
    assert median["seeds"] == [0, 1, 2] and median["targets"] == [0.9] * 3
    assert libraries["spikefuse"] == {"times_s": [5.0, 3.0, 3.5], "median_s": 3.5, "x_spikefuse": 1.0}
    assert libraries["spikingjelly"]["median_s"] == 4.2
    assert libraries["spikingjelly"]["x_spikefuse"] == pytest.approx(1.2)
    # not reached at one seed and not ranked at another: never, at most seeds
    assert libraries["norse"]["times_s"] == [None, 20.0, None] and libraries["norse"]["median_s"] is None
    assert median["ranking"] == ["spikefuse", "spikingjelly"]
    assert "spikefuse 3.50 s, spikingjelly 4.20 s; not reached at most seeds: norse" in runs.median_line("t", median)


def test_seeds_run_each_task_again_and_lead_the_results_with_the_medians(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    out = tmp_path / "r"
    assert cli.main(["bench", "runs", "--quick", "--device", "cpu", "--tasks", "randman:mlp", "--libraries",
                     "spikefuse", "--seed", "3", "--seeds", "2", "--out", str(out)]) == 0
    path, payload = quick_payload(out)
    assert [(t["task"], t["seed"]) for t in payload["tasks"]] == [("randman:mlp", 3), ("randman:mlp", 4)]
    assert payload["recipe"]["seeds"] == [3, 4]
    first, second = ([e["train_loss"] for e in t["runs"][0]["epochs"]] for t in payload["tasks"])
    assert first != second  # other initial weights and data order
    median = payload["medians"]["randman:mlp"]
    assert median["seeds"] == [3, 4] and median["ranking"] == ["spikefuse"]
    text = path.with_suffix(".md").read_text()
    assert text.index("## Median time to target over the seeds") < text.index("## randman:mlp, seed 3")
    assert cli.main(["bench", "runs", "--quick", "--seeds", "0", "--out", str(out)]) == 2


def test_each_task_has_its_own_triton_cache_where_its_runs_have_their_own_processes(tmp_path):
    cpu, cuda = runs.torch.device("cpu"), runs.torch.device("cuda")

    def resolved(given, isolation="auto", device=cuda):
        return runs.task_caches_of(runs.argparse.Namespace(triton_cache_per_task=given, isolation=isolation), device)
    assert resolved(None) == runs.os.path.expanduser(runs.TASK_CACHES)  # CUDA: a process per run, caches kept
    assert resolved(str(tmp_path)) == str(tmp_path) and resolved("shared") is None
    assert resolved(None, device=cpu) is None and resolved("shared", "none") is None  # one process: its cache
    with pytest.raises(runs.UsageError, match="--triton-cache-per-task needs --isolation process"):
        resolved(str(tmp_path), "none")


def test_without_a_gpu_the_full_run_is_refused_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runs.torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "runs", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device (or --quick" in capsys.readouterr().err
    assert cli.main(["bench", "runs", "--quick", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cuda: no CUDA device" in capsys.readouterr().err
    assert cli.main(["bench", "runs", "--quick", "--isolation", "none", "--triton-cache-per-task", str(tmp_path / "tc"),
                     "--out", str(tmp_path)]) == 2
    assert "--triton-cache-per-task needs --isolation process" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    # `bench all` runs it: on the CPU only with --quick, and says why otherwise
    assert "runs" in bench_all.parts() and bench_all.why_not("runs", quick=True) is None
    assert "--quick" in bench_all.why_not("runs")
