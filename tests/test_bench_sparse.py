"""spikefuse bench sparse on the CPU: the fixed-activity mode does what it says, and the
smoke run writes its results (the figures themselves come from a GPU)."""
import json

import pytest
import torch

from spikefuse.bench import sparse as bench
from spikefuse.cli import main
from spikefuse.models.ipu import IPUNet
from spikefuse.nn import LIF
from spikefuse.nn.sparse_linear import SparseSpikingLinear
from helpers import DEVICE


@pytest.mark.parametrize("recurrent", [False, True])
def test_fixed_activity_fires_and_carries_exactly_the_chosen_share(recurrent):
    torch.manual_seed(0)
    model = IPUNet((30,), 4, hidden=(40, 50), sparse="sparse", recurrent=recurrent, backend="fused").to(DEVICE)
    bench.force_activity(model, 0.1, torch.Generator(device=DEVICE).manual_seed(2))
    rates = []
    hooks = [m.register_forward_hook(lambda m, i, o: rates.append(o.detach().mean(dim=(0, 1))))
             for m in model.modules() if type(m).__name__ in ("LIF", "RecurrentLIF")]
    x = (torch.rand(6, 3, 30, device=DEVICE) < 0.5).float()
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 2], device=DEVICE)).backward()
    for h in hooks:
        h.remove()
    for per_neuron, n in zip(rates, (40, 50)):  # the chosen neurons fire at every step, the rest never
        assert sorted(set(per_neuron.tolist())) == [0.0, 1.0] and int(per_neuron.sum()) == round(0.1 * n)
    if not recurrent:
        shares = [m.carrying_share() for m in model.modules() if isinstance(m, SparseSpikingLinear)]
        assert shares == [5 / 50]  # the layer feeding the second LIF: its chosen outputs carry gradient
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)  # gradient still reaches every layer


def test_the_map_preset_covers_the_grid():
    cases = bench.parse_cases("map")
    grid = {(w, b) for w in (1, 4, 16) for b in (1, 8, 48, 256)}
    assert {(w, b) for net, w, b, _ in cases if net == "ipu-shd"} == grid - {(16, 256)}
    assert {(w, b) for net, w, b, _ in cases if net == "ipu-shd-recurrent"} == {(w, b) for w, b in grid if w < 16}
    assert len(cases) == 19 and all(theta == 0.9 for *_, theta in cases)
    halves = bench.parse_cases("map-feedforward"), bench.parse_cases("map-recurrent")
    assert halves[0] + halves[1] == cases and {net for net, *_ in halves[1]} == {"ipu-shd-recurrent"}


def test_activity_list_is_checked():
    assert bench.parse_activities("natural, 0.01,0.1") == ["natural", 0.01, 0.1]
    for bad in ("0", "1.5", "dense", ""):
        with pytest.raises(ValueError, match="--activity"):
            bench.parse_activities(bad)


@pytest.mark.slow  # ~70 s on a CPU; the quick run below covers the CPU path
def test_smoke_run_writes_both_activities(tmp_path, capsys):
    code = main(["bench", "sparse", "--smoke", "--no-kernel", "--modes", "dense,sparse",
                 "--activity", "natural,0.1", "--out", str(tmp_path)])
    assert code == 0
    payload = json.loads(next(tmp_path.glob("sparse-smoke-*.json")).read_text())
    seen = {(r["net"], r["activity"], r["mode"]) for r in payload["cases"]}
    assert ("ipu-shd", 0.1, "sparse") in seen and ("ipu-shd-recurrent", "natural", "dense") in seen
    assert all("step_ms" in r for r in payload["cases"])
    assert "fixed 0.1" in capsys.readouterr().out
    markdown = next(tmp_path.glob("sparse-smoke-*.md")).read_text()
    assert "payload[" not in markdown and "learning rate 0 " in markdown


@pytest.mark.parametrize("argv,message", [
    (["--modes", "dense,bogus"], "--modes"), (["--activity", "2"], "--activity"),
    (["--cases", "ipu-shd:4:1"], "--cases"), (["--cases", "ipu-shd:4:0:0.9"], "--cases"),
    (["--cases", "nope:4:1:0.9"], "--cases")])
def test_bad_arguments_are_one_line_errors(argv, message, tmp_path, capsys):
    assert main(["bench", "sparse", "--out", str(tmp_path), *argv]) == 2  # checked before the device
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not list(tmp_path.iterdir())


@pytest.mark.gpu  # CUDA graphs
def test_captured_replays_the_call():
    from spikefuse.bench.timing import captured
    x = torch.randn(64, 64, device="cuda")
    out = torch.empty_like(x)
    replay, result = captured(lambda: torch.matmul(x, x, out=out))
    x.copy_(torch.eye(64, device="cuda"))
    replay()
    torch.cuda.synchronize()
    assert result is out and torch.equal(out, torch.eye(64, device="cuda"))


@pytest.mark.slow  # 15-17 s through the interpreter: the GPU test command runs it
def test_quick_run_on_the_cpu_is_named_and_marked_quick(tmp_path, monkeypatch):
    # dense only and no kernel comparison: the sparse modes' CPU path is the smoke test's above
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU path on a GPU machine too
    assert main(["bench", "sparse", "--quick", "--modes", "dense", "--no-kernel", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("sparse-*.json")
    assert path.name.startswith("sparse-quick-")
    payload = json.loads(path.read_text())
    assert payload["quick"] is True and {r["net"] for r in payload["cases"]} == {"ipu-shd", "ipu-shd-recurrent"}
    assert all("step_ms" in r for r in payload["cases"])
    assert path.with_suffix(".md").read_text().startswith("**Quick run (--quick)")


@pytest.mark.slow  # 15-17 s through the interpreter: the GPU test command runs it
def test_training_runs_quick_on_the_cpu(tmp_path, monkeypatch):
    """bench sparse --train (issue 32's harness): every run of a case starts from the same
    weights and records what the time-to-accuracy figures are read from."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "sparse", "--train", "--quick", "--max-rate", "0.05", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("sparse-train-quick-*.json")  # named after the machine's GPU on a GPU host
    payload = json.loads(path.read_text())
    assert payload["quick"] is True and payload["recipe"]["max_rate"] == 0.05
    runs = payload["runs"]
    assert {r["run"] for r in runs} == {"dense", "sparse", "dense-lazyadam", "dense-free"}
    assert {r["regularised"] for r in runs if r["run"] != "dense-free"} == {True}
    for r in runs:
        assert [e["epoch"] for e in r["epochs"]] == [1, 2]
        assert all(e["epoch_time_s"] >= e["train_time_s"] > 0 for e in r["epochs"])
        assert all(len(e["train_firing_rates"]) == 2 for e in r["epochs"])  # both hidden layers
        # the sparse network's dispatched layers (sparse Linears, recurrent LIFs) report every epoch
        assert all(bool(e.get("sparse_layers")) == (r["run"] == "sparse") for e in r["epochs"])
    sparse = [r for r in runs if r["run"] == "sparse"]
    assert all(set(v["backward"] for e in r["epochs"] for v in e["sparse_layers"].values()) <= {"sparse", "dense"}
               for r in sparse)
    for s in payload["summary"]:  # the target is the dense run's best minus the margin
        dense = next(r for r in runs if r["run"] == "dense" and r["task"] == s["task"] and r["seed"] == s["seed"])
        assert s["target"] == pytest.approx(max(e["test_acc"] for e in dense["epochs"]) - 0.01)
        assert s["run"] != "dense" or s["speedup"] == 1.0
    assert path.with_suffix(".md").read_text().startswith("**Quick run (--quick)")


def test_time_to_target_counts_set_up_and_whole_epochs():
    from spikefuse.bench.sparse_train import time_to
    row = {"setup_s": 1.0, "epochs": [{"epoch_time_s": 2.0, "test_acc": 0.5},
                                      {"epoch_time_s": 3.0, "test_acc": 0.8},
                                      {"epoch_time_s": 4.0, "test_acc": 0.9}]}
    assert time_to(row, 0.8) == 6.0 and time_to(row, 0.5) == 3.0 and time_to(row, 0.95) is None


def test_bad_training_cases_are_refused_by_name(tmp_path):
    assert main(["bench", "sparse", "--train", "--cases", "nosuch:ff:4:8", "--out", str(tmp_path)]) == 2
    assert main(["bench", "sparse", "--train", "--cases", "randman:ff:4", "--out", str(tmp_path)]) == 2
    assert main(["bench", "sparse", "--train", "--quick", "--runs", "sparse", "--out", str(tmp_path)]) == 2
