"""`spikefuse bench on` on the CPU at toy sizes: every installed library cross-checked against
spikefuse (equal spikes and gradients in float32), a missing one skipped with a note, bad
options one line with exit code 2."""
import json

import pytest

from spikefuse import cli
from spikefuse.bench import on, peers

TOY = ["--sizes", "16", "24", "--time-steps", "6", "--batch", "4", "--device", "cpu"]


def run_on(tmp_path, *extra):
    out = tmp_path / "results"
    assert cli.main(["bench", "on", *TOY, "--out", str(out), *extra]) == 0
    (path,) = out.glob("on-*.json")
    return json.loads(path.read_text()), path


@pytest.mark.slow  # ~25 s on a CPU; the quick run covers the CPU path
def test_toy_run_cross_checks_every_installed_library(tmp_path):
    payload, path = run_on(tmp_path)
    assert {"device", "versions", "date"} <= set(payload["environment"])
    assert "sinabs" in payload["environment"]["versions"]
    assert "not the benchmark" in payload["note"]  # CPU figures are said to be no benchmark
    assert payload["all_checks_passed"] is True
    assert "h[t] = 0.5 v[t-1] + y[t]" in payload["equations"]
    assert [(c["precision"], c["N"]) for c in payload["cases"]] == [
        ("float32", 16), ("float32", 24), ("bfloat16", 16), ("bfloat16", 24)]
    assert "lava-dl" in payload["skipped_libraries"]  # no adapter: always a note
    for case in payload["cases"]:
        assert 0 < case["firing_rate"] < 1  # spikes to compare, not a silent or saturated layer
        assert case["floor"]["matmul_ms"] > 0 and case["floor"]["forward-backward"]["matmul_ms"] > 0
        libs = case["libraries"]
        for name in peers.LAYERS:  # measured, or skipped with the reason
            assert name in libs or name in payload["skipped_libraries"]
        assert {"spikefuse", "pytorch-loop"} <= set(libs)
        for r in libs.values():
            assert "error" not in r
            assert set(r["spike_agreement"]) == set(on.MODES)
            for mode in on.MODES:  # timed in alternating rounds: the time is the rounds' median
                assert r[mode]["ms"] > 0 and r[mode]["ratio_to_spikefuse"] > 0
                assert len(r[mode]["round_ms"]) == on.ROUNDS
                assert min(r[mode]["round_ms"]) <= r[mode]["ms"] <= max(r[mode]["round_ms"])
        for mode in on.MODES:
            assert case["standing"][mode]["time"] in ("first", "tie", "behind")
            assert case["standing"][mode]["fastest_other"] in set(libs) - {"spikefuse"}
            if case["precision"] == "float32":  # the same equations: the same spikes and gradients
                assert r["check_passed"] is True
                assert min(r["spike_agreement"].values()) == 1.0
                assert max(r["grad_rel_err"].values()) < 1e-5
            else:  # bf16: each library rounds its own way, reported only
                assert r["check_passed"] is None and min(r["spike_agreement"].values()) > 0.9
    md = path.with_suffix(".md").read_text()
    assert "## Where spikefuse stands" in md and "alternating rounds" in md
    assert "## float32, forward-backward" in md and "| 16 | pytorch-loop |" in md and "not the benchmark" in md
    chart = path.with_suffix(".png")
    pytest.importorskip("matplotlib")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_library_is_skipped_with_a_note(tmp_path, monkeypatch):
    def missing(weight):
        raise ImportError("No module named 'snntorch'")
    monkeypatch.setitem(peers.LAYERS, "snntorch", missing)
    payload, _ = run_on(tmp_path, "--precisions", "float32", "--sizes", "16", "--libraries", "snntorch,pytorch-loop")
    assert "No module named 'snntorch'" in payload["skipped_libraries"]["snntorch"]
    (case,) = payload["cases"]
    assert set(case["libraries"]) == {"spikefuse", "pytorch-loop"}
    assert payload["all_checks_passed"] is True


def test_a_library_that_fails_while_running_is_a_row_not_the_end(tmp_path, monkeypatch):
    def broken(weight):
        layer = peers.pytorch_loop_layer(weight)
        layer.run = lambda x: (_ for _ in ()).throw(RuntimeError("kernel exploded"))
        return layer
    monkeypatch.setitem(peers.LAYERS, "pytorch-loop", broken)
    payload, _ = run_on(tmp_path, "--precisions", "float32", "--sizes", "16", "--libraries", "pytorch-loop")
    (case,) = payload["cases"]
    assert case["libraries"]["pytorch-loop"] == {"error": "RuntimeError: kernel exploded"}
    assert case["libraries"]["spikefuse"]["check_passed"] is True
    assert payload["all_checks_passed"] is False


def test_other_equations_fail_the_check(tmp_path, monkeypatch):
    def detached(weight):  # same spikes, the reset cut from the graph: other gradients
        from spikefuse import reference
        linear = peers._linear(weight)
        return peers.Layer(lambda x: reference.lif(linear(x), peers.DECAY, peers.THRESHOLD, "hard",
                                                   detach_reset=True, surrogate="fast_sigmoid", alpha=1.0),
                           linear.weight)
    monkeypatch.setitem(peers.LAYERS, "pytorch-loop", detached)
    payload, _ = run_on(tmp_path, "--precisions", "float32", "--sizes", "16", "--libraries", "pytorch-loop")
    row = payload["cases"][0]["libraries"]["pytorch-loop"]
    assert min(row["spike_agreement"].values()) == 1.0 and row["check_passed"] is False


@pytest.mark.parametrize("argv, expected", [
    (["--sizes", "0"], "--sizes must be at least 1, got 0"),
    (["--time-steps", "0"], "--time-steps must be at least 1, got 0"),
    (["--batch", str(2**70)], "--batch must be at most 2147483647, got 1180591620717411303424"),
    (["--sizes", "16", str(2**31)], "--sizes must be at most 2147483647, got 2147483648"),
    (["--seed", str(2**70)], "--seed must be an integer from -2**63 to 2**63 - 1"),
    (["--libraries", "nope"], "--libraries nope: pick from spikefuse"),
    (["--modes", "sideways"], "--modes sideways: pick from forward, forward-backward"),
    (["--precisions", "float8"], "--precisions float8: pick from float32, bfloat16"),
])
def test_bad_options_are_one_line_with_exit_code_2(tmp_path, capsys, argv, expected):
    assert cli.main(["bench", "on", *TOY, "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err, err
    assert not list(tmp_path.glob("on-*"))


def test_cuda_asked_for_where_there_is_none(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(on.torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "on", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "--device cuda: no CUDA device is available here" in capsys.readouterr().err


def test_rounds_alternate_and_a_failing_call_sits_out_the_rest():
    from spikefuse.bench.timing import in_rounds
    order = []

    def call(name):
        def run():
            order.append(name)
            if name == "bad" and order.count("bad") == 2:
                raise RuntimeError("out of memory")
            return len(order)
        return run
    times, errors = in_rounds(lambda fn: fn(), {n: call(n) for n in ("a", "bad", "b")}, rounds=3)
    # each round visits every entry in turn, starting one further along each time
    assert order == ["a", "bad", "b", "bad", "b", "a", "b", "a"]
    assert times == {"a": [1, 6, 8], "bad": [2], "b": [3, 5, 7]}
    assert str(errors["bad"]) == "out of memory" and set(errors) == {"bad"}


def test_standing_calls_a_gap_inside_the_spread_a_tie():
    def row(rounds, mib):
        return {"forward": {"ms": sorted(rounds)[len(rounds) // 2], "round_ms": rounds, "peak_extra_mib": mib}}
    rows = {"spikefuse": row([10.2, 10.3, 10.4], 100), "peer": row([10.0, 10.25, 10.3], 100.5),
            "slow": row([20, 21, 22], 300)}
    st = on.standing(rows, ["forward"])["forward"]
    assert (st["time"], st["fastest_other"], st["memory"]) == ("tie", "peer", "tie")
    rows["peer"] = row([9.0, 9.1, 9.2], 150)
    st = on.standing(rows, ["forward"])["forward"]
    assert (st["time"], st["memory"], st["leanest_other"]) == ("behind", "first", "peer")
    rows["spikefuse"] = row([8.0, 8.1, 9.5], 160)
    assert on.standing(rows, ["forward"])["forward"]["time"] == "first"


def test_warm_up_runs_for_at_least_warmup_s():
    import time
    from spikefuse.bench.timing import median_ms
    spans = []  # (start, end) of each call

    def slow():
        start = time.perf_counter()
        time.sleep(0.01)
        spans.append((start, time.perf_counter()))
    median_ms(slow, warmup=1, warmup_s=0.1, min_reps=1, max_reps=1, budget_s=0.0)
    warm_ups = spans[:-2]  # then one call to size the repetitions, and the one timed
    # by the clock, not by a count of calls: a loaded CPU sleeps longer than asked
    assert warm_ups and warm_ups[-1][1] - warm_ups[0][0] >= 0.1 - 0.005


def test_quick_run_is_tiny_and_marked_quick(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["bench", "on", "--quick", "--device", "cpu", "--precisions", "float32",
                     "--libraries", "pytorch-loop", "--out", str(out)]) == 0
    (path,) = out.glob("on-*.json")
    assert path.name.startswith("on-quick-")
    payload = json.loads(path.read_text())
    assert payload["quick"] is True and payload["settings"]["timing"]["rounds"] == on.QUICK_ROUNDS
    assert [c["N"] for c in payload["cases"]] == on.QUICK["sizes"] and payload["settings"]["T"] == on.QUICK["time_steps"]
    assert all(len(r["forward"]["round_ms"]) == on.QUICK_ROUNDS for r in payload["cases"][0]["libraries"].values())
    assert path.with_suffix(".md").read_text().startswith("**Quick run (--quick)")
