"""`spikefuse bench steps` on the CPU: the reduce-overhead-whole mode (the whole training step
compiled as one function with compiled autograd) measured through the benchmark's own
path, and its failure recorded in its row instead of stopping the run. The benchmark needs
a GPU and the spikefuse networks' Triton kernels cannot go through inductor on a CPU, so a
tiny plain-PyTorch network stands in (on a CPU, reduce-overhead runs without CUDA graphs)."""
import argparse

import pytest
import torch
from torch import nn

from spikefuse.bench import steps


class TinyNet(nn.Module):  # [T, B, 8] -> [B, 3], like the IPU networks' time-averaged readout
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x).mean(0)


def cpu_prepare(optimizer):  # prepare_optimizer wants CUDA: keep its tensor learning rate
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]))


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(steps, "prepare_optimizer", cpu_prepare)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    torch.manual_seed(0)
    args = argparse.Namespace(smoke=True, width=1.0, shapes=(2, (8,)), num_classes=3)
    return lambda mode: steps.measure("ipu-shd", "fp32", 2, "adam", mode, args, torch.device("cpu"), TinyNet())


def test_whole_step_mode_runs_and_counts_its_graphs(on_cpu):
    assert "reduce-overhead-whole" in steps.MODES
    case = on_cpu("reduce-overhead-whole")
    assert "error" not in case, case.get("error")
    assert case["step_ms"] > 0 and case["loss"] > 0
    # forward + loss, the backward from compiled autograd, the optimizer step (its own graph)
    assert case["autograd_graphs"] >= 1 and case["graphs"] >= 2
    note = steps.markdown({"environment": {"device": "cpu", "date": "-", "versions": "-"},
                           "timing": "-", "input_density": 0.05, "cases": [case]})
    assert f"dynamo graphs: {case['graphs']} ({case['autograd_graphs']} by compiled autograd)" in note
    assert not torch._dynamo.config.compiled_autograd  # scoped to the mode's torch.compile


def test_whole_step_matches_eager_steps():
    torch.manual_seed(0)
    models = [TinyNet(), TinyNet()]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [steps.make_optimizer("adam", m.parameters()) for m in models]
    for optimizer in optimizers:
        cpu_prepare(optimizer)
    eager = steps.step_function(models[0], models[0], optimizers[0], "fp32")
    whole = steps.whole_step(steps.step_function(models[1], models[1], optimizers[1], "fp32"))
    x, y = torch.randn(2, 4, 8), torch.randint(0, 3, (4,))
    for _ in range(3):
        assert float(whole(x, y).detach()) == pytest.approx(float(eager(x, y).detach()), rel=1e-5)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b)


def test_whole_step_failure_is_a_note_not_a_crash(on_cpu, monkeypatch):
    def unavailable(*args, **kwargs):
        raise RuntimeError("compiled autograd unavailable")
    monkeypatch.setattr(torch._dynamo.compiled_autograd, "_enable", unavailable)
    case = on_cpu("reduce-overhead-whole")
    assert case["error"] == "RuntimeError: compiled autograd unavailable"
    assert "skipped (RuntimeError: compiled autograd unavailable)" in steps.summary_line(case)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal")
def test_quick_on_the_cpu_is_refused_in_one_line(tmp_path, capsys):
    from spikefuse import cli
    assert cli.main(["bench", "steps", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "needs a CUDA device" in err and not list(tmp_path.iterdir())


def test_quick_shrinks_only_the_lists_left_at_their_defaults():
    parser = argparse.ArgumentParser()
    steps.configure(parser)
    args = parser.parse_args(["--quick", "--modes", "eager"])
    steps.quick_settings(args)
    assert args.smoke and args.nets == steps.QUICK["nets"] and args.batches == steps.QUICK["batches"]
    assert args.modes == "eager"  # given: kept


def test_floor_counts_every_neuron_step_and_the_products():
    """bench.roofline on a narrow IPU net: neuron-steps = T x B x (its two hidden widths);
    FLOPs = forward and backward matmuls (the first layer's input takes no gradient)."""
    from spikefuse.bench import roofline
    from spikefuse.models import build_model
    torch.manual_seed(0)
    T, B = 5, 3
    model = build_model("ipu-shd", (700,), 20, T, width=1 / 16, backend="reference")
    hidden = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)][:2]
    x = (torch.rand(T, B, 700) < 0.05).float()
    assert roofline.neuron_steps(model, x) == T * B * sum(hidden)
    step = steps.step_function(model, model, steps.make_optimizer("adam", model.parameters()), "fp32")
    widths = [700, *hidden, 20]
    products = sum(2 * T * B * a * b for a, b in zip(widths, widths[1:]))  # forward
    products += sum(2 * T * B * a * b for a, b in zip(widths[1:], widths[2:]))  # input gradients
    products += products - sum(2 * T * B * a * b for a, b in zip(widths[1:], widths[2:]))  # weight gradients
    assert roofline.step_flops(lambda: step(x, torch.randint(0, 20, (B,)))) == products
    floor, memory, compute = roofline.floor_ms("fp32", 1000, 2e9, {"copy_gbs": 1000.0, "matmul_tflops": {"fp32": 2.0}})
    assert (memory, compute) == (pytest.approx(30 * 1000 / 1e12 * 1e3), pytest.approx(1.0)) and floor == memory + compute
