"""`spikefuse export --nir`: the NIR graph read back holds the model's parameters, and
simulating it with NIR's own equations (forward Euler, step dt) gives the model's logits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from spikefuse.cli import main
from spikefuse.models import build_model
from spikefuse.nn import IF, LIF, PLIF
from spikefuse.train import checkpoint
from spikefuse.train.export import to_nir
from spikefuse.train.spikes import SpikeMonitor

nir = pytest.importorskip("nir")

SPEC = {"name": "mlp", "input_shape": [2, 3, 4], "num_classes": 5, "time_steps": 12,
        "kwargs": {"hidden": [16, 12], "decay": 0.75, "threshold": 0.5}}


def trained_run(tmp_path):
    """A run directory as `spikefuse train` leaves it (only what export reads)."""
    torch.manual_seed(0)
    model = build_model(SPEC["name"], SPEC["input_shape"], SPEC["num_classes"], SPEC["time_steps"], **SPEC["kwargs"])
    for p in model.parameters():  # larger weights so every layer spikes
        p.data.mul_(3)
    checkpoint.save({"config": {"model": SPEC}, "model": model.state_dict()}, tmp_path / "checkpoint.pt")
    return model


def simulate(graph, x: np.ndarray, dt: float) -> np.ndarray:
    """Run a sequential NIR graph on x [T, *shape] with forward-Euler steps of dt."""
    order, node = [], "input"
    edges = dict(graph.edges)
    while node in edges:
        node = edges[node]
        order.append(graph.nodes[node])
    state = {}
    for step in x:
        signal = step
        for i, n in enumerate(order):
            if isinstance(n, nir.Flatten):
                signal = signal.reshape(-1)
            elif isinstance(n, nir.Affine):
                signal = n.weight @ signal + n.bias
            elif isinstance(n, nir.Linear):  # an Affine without bias
                signal = n.weight @ signal
            elif isinstance(n, (nir.LIF, nir.IF, nir.I)):
                v = state.get(i, np.zeros_like(n.r, dtype=np.float64))
                if isinstance(n, nir.LIF):
                    v = v + dt / n.tau * (n.v_leak - v + n.r * signal)
                else:
                    v = v + dt * n.r * signal
                if isinstance(n, nir.I):
                    state[i], signal = v, v
                    continue
                spikes = (v > n.v_threshold).astype(np.float64)
                state[i], signal = np.where(spikes > 0, n.v_reset, v), spikes
    return signal


def test_export_holds_the_parameters_and_computes_the_logits(tmp_path, capsys):
    model = trained_run(tmp_path)
    out = tmp_path / "net.nir"
    # the NIR-verbatim form (weights as trained, r = 1/(1-decay)) and the integrator readout;
    # the default (peers form, Affine readout) is tested against snnTorch and Norse in test_nir.py
    assert main(["export", "--nir", str(tmp_path), "--out", str(out), "--dt", "0.002",
                 "--form", "nir", "--readout", "integrator"]) == 0
    assert "wrote" in capsys.readouterr().out
    graph = nir.read(out)
    assert graph.metadata["dt"] == 0.002 and graph.metadata["time_steps"] == 12

    kinds = {type(n).__name__ for n in graph.nodes.values()}
    affines = [graph.nodes[k] for k in ("affine", "affine_1", "affine_2")]
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    for node, lin in zip(affines, linears, strict=True):
        assert np.array_equal(node.weight, lin.weight.detach().numpy())
        assert np.array_equal(node.bias, lin.bias.detach().numpy())
    for key in ("lif", "lif_1"):
        node = graph.nodes[key]
        # NIR fires at v > v_threshold, we at h >= threshold: written one float32 ulp below
        assert np.all(node.v_threshold == np.nextafter(np.float32(0.5), np.float32(0)))
        assert np.all(node.v_reset == 0) and np.all(node.v_leak == 0)
        np.testing.assert_allclose(node.tau, 0.002 / 0.25, rtol=1e-6)  # tau = dt / (1 - decay)
        np.testing.assert_allclose(node.r, 4.0, rtol=1e-6)  # r = 1 / (1 - decay)
    np.testing.assert_allclose(graph.nodes["i"].r, 1 / (12 * 0.002), rtol=1e-6)
    assert kinds == {"Input", "Flatten", "Affine", "LIF", "I", "Output"}

    torch.manual_seed(1)
    x = (torch.rand(12, 3, 2, 3, 4) < 0.4).float()
    with torch.no_grad(), SpikeMonitor(model) as monitor:
        logits = model(x).numpy()
    assert all(0.05 < r < 0.95 for r in monitor.rates().values())  # the comparison exercises spiking
    for b in range(3):
        got = simulate(graph, x[:, b].double().numpy(), dt=0.002)
        np.testing.assert_allclose(got, logits[b], rtol=1e-4, atol=1e-4)


def test_default_output_file(tmp_path, capsys):
    trained_run(tmp_path)
    assert main(["export", "--nir", str(tmp_path)]) == 0
    assert isinstance(nir.read(tmp_path / "model.nir"), nir.NIRGraph)


def test_if_and_plif_layers():
    plif = PLIF(init_decay=0.6, channels=4)
    with torch.no_grad():
        plif.w.copy_(torch.tensor([-1.0, 0.0, 0.5, 2.0]))
    net = nn.Sequential(nn.Linear(3, 4), plif, nn.Linear(4, 4), IF(threshold=2.0))
    graph = to_nir(net, (3,), time_steps=5, dt=1.0)
    decay = torch.sigmoid(plif.w).detach().double().numpy()
    np.testing.assert_allclose(graph.nodes["lif"].tau, 1 / (1 - decay), rtol=1e-6)
    assert np.all(graph.nodes["if"].r == 1.0)
    assert np.all(graph.nodes["if"].v_threshold == np.nextafter(np.float32(2), np.float32(0)))  # > vs our >=
    assert "i" not in graph.nodes  # no mean readout on a bare Sequential


def test_what_nir_cannot_express_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="reset='soft' has no NIR equivalent"):
        to_nir(nn.Sequential(nn.Linear(3, 4), LIF(reset="soft")), (3,), time_steps=5)
    with pytest.raises(ValueError, match=r"cannot export layer 1 \(ReLU\)"):
        to_nir(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), (3,), time_steps=5)
    assert main(["export", "--nir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoint.pt" in err and len(err.strip().splitlines()) == 1


# ---- issue 14: bad checkpoints and bad --dt are one line and exit 2; no invalid NIR file ----

def export_error(argv, capsys):
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("content, match", [
    (b"", "is empty (0 bytes)"),
    (b"PK\x03\x04 not really a zip", "cannot read checkpoint"),
    (bytes(range(256)), "cannot read checkpoint"),
])
def test_export_of_a_corrupt_checkpoint(tmp_path, capsys, content, match):
    (tmp_path / "checkpoint.pt").write_bytes(content)
    assert match in export_error(["--nir", str(tmp_path)], capsys)


def test_export_of_weights_that_do_not_fit_their_config(tmp_path, capsys):
    trained_run(tmp_path)
    state = checkpoint.load(tmp_path / "checkpoint.pt")
    state["model"]["layers.1.weight"] = torch.zeros(2, 2)
    checkpoint.save(state, tmp_path / "checkpoint.pt")
    assert "size mismatch for layers.1.weight" in export_error(["--nir", str(tmp_path)], capsys)


@pytest.mark.parametrize("dt", ["inf", "nan", "0", "-1e-3"])
def test_export_refuses_a_dt_that_is_not_a_finite_positive_time(tmp_path, capsys, dt):
    trained_run(tmp_path)
    assert "--dt must be a finite number of seconds > 0" in export_error(["--nir", str(tmp_path), f"--dt={dt}"], capsys)
    assert not (tmp_path / "model.nir").exists()


def test_to_nir_refuses_non_finite_parameters():
    net = nn.Sequential(nn.Linear(3, 4), LIF(decay=0.5))
    with pytest.raises(ValueError, match="dt: expected a finite number of seconds > 0, got inf"):
        to_nir(net, (3,), time_steps=5, dt=float("inf"))
    with pytest.raises(ValueError, match=r"node 2 \(LIF\) would have a zero tau"):
        to_nir(net, (3,), time_steps=5, dt=1e-320)  # tau = dt / (1 - decay) is 0 in float32
    with pytest.raises(ValueError, match=r"node 2 \(IF\) would have a non-finite r"):
        to_nir(nn.Sequential(nn.Linear(3, 4), IF()), (3,), time_steps=5, dt=1e-320)  # 1/dt overflows float32
    with torch.no_grad():
        net[0].weight[0, 0] = float("nan")  # diverged training
    with pytest.raises(ValueError, match=r"node 1 \(Affine\) would have a non-finite weight"):
        to_nir(net, (3,), time_steps=5)


def test_export_never_overwrites_a_file_it_did_not_write(tmp_path, capsys):
    """`--out RUN/checkpoint.pt` once wrote the graph over the run's checkpoint (exit 0)."""
    trained_run(tmp_path)
    ckpt = tmp_path / "checkpoint.pt"
    before = ckpt.read_bytes()
    assert main(["export", "--nir", str(tmp_path), "--out", str(ckpt)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a NIR graph" in err[0] and "--out" in err[0]
    assert ckpt.read_bytes() == before
    # its own earlier export is replaced, atomically (no temporary file left behind)
    out = tmp_path / "graph.nir"
    assert main(["export", "--nir", str(tmp_path), "--out", str(out)]) == 0
    assert main(["export", "--nir", str(tmp_path), "--out", str(out), "--dt", "0.001"]) == 0
    assert isinstance(nir.read(out), nir.NIRGraph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "graph.nir"]
    assert main(["export", "--nir", str(tmp_path), "--out", str(tmp_path)]) == 2  # a directory
    assert main(["export", "--nir", str(tmp_path), "--out", str(tmp_path / "no" / "g.nir")]) == 2


def test_export_without_the_nir_extra_names_it(tmp_path, capsys, monkeypatch):
    trained_run(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "nir", None)  # as if not installed
    assert main(["export", "--nir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spikefuse[nir]" in err[0], err
