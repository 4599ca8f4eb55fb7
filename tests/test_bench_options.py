"""Issue 36, item 3: every option of `spikefuse bench <part>` checked before anything is built or
measured: a bad value exits 2 with one line naming the option (spikefuse.bench.options).

Found: `bench train` checked none of its options (0, -1 and 2**70 batches, time steps and
iterations were measured, "--resnet-time-steps 1,x" raised int()'s ValueError, exit 1);
`bench steps` parsed its lists only after asking for CUDA and then raised int()'s ValueError
for "--batches 1,x", skipped unknown --modes silently and took --batches 0; `bench on` took
sizes, batches and time steps of 2**70 and a seed of 2**70 into torch (exit 1);
`bench sparse` took a NaN, infinite or negative --lr and, in --cases, an infinite or 1e300
width, a batch of 2**70 and a NaN theta; `bench sparse --train` checked none of --epochs,
--lr, --max-rate, --rate-weight, --rate-l1, --rate-log, --grad-threshold, --margin or the seeds' range;
`bench parallel` passed time steps, chunks and widths past what a worker can build, and 2**70
CPU processes, to the launcher; empty lists ("--libraries ,", "--neurons ,", "--only ,")
measured spikefuse alone, wrote a results file of no cases, or ran every part.
`bench runs` (issue 38) checks its options through the same helpers from the start.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from spikefuse import cli
from spikefuse.bench.command import BENCHMARKS

BIG = str(2**70)

CASES = {  # class of attack: [(argv after `bench`, the option the message names)]
    "junk in a list": [
        (["steps", "--batches", "1,x"], "--batches 1,x"),
        (["steps", "--compile-batches", "x"], "--compile-batches x"),
        (["train", "--resnet-time-steps", "1,x"], "--resnet-time-steps 1,x"),
        (["sparse", "--train", "--seeds", "1,x"], "--seeds"),
        (["runs", "--spikingjelly-mode", "graph,eager"], "--spikingjelly-mode graph,eager"),
    ],
    "an empty list": [
        (["lif", "--libraries", ","], "--libraries ,"),
        (["neurons", "--neurons", ","], "--neurons ,"),
        (["neurons", "--libraries", ","], "--libraries ,"),
        (["steps", "--nets", ","], "--nets ,"),
        (["steps", "--batches", ","], "--batches"),
        (["all", "--only", ","], "--only"),
        (["runs", "--tasks", ","], "--tasks ,"),
        (["runs", "--libraries", ","], "--libraries ,"),
    ],
    "an unknown name": [
        (["steps", "--nets", "nope"], "--nets nope"),
        (["steps", "--modes", "nope"], "--modes nope"),
        (["steps", "--compile-nets", "nope"], "--compile-nets nope"),
        (["steps", "--peer-modes", "nope"], "--peer-modes nope"),
        (["steps", "--precisions", "fp8"], "--precisions fp8"),
        (["steps", "--widths", "1,x"], "--widths 1,x"),
        (["steps", "--widths", "inf"], "--widths"),
        (["steps", "--rounds", "0"], "--rounds"),
        (["neurons", "--neurons", "nope"], "--neurons nope"),
        (["lif", "--libraries", "nope"], "--libraries nope"),
        (["runs", "--tasks", "randman:nope"], "--tasks randman:nope"),
        (["runs", "--libraries", "sinabs"], "--libraries sinabs"),
        (["runs", "--spikingjelly-mode", "fastest"], "--spikingjelly-mode fastest"),
    ],
    "a count of 0, -1 or 2**70": [
        *[(["train", option, value], option) for option in ("--batch", "--time-steps", "--resnet-batch", "--iters")
          for value in ("0", "-1", BIG)],
        *[(["train", "--resnet-time-steps", value], "--resnet-time-steps") for value in ("0", BIG)],
        *[(["steps", "--batches", value], "--batches") for value in ("0", "-1", BIG)],
        *[(["on", option, BIG], option) for option in ("--sizes", "--batch", "--time-steps")],
        (["sparse", "--train", "--epochs", "0"], "--epochs"),
        (["sparse", "--train", "--epochs", BIG], "--epochs"),
        *[(["runs", "--epochs", value], "--epochs") for value in ("0", "-1", BIG)],
        *[(["parallel", "--parts", "pipeline", "--device", "cpu", option, BIG], option)
          for option in ("--gpus", "--time-steps", "--chunks")],
    ],
    "a seed past 64 bits": [
        (["on", "--seed", BIG], "--seed"),
        (["sparse", "--train", "--seeds", BIG], "--seeds"),
        (["runs", "--seed", BIG], "--seed"),
    ],
    "a real that is NaN, infinite, negative or past float32": [
        *[(["sparse", "--lr", value], "--lr") for value in ("nan", "inf", "-1", "1e300", "1e38")],
        *[(["sparse", "--train", option, value], option)
          for option in ("--lr", "--max-rate", "--rate-weight", "--rate-l1", "--rate-log", "--margin")
          for value in ("nan", "inf", "-1", "1e300")],
        (["sparse", "--train", "--lr", "1e38"], "--lr must be at most 3.4e+37"),  # Adam's first step: 1e39
        *[(["sparse", "--train", "--grad-threshold", value], "--grad-threshold") for value in ("nan", "inf")],
        *[(["runs", option, value], option) for option in ("--lr", "--margin")
          for value in ("nan", "inf", "-1", "1e300")],
        *[(["runs", "--time-cap", value], "--time-cap") for value in ("nan", "inf", "-1", "0")],
        (["parallel", "--parts", "pipeline", "--device", "cpu", "--gpus", "2", "--width", "1e300"], "--width"),
    ],
    "a case that cannot be built": [
        *[(["sparse", "--cases", case], "--cases") for case in
          ("ipu-shd:inf:2:0.9", "ipu-shd:1e300:2:0.9", f"ipu-shd:1:{BIG}:0.9", "ipu-shd:1:2:nan")],
        *[(["sparse", "--train", "--cases", case], "--cases") for case in
          ("randman:ff:inf:8", "randman:ff:1e300:8", f"randman:ff:1:{BIG}")],
    ],
}
PARAMS = [pytest.param(argv, option, id=f"{attack}: {' '.join(argv)}")
          for attack, cases in CASES.items() for argv, option in cases]


@pytest.mark.parametrize("argv, option", PARAMS)
def test_bad_options_exit_2_naming_the_option(argv, option, tmp_path, capsys, monkeypatch):
    """Checked before the device: with CUDA reported present, a bad option is still what is said
    (bench steps and sparse used to look for CUDA first, and parse their lists after it)."""
    # imported before CUDA is faked: a kernel module imported under the fake (spikefuse.parallel's
    # sync_bn -> ops.bn_lif, which bench sparse --train imports) reads the CPU build's missing CUDA stream
    for module in (BENCHMARKS[argv[0]][0], "spikefuse.bench.sparse_train", "spikefuse.parallel"):
        importlib.import_module(module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cli.main(["bench", argv[0], "--out", str(tmp_path / "out"), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()  # nothing written: refused before the run began


def test_valid_lists_still_parse():
    from types import SimpleNamespace

    from spikefuse.bench import options, steps
    assert options.counts("--batches", " 1, 8,") == [1, 8] and options.counts("--x", "", empty=True) == []
    args = SimpleNamespace(nets="ipu-shd", batches="1,8", widths="1,4", precisions="fp32,bf16", modes="eager",
                           peer_modes="graph", no_peers=False, rounds=3, compile_batches="", compile_nets=",",
                           smoke=False)
    assert steps.check_args(args) == (["eager"], ["graph"], set(), set())
    assert options.width("--width", 0.005, 2048) == 0.005
