"""Charts of benchmark results, drawn from committed results files (no GPU needed)."""
import builtins
import json
import shutil
from pathlib import Path

import pytest

from spikefuse.bench import chart, charts
from spikefuse.cli import main

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FILES = ["lif-nvidia-h200.json", "neurons-nvidia-h100-80gb-hbm3.json", "steps-ipu-shd-nvidia-h200.json",
         "train-nvidia-h200.json", "data-nvidia-h200.json", "on-nvidia-h100-80gb-hbm3.json",
         "sparse-notes-nvidia-h100-80gb-hbm3.json", "all-nvidia-h100-80gb-hbm3/sparse-nvidia-h100-80gb-hbm3.json",
         "all-nvidia-h100-80gb-hbm3/ddp-scaling-nvidia-h100-80gb-hbm3.json",
         "all-nvidia-h100-80gb-hbm3/pipeline-nvidia-h100-80gb-hbm3.json"]
pytest.importorskip("matplotlib")


@pytest.mark.parametrize("name", FILES)
def test_each_benchmark_draws_from_its_results_file(name, tmp_path):
    copy = tmp_path / Path(name).name
    shutil.copy(RESULTS / name, copy)
    (png,) = chart.redraw([str(copy)])
    data = Path(png).read_bytes()
    assert png == str(copy.with_suffix(".png")) and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_train_chart_keeps_each_time_step_apart():
    """resnet18 runs at T=4 and T=32: two groups, not one."""
    from matplotlib.figure import Figure
    cases = [dict(net="resnet18", precision="fp32", T=t, B=16, impl=impl, ms=ms, floor_ms=1.0)
             for t in (4, 32) for impl, ms in (("spikefuse-fused", 5.0 * t), ("spikingjelly", 9.0 * t))]
    ax = Figure().subplots()
    assert charts._train(ax, {"cases": cases})
    assert [t.get_text() for t in ax.get_xticklabels()] == ["resnet18 fp32\nT=4 B=16", "resnet18 fp32\nT=32 B=16"]
    assert sorted(round(b.get_height()) for b in ax.patches) == [20, 36, 160, 288]


def test_chart_command_and_its_errors(tmp_path, capsys):
    shutil.copy(RESULTS / FILES[0], tmp_path / FILES[0])
    assert main(["bench", "chart", str(tmp_path / FILES[0])]) == 0
    assert (tmp_path / FILES[0]).with_suffix(".png").exists()
    assert main(["bench", "chart", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["bench", "chart", str(tmp_path / "bad.json")]) == 2
    (tmp_path / "list.json").write_text("[1, 2]")
    assert main(["bench", "chart", str(tmp_path / "list.json")]) == 2
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "something-else"}))
    assert main(["bench", "chart", str(tmp_path / "other.json")]) == 0
    err = capsys.readouterr()
    assert "Traceback" not in err.err and "no chart for benchmark 'something-else'" in err.out


def test_no_matplotlib_means_no_chart_and_a_note(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    payload = json.loads((RESULTS / FILES[0]).read_text())
    assert charts.draw(payload, str(tmp_path / "x.png")) is None
    assert "matplotlib is not installed" in capsys.readouterr().out and not (tmp_path / "x.png").exists()
