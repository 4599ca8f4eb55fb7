"""`spikefuse bench <part> --quick` on the CPU for the parts without a test file of their own
(lif, train, data): each writes <part>-quick-<device>.json and .md marked as a quick run, never
the full run's file names. The other parts' --quick tests sit at the end of their own files."""
import importlib.util
import json

import pytest

from spikefuse import cli
from spikefuse.bench.report import QUICK_NOTE


def quick_results(out, part):
    """The quick run's payload; its markdown must open with the quick note."""
    (path,) = out.glob(f"{part}-quick-*.json")
    assert not [p for p in out.glob(f"{part}-*.json") if p != path]  # no full-run names
    assert path.with_suffix(".md").read_text().startswith(f"**{QUICK_NOTE}")
    payload = json.loads(path.read_text())
    assert payload["quick"] is True
    return payload


@pytest.mark.slow  # 9 s on 2 cores; bench all's test runs the `on` part's real flow in CI
def test_lif_quick(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["bench", "lif", "--quick", "--libraries", "pytorch-loop", "--out", str(out)]) == 0
    payload = quick_results(out, "lif")
    assert [(c["T"], c["B"], c["N"]) for c in payload["cases"][:2]] == [(8, 2, 64), (16, 2, 96)]
    libraries = set(payload["cases"][0]["libraries"])  # on CUDA spikefuse adds its graph-replay row
    assert {"spikefuse", "pytorch-loop"} <= libraries <= {"spikefuse", "pytorch-loop", "spikefuse-cuda-graph"}


def test_lif_unknown_library_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["bench", "lif", "--quick", "--libraries", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--libraries nope: pick from spikefuse" in err


def test_train_quick(tmp_path):
    out = tmp_path / "r"
    # the small CIFAR network alone (the ResNet doubles the time on a CPU), no peer
    assert cli.main(["bench", "train", "--quick", "--size", "small", "--no-peers", "--resnet-time-steps", "",
                     "--out", str(out)]) == 0
    payload = quick_results(out, "train")
    assert {c["impl"] for c in payload["cases"]} == {"spikefuse-fused", "spikefuse-vanilla"}
    assert all("ms" in c and c["B"] == 2 and c["T"] == 2 for c in payload["cases"])


def test_data_quick(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["bench", "data", "--quick", "--pipelines", "ad", "--device", "cpu",
                     "--root", str(tmp_path / "cache"), "--out", str(out)]) == 0
    payload = quick_results(out, "data")
    assert payload["config"]["samples"] == 16 and payload["config"]["batch_size"] == 8
    assert payload["frames_identical"] is True and set(payload["results"]) == {"a", "d"}


def test_data_quick_without_tonic_skips_its_pipelines_with_a_note(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tonic" else find_spec(name, *a))
    out = tmp_path / "r"
    assert cli.main(["bench", "data", "--quick", "--pipelines", "ad", "--device", "cpu",
                     "--root", str(tmp_path / "cache"), "--out", str(out)]) == 0
    payload = quick_results(out, "data")
    assert set(payload["results"]) == {"d"} and payload["skipped"] == {"a": "tonic is not installed"}
    assert "a: not run, tonic is not installed" in (out / next(out.glob("data-quick-*.md")).name).read_text()
