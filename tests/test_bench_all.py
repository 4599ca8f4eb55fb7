"""`spikefuse bench all`: every part run with its defaults, one failing part reported (its
traceback in a log) while the rest still run, `parallel` skipped without 2 GPUs, a summary."""
import json
import sys
import types

import pytest

from spikefuse import cli
from spikefuse.bench import all as bench_all
from spikefuse.bench import command, on


def fake_part(monkeypatch, name, run):
    """Register a benchmark `name` whose run(args) is `run`."""
    module = types.ModuleType(f"fake_bench_{name}")
    module.configure = lambda parser: parser.add_argument("--out")
    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(command.BENCHMARKS, name, (module.__name__, f"fake {name}"))


def boom(args):
    raise RuntimeError("the fake part broke\nsecond line")


def test_a_failing_part_is_reported_and_the_rest_still_run(tmp_path, monkeypatch, capsys):
    # the real `on` part, its defaults made tiny for the CPU
    monkeypatch.setattr(on, "SIZES", [8])
    monkeypatch.setattr(on, "TIME_STEPS", 4)
    monkeypatch.setattr(on, "BATCH", 2)
    fake_part(monkeypatch, "boom", boom)
    fake_part(monkeypatch, "quiet", lambda args: 0)
    monkeypatch.setattr(bench_all.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "results"
    assert cli.main(["bench", "all", "--out", str(out), "--only", "boom,on,parallel,quiet"]) == 1
    printed = capsys.readouterr().out
    assert "[1/4] boom: failed after" in printed and "RuntimeError: the fake part broke" in printed
    assert "[2/4] on: ok after" in printed and "[3/4] parallel: skipped" in printed and "[4/4] quiet: ok" in printed

    summary = json.loads((out / "summary.json").read_text())
    parts = {p["name"]: p for p in summary["parts"]}
    assert list(parts) == ["boom", "on", "parallel", "quiet"] and summary["failed"] == ["boom"]
    assert parts["boom"]["status"] == "failed" and parts["boom"]["note"] == "RuntimeError: the fake part broke"
    assert "Traceback" in (out / parts["boom"]["log"]).read_text()
    assert parts["on"]["status"] == "ok" and parts["on"]["seconds"] > 0
    assert {f.rsplit(".", 1)[-1] for f in parts["on"]["files"]} >= {"json", "md"}
    assert parts["parallel"]["status"] == "skipped" and "2 or more CUDA GPUs" in parts["parallel"]["note"]
    assert parts["quiet"] == {**parts["quiet"], "status": "ok", "files": []}
    md = (out / "summary.md").read_text()
    assert "| boom | failed |" in md and "| parallel | skipped |" in md and "failed: boom" in md


def test_all_ok_is_exit_code_0_and_skip_leaves_parts_out(tmp_path, monkeypatch):
    fake_part(monkeypatch, "quiet", lambda args: 0)
    fake_part(monkeypatch, "boom", boom)
    out = tmp_path / "r"
    assert cli.main(["bench", "all", "--out", str(out), "--only", "quiet,boom", "--skip", "boom"]) == 0
    assert [p["name"] for p in json.loads((out / "summary.json").read_text())["parts"]] == ["quiet"]


def test_every_registered_benchmark_is_a_part():
    assert bench_all.parts() == [n for n in command.BENCHMARKS if n not in ("all", "chart")]
    assert {"lif", "on", "parallel"} <= set(bench_all.parts())


@pytest.mark.parametrize("argv, expected", [
    (["--only", "nope"], "--only nope: unknown part nope"),
    (["--skip", "all"], "--skip all: unknown part all"),
    (["--only", "lif", "--skip", "lif"], "leave no part to run"),
])
def test_bad_part_names_are_one_line_with_exit_code_2(tmp_path, capsys, argv, expected):
    assert cli.main(["bench", "all", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err, err


def test_quick_reaches_every_part_and_its_summary_says_quick(tmp_path, monkeypatch):
    got = {}

    def fake_quick(name):  # a part that records whether it was asked for --quick
        module = types.ModuleType(f"fake_quick_{name}")

        def configure(parser):
            parser.add_argument("--out")
            parser.add_argument("--quick", action="store_true")
        module.configure, module.run = configure, lambda args: got.update({name: args.quick}) or 0
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(command.BENCHMARKS, name, (module.__name__, f"fake {name}"))
    fake_quick("one")
    fake_quick("two")
    out = tmp_path / "r"
    assert cli.main(["bench", "all", "--quick", "--out", str(out), "--only", "one,two"]) == 0
    assert got == {"one": True, "two": True}
    summary = json.loads((out / "summary-quick.json").read_text())
    assert summary["quick"] is True and [p["status"] for p in summary["parts"]] == ["ok", "ok"]
    assert (out / "summary-quick.md").read_text().startswith("**Quick run (--quick)")
    assert not (out / "summary.json").exists()  # a full run's summary is never replaced


def test_quick_runs_on_the_cpu_what_can(monkeypatch):
    monkeypatch.setattr(bench_all.torch.cuda, "is_available", lambda: False)
    assert "CUDA" in bench_all.why_not("steps", quick=True)  # CUDA graphs: skipped with the reason
    assert bench_all.why_not("sparse", quick=True) is None and bench_all.why_not("parallel", quick=True) is None
    assert "--quick" in bench_all.why_not("sparse") and "2 or more CUDA GPUs" in bench_all.why_not("parallel")
