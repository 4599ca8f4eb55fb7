"""The pipeline planner: its formulas (against a simulation of the schedule), the stage cut,
the chunk choice, the memory model, the table and the command."""
import argparse
import math
import re

import pytest

from spikefuse.models import build_model
from spikefuse.parallel.planner import (LayerProfile, configure, format_plan, ideal_pipeline_speedup,
                                        paper_optimum, paper_speedup, pipeline_speedup, pipeline_time, plan,
                                        predict, predict_row, run, split_schedule_time, stage_memory)


def simulated_time(n, chunks, t, h):
    """The GPipe forward over time chunks, event by event: stage k starts chunk c when it is
    done with chunk c-1 and chunk c has crossed link k, which carries one chunk at a time."""
    finish = [[0.0] * chunks for _ in range(n)]
    for k in range(n):
        link_free = 0.0
        for c in range(chunks):
            if k == 0:
                ready = 0.0
            else:
                ready = max(finish[k - 1][c], link_free) + h
                link_free = ready
            finish[k][c] = max(ready, finish[k][c - 1] if c else 0.0) + t
    return finish[-1][-1]


@pytest.mark.parametrize("n,chunks,t,h", [(1, 1, 1.0, 0.0), (2, 5, 1.0, 0.3), (3, 7, 0.5, 0.5),
                                          (4, 3, 1.0, 2.5), (5, 9, 0.2, 0.05), (8, 16, 1.0, 0.0)])
def test_pipeline_time_is_the_schedule(n, chunks, t, h):
    assert pipeline_time(n, chunks, t, h) == pytest.approx(simulated_time(n, chunks, t, h))


@pytest.mark.parametrize("chunks", [1, 2, 5, 8])
def test_split_schedule_equal_stages_wait_once_at_the_turn(chunks):
    """Two equal stages (forward, input gradient, weight gradients 1 each): the first runs its
    3C and waits once, after its last forward, for the second's forward and input gradient of
    the last chunk; the second's held weight gradients never hold it up."""
    assert split_schedule_time([(1.0, 1.0, 1.0)] * 2, chunks, 0.0) == pytest.approx(3 * chunks + 2)


def test_split_schedule_a_slower_last_stage_starts_one_forward_late():
    # its 6 per chunk from the first stage's first forward on; the first stage, 3 per chunk,
    # finishes while the second still runs its held weight gradients
    assert split_schedule_time([(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)], 4, 0.0) == pytest.approx(1 + 4 * 6)
    # a hand-off of 0.5 each way: the second stage starts 0.5 later
    assert split_schedule_time([(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)], 4, 0.5) == pytest.approx(1.5 + 4 * 6)


def test_split_schedule_a_slow_link_carries_one_chunk_at_a_time():
    """Hand-offs of 3 against 1 of forward per chunk (backward free): the chunks reach the
    second stage every 3, and their gradients come back every 3."""
    t = split_schedule_time([(1.0, 0.0, 0.0), (1.0, 0.0, 0.0)], 4, 3.0)
    assert t == pytest.approx(1 + 4 * 3 + 1 + 4 * 3)  # first forward, 4 hand-offs, last forward, 4 back
    assert split_schedule_time([(1.0, 0.0, 0.0)], 4, 3.0) == pytest.approx(4)  # one stage: no link


def test_split_schedule_holding_weight_gradients_back_fills_the_drain():
    """Worked by hand, 2 chunks: forwards 0-2 on the first stage, 1-3 on the second. In step
    (lag 0) the second stage sends chunk 1's gradient at 4, runs its weight gradients to 6 and
    sends chunk 0's at 7 (ends at 9); the first stage waits for it after chunk 1's 2.5 (4-6.5)
    and ends at 9.5. Held back (the default lag), chunk 0's gradient goes at 5 and the first
    stage ends at 9, when the second does."""
    stages = [(1.0, 1.5, 1.0), (1.0, 1.0, 2.0)]
    assert split_schedule_time(stages, 2, 0.0, lags=[0, 0]) == pytest.approx(9.5)
    assert split_schedule_time(stages, 2, 0.0) == pytest.approx(9.0)


def test_paper_model_and_its_optimum():
    assert paper_speedup(1, 100.0, 0.0) == 1.0
    assert paper_speedup(4, 100.0, 1.0) == pytest.approx(100 / 29)
    assert paper_optimum(100.0, 1.0) == 10.0
    assert paper_optimum(1.0, 0.0) == math.inf
    best = max(range(1, 40), key=lambda n: paper_speedup(n, 100.0, 1.0))
    assert best == 10


def test_ideal_pipeline_and_its_limits():
    assert ideal_pipeline_speedup(1, 8) == 1.0
    assert ideal_pipeline_speedup(2, 1) == 1.0  # one chunk: stages run one after another
    assert ideal_pipeline_speedup(2, 8) == pytest.approx(16 / 9)
    assert ideal_pipeline_speedup(4, 10**6) == pytest.approx(4, rel=1e-5)
    for n, c in [(2, 8), (3, 5), (8, 64)]:  # free hand-offs: the closed form is the ideal one
        assert pipeline_speedup(n, c, 1.0, 0.0) == pytest.approx(ideal_pipeline_speedup(n, c))
    # many chunks, hand-offs cheaper than a chunk: the paper's model, with N-1 boundaries
    assert pipeline_speedup(4, 10**5, 100.0, 1e-4) == pytest.approx(100 / (100 / 4 + 3e-4), rel=1e-4)


def profiles(times, spikes, out_per_step=64.0, saved_per_step=100.0, param_bytes=1000):
    return [LayerProfile(f"{i}", t, saved_per_step, out_per_step, param_bytes, s)
            for i, (t, s) in enumerate(zip(times, spikes))]


def deep_lif_layers(depth=4):
    return list(build_model("deep-lif", (5,), 3, None, depth=depth, hidden=8, backend="reference").layers)


def chunked(ts, per_chunk=0.0, max_chunks=64):
    """A one-device step in C chunks that costs ts plus per_chunk for each chunk."""
    return {2**i: ts + per_chunk * 2**i for i in range(int(math.log2(max_chunks)) + 1)}


def test_predict_balances_measured_time_and_picks_chunks():
    layers = deep_lif_layers()  # Flatten, (Linear, LIF) x 4, readout: 10 layers
    spikes = [type(m).__name__ == "LIF" for m in layers]
    times = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]  # only the hidden Linears cost
    T, ts = 64, 4.0
    rows = predict(layers, profiles(times, spikes), T, ts, chunked(ts), (0.0, math.inf), 0, max_gpus=4)
    assert [r.gpus for r in rows] == [1, 2, 3, 4]
    assert rows[0].chunks == 1 and rows[0].predicted_speedup == 1.0
    assert rows[1].cut == [range(0, 5), range(5, 10)]  # 2 | 2 Linears, cut after a LIF
    for r in (rows[1], rows[3]):  # balanced, free hand-offs, chunks free: the most chunks measured
        assert r.chunks == 64
        assert r.predicted_speedup == pytest.approx(ideal_pipeline_speedup(r.gpus, 64))
    # 3 stages of 2, 1, 1 layers (u = a layer's time on a chunk, Ts/4/C): the first, slowest, runs
    # 2u per chunk and waits once, at the turn, for the last chunk's forward and backward through
    # the two others (2u)
    u = ts / 4 / 64
    assert rows[2].predicted_speedup == pytest.approx(ts / (64 * 2 * u + 2 * u))


def test_a_per_chunk_cost_and_a_slow_link_mean_fewer_chunks():
    layers = deep_lif_layers()
    spikes = [type(m).__name__ == "LIF" for m in layers]
    times = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    T, ts = 64, 4.0
    free = predict(layers, profiles(times, spikes), T, ts, chunked(ts), (0.0, math.inf), 0, max_gpus=2)[1]
    costly = predict(layers, profiles(times, spikes), T, ts, chunked(ts, 0.1), (0.0, math.inf), 0, max_gpus=2)[1]
    latency = predict(layers, profiles(times, spikes), T, ts, chunked(ts), (0.05, math.inf), 0, max_gpus=2)[1]
    assert free.chunks == 64 and costly.chunks < 64 and latency.chunks < 64
    for row, per_chunk, lat in [(costly, 0.1, 0.0), (latency, 0.0, 0.05)]:
        def t_pipe(c):  # each stage: 2 of the 4 layer units; forward a third of a layer's time
            unit = (ts + per_chunk * c) / c / 4
            return split_schedule_time([(2 * unit / 3, 4 * unit / 3, 0.0)] * 2, c, 2 * lat)
        assert row.handoff_s == pytest.approx(2 * lat)
        assert row.step_time_s == pytest.approx(t_pipe(row.chunks))
        assert row.step_time_s == pytest.approx(min(t_pipe(2**i) for i in range(7)))
        assert row.predicted_speedup < free.predicted_speedup


def test_unmeasured_chunk_counts_are_interpolated():
    layers = deep_lif_layers()
    spikes = [type(m).__name__ == "LIF" for m in layers]
    times = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    p = profiles(times, spikes)
    cut = [range(0, 5), range(5, 10)]
    measured = {1: 4.0, 2: 4.2, 4: 5.0}
    def stages(chunk_time):  # each stage half of it; forward a third of a layer's time
        return [(chunk_time / 6, chunk_time / 3, 0.0)] * 2
    row = predict_row(p, cut, 64, 4.0, measured, (0.0, math.inf), 0, chunks=3)
    assert row.step_time_s == pytest.approx(split_schedule_time(stages(4.6 / 3), 3, 0.0))
    row = predict_row(p, cut, 64, 4.0, measured, (0.0, math.inf), 0, chunks=8)  # beyond: per-chunk cost of C=4
    assert row.step_time_s == pytest.approx(split_schedule_time(stages(5.0 / 4), 8, 0.0))
    with pytest.raises(ValueError, match=r"^chunks: expected 1 <= chunks <= T=64, got 65"):
        predict_row(p, cut, 64, 4.0, measured, (0.0, math.inf), 0, chunks=65)


def test_handoff_counts_spikes_as_bits_and_gradients_as_floats():
    layers = deep_lif_layers()
    spikes = [type(m).__name__ == "LIF" for m in layers]
    times = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    row = predict(layers, profiles(times, spikes, out_per_step=3200.0), 10, 1.0, chunked(1.0, max_chunks=8),
                  (0.0, 1e6), 0, max_gpus=2)[1]
    steps = math.ceil(10 / row.chunks)
    assert row.handoff_s == pytest.approx(steps * 3200.0 * (1 / 32 + 1) / 1e6)


def test_stage_memory():
    p = profiles([1.0] * 4, [False, True, False, False], out_per_step=10.0, saved_per_step=100.0, param_bytes=7)
    T, chunks, x_bytes = 20, 4, 555
    whole = stage_memory(p, range(0, 4), T, 1, x_bytes)
    assert whole == 4 * (2 * 7 + 100 * T) + x_bytes + 2 * 10 * T  # parameters+grads, activations, input, output
    first = stage_memory(p, range(0, 2), T, chunks, x_bytes)
    last = stage_memory(p, range(2, 4), T, chunks, x_bytes)
    assert first == 2 * (2 * 7 + 100 * T) + x_bytes + 2 * 10 * 5  # + a chunk and its gradient going out
    assert last == 2 * (2 * 7 + 100 * T) + 2 * 10 * 5 + 2 * 10 * T
    assert max(first, last) < 0.6 * whole


def test_plan_measures_and_formats_a_table():
    p = plan("deep-lif", 8, 2, gpus=2, input_shape=(6,), hidden=8, depth=4, backend="reference",
             link=(1e-5, 1e9), reps=1)
    assert p.link_source == "given" and p.ts_s > 0 and sorted(p.chunked_s) == [1, 2, 4, 8]
    assert len(p.profiles) == 10 and all(0 <= q.forward_seconds <= q.seconds for q in p.profiles)
    # what a stage holds back: the SpikingLinears' weight gradients, half their backward
    for q in p.profiles:
        spiking = q.name.endswith(":SpikingLinear")
        assert q.held_seconds == (pytest.approx((q.seconds - q.forward_seconds) / 2) if spiking else 0.0), q.name
    assert sum(q.name.endswith(":SpikingLinear") for q in p.profiles) == 4  # 3 hidden and the readout
    assert [r.gpus for r in p.rows] == list(range(1, 9))
    assert p.chosen.gpus == 2 and p.best in p.rows
    for r in p.rows:
        assert r.cut[0].start == 0 and r.cut[-1].stop == 10 and len(r.cut) == r.gpus
        assert r.chunks in p.chunked_s and r.predicted_speedup > 0 and r.memory_bytes > 0
        assert r.predicted_speedup == pytest.approx(p.ts_s / r.step_time_s) and r.ideal_speedup <= r.gpus
    assert p.rows[0].predicted_speedup == pytest.approx(1.0)
    assert p.at(2, p.rows[1].chunks) == p.rows[1]  # a fixed chunk count: what a benchmark compares with
    assert p.at(2, 1).predicted_speedup <= p.rows[1].predicted_speedup
    text = format_plan(p)
    assert "deep-lif, T=8, B=2" in text and "<- optimum" in text and "asked for: 2 GPU(s)" in text
    assert sum(line[:2].strip().isdigit() for line in text.splitlines()) == 8  # rows N = 1..8


def test_plan_named_errors():
    with pytest.raises(ValueError, match=r"^model_name: unknown model 'nope'"):
        plan("nope", 8, 2)
    with pytest.raises(ValueError, match=r"^time_steps: expected an integer >= 1, got 0"):
        plan("deep-lif", 0, 2)
    with pytest.raises(ValueError, match=r"^input_shape: model 'mlp' has no default input_shape"):
        plan("mlp", 8, 2)
    with pytest.raises(ValueError, match=r"^model_name: 'shd' is not a flat stack of layers"):
        plan("shd", 8, 2)


def test_plan_command(capsys):
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--model", "deep-lif", "--time-steps", "3", "--batch", "1", "--gpus", "3",
                              "--width", "0.004", "--link", "10", "50"])
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "link: 10 us + bytes / 50 GB/s (given)" in out and "asked for: 3 GPU(s)" in out


def test_plan_command_names_its_own_option(capsys):
    from spikefuse.cli import main

    assert main(["plan", "--model", "nosuch", "--time-steps", "4", "--batch", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model: unknown model 'nosuch'" in err[0] and "model_name" not in err[0]


# ---- issue 36: the link and the device checked where they enter, before anything is measured ----

BAD_LINKS = [(math.nan, math.nan), (-1, 5), (0, 0), (1, -2), (1, math.inf), (math.inf, 1), (True, 1), ("1", 1)]


@pytest.mark.parametrize("link", BAD_LINKS + [(1,), (1, 2, 3), 5])
def test_plan_refuses_a_link_that_is_not_finite_or_positive(link, monkeypatch):
    import spikefuse.parallel.planner as planner

    monkeypatch.setattr(planner, "profile_layers", None)  # refused before measuring: never called
    with pytest.raises(ValueError, match=r"^link: expected (a latency >= 0 s and a bandwidth > 0 B/s, both finite|"
                                         r"\(latency s, bandwidth B/s\)), got"):
        plan("deep-lif", 4, 1, link=link)


@pytest.mark.parametrize("device, message", [
    ("banana", r"expected a device such as 'cpu' or 'cuda', got 'banana'"),
    (3.5, r"expected a device such as 'cpu' or 'cuda', got 3.5"),
    ("meta", r"the planner measures on 'cpu' or 'cuda', got 'meta'"),
    ("cuda:99", r"'cuda:99' requested but"),
])
def test_plan_refuses_a_device_it_cannot_measure_on(device, message):
    with pytest.raises(ValueError, match=rf"^device: {message}"):
        plan("deep-lif", 4, 1, device=device)


CLI_MISTAKES = [
    (["--link", "nan", "nan"], r"--link: expected a latency >= 0 us and a bandwidth > 0 GB/s, both finite, got nan nan"),
    (["--link", "-1", "5"], r"--link: .* got -1.0 5.0"),
    (["--link", "5", "-0.5"], r"--link: .* got 5.0 -0.5"),
    (["--link", "0", "0"], r"--link: .* got 0.0 0.0"),  # was ZeroDivisionError, exit 1
    (["--link", "1", "inf"], r"--link: .* got 1.0 inf"),
    (["--link", "1", "1e300"], r"--link: 1 us and 1e\+300 GB/s are past float64's range"),  # infinite in B/s
    (["--device", "banana"], r"--device: expected a device such as 'cpu' or 'cuda', got 'banana'"),
    (["--device", "meta"], r"--device: the planner measures on 'cpu' or 'cuda'"),
    (["--device", "cuda:99"], r"--device: 'cuda:99' requested but"),
    (["--time-steps", "0"], r"--time-steps: expected an integer >= 1, got 0"),
    (["--batch", "-1"], r"--batch: expected an integer >= 1, got -1"),
    (["--gpus", "0"], r"--gpus: expected an integer >= 1, got 0"),
]


@pytest.mark.parametrize("extra, message", CLI_MISTAKES)
def test_plan_command_mistakes_exit_2_naming_the_option(extra, message, capsys):
    from spikefuse.cli import main

    base = {"--model": "deep-lif", "--time-steps": "4", "--batch": "1", "--width": "0.004"}
    for flag in extra:  # an option given in `extra` replaces the base's
        base.pop(flag, None)
    args = [a for kv in base.items() for a in kv]
    assert main(["plan", *args, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spikefuse plan: error: --"), err
    assert re.search(message, err[0]), err[0]
