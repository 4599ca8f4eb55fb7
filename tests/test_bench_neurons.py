"""Smoke test of `spikefuse bench neurons` on the CPU at tiny sizes (fused kernels through
the Triton interpreter; the peers that import here)."""
import json

import pytest

from spikefuse import cli, reference
from spikefuse.bench import neurons


@pytest.mark.slow  # ~20 s on a CPU; the quick run below covers the CPU path
def test_neurons_benchmark_quick(tmp_path):
    out = tmp_path / "results"
    assert cli.main(["bench", "neurons", "--quick", "--out", str(out)]) == 0
    (path,) = out.glob("neurons-*.json")
    payload = json.loads(path.read_text())
    assert {"device", "versions", "date"} <= set(payload["environment"])
    assert {"torch", "triton", "snntorch", "norse", "spikingjelly"} <= set(payload["environment"]["versions"])
    assert payload["all_checks_passed"] is True
    assert set(payload["equations"]) == {"alif", "cuba", "rlif", "ralif", "plif"}

    rlif_missing = neurons.rlif_missing()
    expected = {"alif", "cuba", "ralif", "plif"} | (set() if rlif_missing else {"rlif"})
    assert {c["neuron"] for c in payload["cases"]} == expected
    if rlif_missing:
        assert "rlif" in payload["skipped_neurons"]
    for case in payload["cases"]:
        assert (case["T"], case["B"], case["N"]) in neurons.QUICK_SHAPES[case["neuron"]]
        assert 0 < case["firing_rate"] < 1  # spikes to check, not a silent or saturated layer
        libs = case["libraries"]
        # the loop and the peers installed here, each checked before it was timed
        assert {"spikefuse", "pytorch-loop"} <= set(libs)
        for name in neurons.ADAPTERS[case["neuron"]]:  # run, or skipped with the reason
            assert name in libs or name in payload["skipped_libraries"][case["neuron"]]
        grads = ({"x", "weight"} if case["neuron"] in ("rlif", "ralif") else
                 {"x", "decay", "threshold"} if case["neuron"] == "plif" else {"x"})
        for r in libs.values():
            assert r["check_passed"] is True
            assert r["spike_mismatch"] == 0.0
            assert set(r["grad_rel_err"]) == grads and max(r["grad_rel_err"].values()) < 1e-5
            assert r["ms"] > 0 and r["stream_ms"] > 0 and r["ratio_to_spikefuse"] > 0
            assert "peak_extra_mib" in r  # None off CUDA
        assert libs["spikefuse"]["ratio_to_spikefuse"] == 1.0
    md = (out / path.name.replace(".json", ".md")).read_text()
    assert "| alif | 4 | 2 | 8 | pytorch-loop |" in md and "Not measured" in md
    assert "| ralif | 4 | 2 | 8 | pytorch-loop |" in md and "ralif, norse: LSNNRecurrent" in md


def test_cross_check_rejects_other_equations():
    # the same CUBA with the reset detached from the spike: same spikes, other gradients
    problem = neurons.make_problem("cuba", 8, 4, 32, "cpu")
    base = neurons.cuba_loop(problem)()
    args = dict(neurons.CUBA, surrogate=neurons.SURROGATE, alpha=neurons.ALPHA)
    detached = neurons.loss_grads(reference.cuba(problem.x, **args, detach_reset=True), problem)
    check = neurons.compare(detached, base, ["x"])
    assert check["spike_mismatch"] == 0.0 and check["grad_rel_err"]["x"] > neurons.MAX_GRAD_REL_ERR
    assert check["check_passed"] is False
    assert neurons.compare(base, base, ["x"])["check_passed"] is True


@pytest.mark.parametrize("flag", ["--neurons", "--libraries"])
def test_unknown_names_are_usage_errors(tmp_path, capsys, flag):
    assert cli.main(["bench", "neurons", "--quick", flag, "nope", "--out", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err


def test_acceptance_reads_the_recurrent_case():
    T, B, N = neurons.ACCEPTANCE["shape"]
    row = {"ratio_to_spikefuse": 3.5, "stream_ratio_to_spikefuse": 4.0, "check_passed": True}
    cases = [{"neuron": "rlif", "T": T, "B": B, "N": N, "libraries": {"spikingjelly": row}}]
    assert neurons.acceptance(cases)["met"] is True
    slow = {"spikingjelly": {**row, "ratio_to_spikefuse": 2.9}}
    assert neurons.acceptance([{**cases[0], "libraries": slow}])["met"] is False
    assert neurons.acceptance([{**cases[0], "libraries": {}}]) is None  # SpikingJelly not installed


def test_quick_run_is_named_and_marked_quick(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["bench", "neurons", "--quick", "--neurons", "alif", "--libraries", "pytorch-loop",
                     "--out", str(out)]) == 0
    (path,) = out.glob("neurons-*.json")
    assert path.name.startswith("neurons-quick-") and json.loads(path.read_text())["quick"] is True
    assert path.with_suffix(".md").read_text().startswith("**Quick run (--quick)")
