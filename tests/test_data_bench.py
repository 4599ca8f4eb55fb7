"""Smoke test of the data-loading benchmark on the CPU with tiny sizes."""
import json

import pytest
import torch

from spikefuse.bench import data as bench


class TinyIF(torch.nn.Module):
    """IF with hard reset and a straight-through gradient: cheap on a CPU, enough for a smoke test."""

    def forward(self, x):
        v, out = torch.zeros_like(x[0]), []
        for xt in x:
            h = v + xt
            s = (h >= 1.0).to(h.dtype)
            s = s + h - h.detach()  # straight-through: the gradient of h
            v = h * (1 - s.detach())
            out.append(s)
        return torch.stack(out)


def test_data_benchmark_smoke(tmp_path, monkeypatch):
    # the tiny IF keeps this to seconds on a CPU; the benchmark itself uses spikefuse.nn.IF
    monkeypatch.setattr(bench, "_if_neuron", TinyIF)
    out = tmp_path / "results"
    code = bench.main(["--out", str(out), "--samples", "4", "--batch-size", "4", "--workers", "1",
                       "--warmup", "1", "--device", "cpu", "--root", str(tmp_path / "cache")])
    assert code == 0
    (path,) = out.glob("data-*.json")
    payload = json.loads(path.read_text())
    assert payload["frames_identical"] is True
    assert set(payload["results"]) == {"a", "b", "c", "d"}
    for r in payload["results"].values():
        assert r["steps"] == 1 and 0 < r["step_fraction"] <= 1
    assert payload["ratios"]["epoch_speedup_d_vs_a"] > 0
    assert {"device", "versions", "date"} <= set(payload["environment"])
    assert payload["results"]["c"]["group"] >= 1 and payload["results"]["d"]["group"] >= 1
    md = (out / path.name.replace(".json", ".md")).read_text()
    assert "tonic" in md and "% in train step = time in training steps / epoch wall time" in md


def test_data_benchmark_rejects_bad_group(tmp_path, capsys):
    assert bench.main(["--group", "0", "--samples", "4", "--root", str(tmp_path)]) == 2
    assert "--group" in capsys.readouterr().err


# ---- issue 36: every option checked before anything is built; exit 2 naming it ----

@pytest.mark.parametrize("option, values", [
    ("--samples", ["0", "-5", "3", str(2**31)]),  # --samples 0 was SyntheticSHD's ValueError, exit 1
    ("--batch-size", ["0", "-1", str(2**31)]),
    ("--workers", ["-1", "100000"]),
    ("--warmup", ["-1"]),
    ("--seed", ["-1", str(2**63), str(10**23)]),
    ("--group", ["0", "-3"]),
    ("--device", ["banana", "meta:x", "cuda:99"]),
    ("--pipelines", ["", "xz", "abq"]),
])
def test_data_benchmark_refuses_bad_options_naming_them(option, values, tmp_path, capsys):
    for value in values:
        assert bench.main(["--quick", option, value, "--out", str(tmp_path / "out"), "--root", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"spikefuse bench data: error: {option}: "), err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_data_benchmark_mistakes_through_the_cli(tmp_path, capsys):
    from spikefuse.cli import main

    assert main(["bench", "data", "--samples", "0", "--root", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["spikefuse bench data: error: --samples: expected an integer from 4 to 2147483647, got 0"]
