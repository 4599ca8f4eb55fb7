"""`spikefuse bench on`: the Open Neuromorphic benchmark, corrected.

One layer, Linear(N, N) without bias then LIF, on a fixed random input x [T, B, N] drawn from
a seeded generator (N in 4096, 8192, 16384; B = 16; T = 500). Every library runs the same
equations, on the same weight W and input:

    y[t] = W x[t]
    h[t] = 0.5 v[t-1] + y[t]              (v[-1] = 0)
    s[t] = 1 if h[t] >= 1 else 0
    v[t] = h[t] (1 - s[t])                hard reset to 0 in the step that fires, not detached
    backward: ds/dh = 1 / (|h - 1| + 1)^2 (SuperSpike) in every library

Two modes: forward only (under torch.no_grad for everyone) and forward+backward (loss =
sum(s * g) for a fixed random g, gradients of W and x). Two precisions: float32 (TF32 matmuls
for everyone) and bfloat16 (torch.autocast for everyone, spikefuse included: the way a user
runs any of them in bf16). The entries and how each is set to the equations: bench/peers.py
(LAYERS). Before a library is timed, its spikes (both modes) and, in float32, its gradients are
compared with spikefuse's; a float32 row outside the tolerances is flagged, bf16 agreement is
only reported (each library rounds its neuron differently).

The libraries and the floor's GEMMs are timed in alternating rounds (timing.in_rounds: drift on
a shared GPU hits all alike, and each row's spread over its rounds is reported); a time is the
median of its round medians, each a median of CUDA-event spans after at least 0.2 s of warm-up. Peak
memory is what a call allocates beyond what was allocated before it. Beside each row, the
floor: the call's GEMMs, each timed alone in the steady state on tensors of its shape and precision
(forward: F.linear; forward+backward adds the input gradient g W and the weight gradient
g^T x), plus the neuron's bytes (forward: read y, write s; forward+backward: 5 accesses, as
in `bench lif`) at the device-to-device copy bandwidth. A row below its floor (x floor < 1)
is marked: the floor is then not a bound on that row, and the report says so.

What the original benchmark got wrong: its timer never synchronised the GPU, each library ran
different neuron parameters, and its Norse entry ran the one-step cell once, not a time loop.
On a CPU the flow runs with wall-clock times at toy sizes (tests): not the benchmark's figures.
"""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import importlib.util
import io
import os
import statistics
import time
from dataclasses import dataclass

import torch

from spikefuse.precision import applied as float32_math
from spikefuse.errors import UsageError, one_line

from . import peers
from .options import count, names, seed
from .report import atomic_write, environment, table, write_results
from .timing import copy_bandwidth_gbs, in_rounds, median_ms, peak_extra_mib

SIZES = [4096, 8192, 16384]
BATCH, TIME_STEPS = 16, 500
PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("forward", "forward-backward")
NEURON_ACCESSES = {"forward": 2, "forward-backward": 5}  # tensors of T B N elements the LIF must move
MAX_SPIKE_MISMATCH = 1e-4  # float32: fraction of spikes that may differ (h exactly at threshold)
MAX_GRAD_REL_ERR = 1e-2  # float32: |g - g_spikefuse| / |g_spikefuse|
# Libraries are timed in alternating rounds (timing.in_rounds): a round times each call after at
# least 0.2 s of its own warm-up (the clocks settle to its load, whatever ran before), for at least
# 2 reps; the per-step loops (~0.1-0.5 s a call at N = 16384) get 2 a round
ROUNDS = 5
ROUND_TIMING = {"warmup": 1, "warmup_s": 0.2, "min_reps": 2, "max_reps": 10, "budget_s": 0.15}
# the floor's GEMMs: timed in the same rounds, in the steady state (queued back to back)
FLOOR_TIMING = {"warmup": 2, "warmup_s": 0.2, "min_reps": 3, "max_reps": 20, "budget_s": 0.3, "back_to_back": 5}
# --quick, a smoke test: options left at their defaults take QUICK; 2 rounds of 2 calls, no settling
QUICK = {"sizes": [64, 128], "time_steps": 8, "batch": 2}
QUICK_ROUNDS, QUICK_TIMING = 2, {"warmup": 1, "min_reps": 2, "max_reps": 2, "budget_s": 0.0}
EQUATIONS = (f"y[t] = W x[t] (Linear, no bias); h[t] = {peers.DECAY} v[t-1] + y[t], v[-1] = 0; "
             f"s[t] = 1 if h[t] >= {peers.THRESHOLD} else 0; v[t] = h[t] (1 - s[t]) (hard reset to 0 in the "
             f"step that fires, not detached); backward ds/dh = 1/(|h - {peers.THRESHOLD}| + 1)^2 (SuperSpike)")
NOT_IN_LAYERS = {"lava-dl": "lava.lib.dl"}  # peers with no adapter: noted, never timed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON, markdown and the chart")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, metavar="N",
                        help=f"layer widths (default: {' '.join(map(str, SIZES))})")
    parser.add_argument("--batch", type=int, default=BATCH, help=f"batch size (default {BATCH})")
    parser.add_argument("--time-steps", type=int, default=TIME_STEPS, help=f"time steps (default {TIME_STEPS})")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated subset of "
                        + ",".join(PRECISIONS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--libraries", default=",".join(peers.LAYERS),
                        help="comma-separated subset of " + ",".join(peers.LAYERS) + " (spikefuse always runs)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto: cuda where present; cpu checks the flow at toy sizes (not the benchmark)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight, input and loss weights")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: unless given, --sizes 64 128 --time-steps 8 --batch 2; "
                             f"{QUICK_ROUNDS} rounds of 2 calls; written as on-quick-<device>")


def check_args(args) -> tuple[str, list[str], list[str], list[str]]:
    """(device, precisions, modes, libraries); UsageError naming the bad option."""
    # 2**70 failed inside torch.randn (exit 1), a seed of 2**70 inside torch.Generator
    for name, value in (("--batch", args.batch), ("--time-steps", args.time_steps)):
        count(name, value)
    for size in args.sizes:
        count("--sizes", size)
    seed("--seed", args.seed)
    precisions, modes = names("--precisions", args.precisions, PRECISIONS), names("--modes", args.modes, MODES)
    libraries = ["spikefuse"] + [n for n in names("--libraries", args.libraries, peers.LAYERS) if n != "spikefuse"]
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (--device cpu runs the flow at toy sizes)")
    return device, precisions, modes, libraries


# ---- one case's tensors and calls ----

@dataclass
class Settings:
    """What every case of a run shares."""
    device: str
    T: int
    B: int
    seed: int
    modes: list[str]
    bandwidth: float | None  # device-to-device copy GB/s, measured in the run (None off CUDA)
    quick: bool = False  # --quick: QUICK_ROUNDS rounds of QUICK_TIMING


@dataclass
class Problem:
    """One case's tensors, the same for every library."""
    weight: torch.Tensor  # [N, N] ~ N(0, 1/N)
    x: torch.Tensor  # [T, B, N] ~ N(0.5, 1), a leaf that requires grad
    g: torch.Tensor  # [T, B, N] ~ N(0, 1): loss = sum(s * g)


def make_problem(N: int, T: int, B: int, device: str, seed: int) -> Problem:
    """y = W x stays near N(0, 1.25) at every N: a firing rate near 0.15."""
    gen = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(N, N, generator=gen, device=device) / N**0.5
    x = torch.randn(T, B, N, generator=gen, device=device) + 0.5
    g = torch.randn(T, B, N, generator=gen, device=device)
    return Problem(weight, x.requires_grad_(True), g)


def calls(layer: peers.Layer, x, g, precision: str, device: str) -> dict:
    """mode -> call(): the forward under no_grad returns spikes; the forward+backward returns
    (spikes, (grad of x, grad of W)). bf16: autocast around the forward, as a user writes it."""
    bf16 = precision == "bfloat16"

    def forward():
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            return layer.run(x)

    def forward_backward():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            spikes = layer.run(x)
        return spikes, torch.autograd.grad((spikes.float() * g).sum(), [x, layer.weight])
    return {"forward": forward, "forward-backward": forward_backward}


def time_ms(call, device: str, timing: dict) -> float:
    """Median ms: CUDA events after warm-up on CUDA; on the CPU a wall clock, 3 runs after one
    (timing.median_ms uses CUDA events whenever CUDA exists, even around CPU work)."""
    if device == "cuda":
        return median_ms(call, **timing)[0]
    call()
    call()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# ---- floors ----

def floor_gemms(N, T, B, precision, device) -> dict:
    """The call's GEMMs on tensors of their shape and precision, each to be timed alone in the
    steady state: forward F.linear (the libraries' own op); backward the input gradient g W and
    the weight gradient g^T x."""
    dtype = PRECISIONS[precision]
    x = torch.randn(T * B, N, device=device, dtype=dtype)
    w = torch.randn(N, N, device=device, dtype=dtype)
    g = torch.randn(T * B, N, device=device, dtype=dtype)
    return {"forward": lambda: torch.nn.functional.linear(x, w), "input_grad": lambda: g @ w,
            "weight_grad": lambda: g.t() @ x}


def floor_from(gemm: dict, N, T, B, precision, bandwidth) -> dict:
    """Per mode, the floor: the call's GEMMs (ms each, measured in the run) plus the LIF's bytes
    at the copy bandwidth (None off CUDA: not measured)."""
    element = torch.finfo(PRECISIONS[precision]).bits // 8  # the Linear's output: bf16 under autocast
    floor = {"matmul_ms": gemm["forward"], "gemm_ms": gemm,
             "matmul_tflops": 2 * T * B * N * N / (gemm["forward"] * 1e-3) / 1e12}
    for mode in MODES:
        neuron_ms = (NEURON_ACCESSES[mode] * element * T * B * N / (bandwidth * 1e9) * 1e3) if bandwidth else None
        matmuls_ms = gemm["forward"] + (gemm["input_grad"] + gemm["weight_grad"] if mode == "forward-backward" else 0)
        floor[mode] = {"matmul_ms": matmuls_ms, "neuron_ms": neuron_ms,
                       "ms": matmuls_ms + neuron_ms if neuron_ms is not None else None}
    return floor


# ---- measuring one library ----

def compare(spikes, base_spikes) -> float:
    return (spikes.float() == base_spikes.float()).float().mean().item()


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check(run, modes, base) -> tuple[dict, tuple]:
    """(the row's cross-check, (spikes, grads) of its forward+backward): spikes of both modes
    and gradients against `base`, spikefuse's (None for spikefuse itself: then its forward
    and a second forward+backward are checked against its first forward+backward)."""
    forward_spikes = run["forward"]() if "forward" in modes else None
    spikes, grads = run["forward-backward"]()
    if base is None:
        base = (spikes, grads)
        spikes, grads = run["forward-backward"]()
    agreement = {"forward-backward": compare(spikes, base[0])}
    if forward_spikes is not None:
        agreement["forward"] = compare(forward_spikes, base[0])
    errors = {"x": rel_err(grads[0], base[1][0]), "weight": rel_err(grads[1], base[1][1])}
    return {"spike_agreement": agreement, "grad_rel_err": errors}, base


def cross_check(layer, problem, precision, settings, base) -> tuple[dict, dict, tuple]:
    """(row, calls, base): the library's spikes and gradients checked against spikefuse's
    `base`, and its calls per mode, ready to be timed."""
    run = calls(layer, problem.x, problem.g, precision, settings.device)
    row, base = check(run, settings.modes, base)
    agreement, errors = row["spike_agreement"], row["grad_rel_err"]
    row["backend"] = layer.backend()
    row["check_passed"] = ((min(agreement.values()) >= 1 - MAX_SPIKE_MISMATCH and max(errors.values()) <= MAX_GRAD_REL_ERR)
                           if precision == "float32" else None)  # bf16: reported, not judged
    return row, run, base


def timing_of(quick: bool) -> tuple[int, dict, dict]:
    """(rounds, a library call's timing per round, a floor GEMM's timing per round)."""
    return (QUICK_ROUNDS, QUICK_TIMING, QUICK_TIMING) if quick else (ROUNDS, ROUND_TIMING, FLOOR_TIMING)


def time_rows(rows, runs, gemms, settings) -> dict:
    """Each checked library's calls and the floor's GEMMs timed in alternating rounds
    (timing.in_rounds), so the floor drifts with the entries it bounds: per library and mode
    the median of its round medians, the rounds themselves and their spread, then the call's
    peak memory; a library whose call fails becomes an error row. Returns the GEMMs' medians."""
    cuda, device = settings.device == "cuda", settings.device
    rounds, round_timing, floor_timing = timing_of(settings.quick)
    timed = {("floor", name): (lambda call=call: time_ms(call, device, floor_timing)) for name, call in gemms.items()}
    timed.update({(name, mode): (lambda call=run[mode]: time_ms(call, device, round_timing))
                  for name, run in runs.items() for mode in settings.modes})
    times, errors = in_rounds(lambda measure: measure(), timed, rounds)
    for name in gemms:
        if ("floor", name) in errors:  # no floor, no report: the run stops with the reason
            raise errors[("floor", name)]
    for name, run in runs.items():
        failed = [errors[(name, mode)] for mode in settings.modes if (name, mode) in errors]
        if failed:
            rows[name] = {"error": one_line(failed[0])}
            continue
        for mode in settings.modes:
            rounds = times[(name, mode)]
            ms = statistics.median(rounds)
            rows[name][mode] = {"ms": ms, "round_ms": rounds, "spread": (max(rounds) - min(rounds)) / ms,
                                "peak_extra_mib": peak_extra_mib(run[mode]) if cuda else None}
    return {name: statistics.median(times[("floor", name)]) for name in gemms}


def measure_case(N, precision, settings, libraries, skipped) -> dict:
    T, B, modes = settings.T, settings.B, settings.modes
    gemms = floor_gemms(N, T, B, precision, settings.device)
    problem = make_problem(N, T, B, settings.device, settings.seed)
    rows, runs, base = {}, {}, None
    for name in libraries:  # build and cross-check every library; all stay resident for the rounds
        if name != "spikefuse" and base is None:  # spikefuse failed: nothing to check against
            rows[name] = {"error": "not run: spikefuse's own run failed, so there is nothing to cross-check against"}
            continue
        try:
            layer = peers.LAYERS[name](problem.weight)
        except ImportError as error:
            skipped[name] = f"not installed: {one_line(error)}"
            continue
        except Exception as error:  # noqa: BLE001 -- reported, the others still run
            skipped[name] = f"failed to build: {one_line(error)}"
            continue
        try:
            rows[name], runs[name], found = cross_check(layer, problem, precision, settings, base)
            base = base or found  # spikefuse's: it runs first
        except Exception as error:  # noqa: BLE001 -- out of memory, a kernel that fails: a row, not the end
            rows[name] = {"error": one_line(error)}
    floor = floor_from(time_rows(rows, runs, gemms, settings), N, T, B, precision, settings.bandwidth)
    rate = base[0].float().mean().item() if base else None
    del runs, base, gemms
    gc.collect()
    if settings.device == "cuda":
        torch.cuda.empty_cache()
    ours = rows.get("spikefuse", {})
    for row in rows.values():
        for mode in modes:
            if mode in row:
                row[mode]["ratio_to_floor"] = row[mode]["ms"] / floor[mode]["ms"] if floor[mode]["ms"] else None
                row[mode]["ratio_to_spikefuse"] = row[mode]["ms"] / ours[mode]["ms"] if mode in ours else None
    return {"N": N, "T": T, "B": B, "precision": precision, "firing_rate": rate, "floor": floor, "libraries": rows,
            "standing": standing(rows, modes)}


def standing(rows, modes) -> dict:
    """Per mode, where spikefuse stands in time and in peak memory: 'first', 'tie' (behind the
    best entry by less than the run-to-run spread: the two entries' rounds overlap; memory:
    within 1 %), or 'behind'; with the best other entry and spikefuse over it."""
    measured = {name: r for name, r in rows.items() if "error" not in r}
    ours, others = measured.get("spikefuse"), {n: r for n, r in measured.items() if n != "spikefuse"}
    result = {}
    for mode in modes:
        if ours is None or not others:
            result[mode] = None
            continue
        fastest = min(others, key=lambda n: others[n][mode]["ms"])
        mine, theirs = ours[mode], others[fastest][mode]
        time = ("first" if mine["ms"] <= theirs["ms"] else
                "tie" if min(mine["round_ms"]) <= max(theirs["round_ms"]) else "behind")
        entry = {"time": time, "fastest_other": fastest, "ms_over_fastest_other": mine["ms"] / theirs["ms"]}
        if mine["peak_extra_mib"] is not None:
            leanest = min(others, key=lambda n: others[n][mode]["peak_extra_mib"])
            ratio = mine["peak_extra_mib"] / max(others[leanest][mode]["peak_extra_mib"], 1e-9)
            entry.update(memory="first" if ratio < 0.99 else "tie" if ratio <= 1.01 else "behind",
                         leanest_other=leanest, memory_over_leanest_other=ratio)
        result[mode] = entry
    return result


# ---- the run ----

def run(args) -> int:
    if args.quick:
        defaults = {"sizes": SIZES, "time_steps": TIME_STEPS, "batch": BATCH}
        for name, value in QUICK.items():
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
    device, precisions, modes, libraries = check_args(args)
    bandwidth = (copy_bandwidth_gbs(2**26 if args.quick else 2**31) if device == "cuda" else None)
    settings = Settings(device, args.time_steps, args.batch, args.seed, modes, bandwidth, args.quick)
    skipped = not_in_layers()
    cases = []
    with float32_math("fp32"):  # float32 matmuls in TF32 for every library and the floor; the caller's after
        for precision in precisions:
            for N in args.sizes:
                case = measure_case(N, precision, settings, libraries, skipped)
                cases.append(case)
                print(summary_line(case, modes), flush=True)
                paths = save(args, device, modes, precisions, bandwidth, cases, skipped)  # a cut run keeps these
    flagged = [(c["precision"], c["N"], name) for c in cases for name, r in c["libraries"].items()
               if r.get("check_passed") is False or "error" in r]
    for precision, N, name in flagged:
        print(f"cross-check FAILED or run failed: {precision} N={N} {name}", flush=True)
    chart = write_chart(json_payload(paths[0]), os.path.splitext(paths[0])[0] + ".png")
    print("wrote", *paths, *([chart] if chart.endswith(".png") else []))
    if not chart.endswith(".png"):
        print(chart)
    return 0


def save(args, device, modes, precisions, bandwidth, cases, skipped):
    """on-<device>.json and .md with the cases measured so far; their paths."""
    flagged = [1 for c in cases for r in c["libraries"].values() if r.get("check_passed") is False or "error" in r]
    env = environment()
    env["versions"].update(versions("sinabs", "lava-dl"))
    rounds, round_timing, floor_timing = timing_of(args.quick)
    payload = {
        "benchmark": "on", "environment": env, "device_type": device, "quick": args.quick,
        "note": None if device == "cuda" else "CPU run: wall-clock times at toy sizes, to check the flow; "
                                              "not the benchmark's figures (those need a CUDA GPU)",
        "equations": EQUATIONS, "modes": modes, "precisions": precisions,
        "settings": {"T": args.time_steps, "B": args.batch, "sizes": args.sizes, "seed": args.seed,
                     "tf32_matmul": device == "cuda",
                     "timing": {"rounds": rounds, "per_round": round_timing if device == "cuda" else "wall clock",
                                "floor_gemms_per_round": floor_timing if device == "cuda" else "wall clock"}},
        "inputs": "W ~ N(0, 1/N), x ~ N(0.5, 1), g ~ N(0, 1) from torch.Generator(seed); loss = sum(s * g)",
        "copy_bandwidth_gbs": bandwidth,
        "tolerances": {"spike_mismatch": MAX_SPIKE_MISMATCH, "grad_rel_err": MAX_GRAD_REL_ERR,
                       "applies_to": "float32; bfloat16 agreement is reported only"},
        "all_checks_passed": not flagged, "cases": cases, "skipped_libraries": skipped,
    }
    return write_results("on", payload, markdown(payload), args.out)


def json_payload(path):
    with open(path) as f:
        return json.load(f)


def not_in_layers() -> dict:
    """Peers this benchmark has no adapter for: why each is not measured."""
    notes = {}
    for name, module in NOT_IN_LAYERS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        notes[name] = ("installed, but this benchmark has no adapter setting its SLAYER neuron to the equations"
                       if found else f"not installed ({module} is not importable)")
    return notes


def versions(*packages) -> dict:
    found = {}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def standing_table(payload) -> str:
    """Where spikefuse stands in each case: first, tie (within the rounds' spread; memory within
    1 %) or behind, against the fastest and the leanest other entry."""
    rows = []
    for c in payload["cases"]:
        for mode in payload["modes"]:
            st = c.get("standing", {}).get(mode)
            if st is None:
                continue
            ours = c["libraries"]["spikefuse"][mode]
            rows.append([c["precision"], mode, c["N"], st["time"], st["fastest_other"], st["ms_over_fastest_other"],
                         f"{ours['spread']:.1%} / {c['libraries'][st['fastest_other']][mode]['spread']:.1%}",
                         ours["ratio_to_floor"], st.get("memory"), st.get("leanest_other"),
                         st.get("memory_over_leanest_other")])
    return ("## Where spikefuse stands\n\n*time*: first, tie (slower than the fastest other entry by less than "
            "the run-to-run spread: some round of spikefuse's was as fast as some round of the other's) or "
            "behind; *memory*: first, tie (within 1 %) or behind the leanest other entry.\n\n"
            + table(["precision", "mode", "N", "time", "fastest other", "spikefuse x it", "spread (ours / its)",
                     "spikefuse x floor", "memory", "leanest other", "spikefuse x it"], rows))


def summary_line(case, modes) -> str:
    floors = "/".join(f"{case['floor'][m]['ms'] or case['floor'][m]['matmul_ms']:.3g}" for m in modes)
    head = f"{case['precision']} N={case['N']} ({'/'.join(modes)} ms; floor {floors}):"
    parts = []
    for name, r in case["libraries"].items():
        if "error" in r:
            parts.append(f"{name} ERROR {r['error']}")
            continue
        times = "/".join(f"{r[m]['ms']:.3g}" for m in modes)
        flag = " CHECK FAILED" if r["check_passed"] is False else ""
        parts.append(f"{name} {times} agree={min(r['spike_agreement'].values()):.4f}{flag}")
    standing = "; ".join(f"{m}: time {st['time']}, memory {st.get('memory')}"
                         for m, st in case["standing"].items() if st is not None)
    return head + " " + " | ".join(parts) + (f" || spikefuse {standing}" if standing else "")


def markdown(payload) -> str:
    env = payload["environment"]
    out = [f"# The Open Neuromorphic benchmark, corrected: Linear(N, N) + LIF\n\n{env['device']}, {env['date']}, "
           f"versions {env['versions']}\n"]
    if payload["note"]:
        out.append(f"**{payload['note']}.**\n")
    s = payload["settings"]
    bandwidth = payload["copy_bandwidth_gbs"]
    rounds = s["timing"]["rounds"]
    timing = (f"the libraries and the floor's GEMMs timed in {rounds} alternating rounds (each round times every "
              "call in turn, starting further along the list each time, so drift on a shared GPU hits all alike); "
              "a row's time is the median of its round medians, each "
              "a median of CUDA-event spans after at least 0.2 s of the call's own warm-up (the clocks settle "
              "to its load); *spread*: (slowest - fastest round) / time"
              if payload["device_type"] == "cuda" else
              f"wall clock, {rounds} alternating rounds of 3 calls, the median of the round medians")
    out.append(f"Equations (every library): {payload['equations']}. T={s['T']}, B={s['B']}. Inputs: "
               f"{payload['inputs']}. float32 matmuls in TF32: {'yes' if s['tf32_matmul'] else 'no'}; bfloat16 "
               "runs under torch.autocast for every library. *forward*: under torch.no_grad; *forward-backward*: "
               f"gradients of W and x. Times: {timing}. *x floor*: time over the floor measured in this run (the "
               "call's GEMMs, each timed alone in the steady state on its own shape, plus the LIF's bytes at the copy bandwidth, "
               + (f"{bandwidth:.0f} GB/s" if bandwidth else "not measured here") + "). *agreement*: the fraction "
               "of spikes equal to spikefuse's (spikefuse: to its own first call), lower of the two modes; "
               f"*check* (float32): at most {MAX_SPIKE_MISMATCH:g} of the spikes differ and both gradients "
               f"within {MAX_GRAD_REL_ERR:g} relative error.\n")
    header = ["N", "library", "neuron backend", "ms", "spread", "x floor", "x spikefuse", "peak extra MiB",
              "agreement", "grad rel err", "check"]
    for precision in payload["precisions"]:
        for mode in payload["modes"]:
            rows = []
            for case in (c for c in payload["cases"] if c["precision"] == precision):
                floor = case["floor"][mode]
                rows.append([case["N"], "floor", f"matmul {floor['matmul_ms']:.3g} ms + neuron "
                             + (f"{floor['neuron_ms']:.3g} ms" if floor["neuron_ms"] is not None else "not measured"),
                             floor["ms"], None, None, None, None, None, None, None])
                for name, r in case["libraries"].items():
                    if "error" in r:
                        rows.append([case["N"], name, f"error: {r['error']}"] + [None] * 8)
                        continue
                    m = r[mode]
                    check = {True: "pass", False: "FAILED", None: "reported only"}[r["check_passed"]]
                    ratio = m["ratio_to_floor"]
                    below = ratio is not None and ratio < 1  # then the floor is no bound here: say so
                    rows.append([case["N"], name, r["backend"], m["ms"], f"{m['spread']:.1%}",
                                 f"{ratio:.3g} (below the floor)" if below
                                 else ratio, m["ratio_to_spikefuse"],
                                 m["peak_extra_mib"], min(r["spike_agreement"].values()),
                                 max(r["grad_rel_err"].values()), check])
            out.append(f"## {precision}, {mode}\n\n" + table(header, rows))
    out.append(standing_table(payload))
    floors = [[c["precision"], c["N"], c["firing_rate"], c["floor"]["matmul_ms"], c["floor"]["matmul_tflops"]]
              for c in payload["cases"]]
    out.append("## Matmul measured in the run\n\n" + table(["precision", "N", "firing rate", "matmul ms",
                                                             "TFLOP/s"], floors))
    if payload["skipped_libraries"]:
        out.append("Not measured:\n\n" + "\n".join(f"- {name}: {why}"
                                                   for name, why in payload["skipped_libraries"].items()) + "\n")
    return "\n".join(out)


# ---- the chart ----

NEAR_FLOOR = 3.0  # the lower panels show entries within this many times their floor


def write_chart(payload, path: str) -> str:
    """Time against N per precision and mode, one line per library, the floor dashed; below,
    per mode, time over the floor for the entries near it (both precisions, the rounds'
    range as error bars), where the upper panels' log scale puts them on top of each other.
    The PNG's path, or a note saying why there is none (matplotlib is an optional dependency)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "no chart: matplotlib is not installed (pip install 'spikefuse[plot]')"
    precisions, modes = payload["precisions"], payload["modes"]
    names = list(dict.fromkeys(n for c in payload["cases"] for n, r in c["libraries"].items() if "error" not in r))
    color = {name: f"C{k}" for k, name in enumerate(names)}
    fig = Figure(figsize=(5.5 * len(modes), 4.2 * (len(precisions) + 1)), layout="constrained")
    axes = fig.subplots(len(precisions) + 1, len(modes), squeeze=False)
    for i, precision in enumerate(precisions):
        cases = [c for c in payload["cases"] if c["precision"] == precision]
        sizes = [c["N"] for c in cases]
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for name in names:
                points = [(c["N"], c["libraries"][name][mode]["ms"]) for c in cases
                          if "error" not in c["libraries"].get(name, {"error": 1})]
                if points:
                    ax.plot(*zip(*points), marker="o", label=name, color=color[name])
            with_neuron = all(c["floor"][mode]["ms"] is not None for c in cases)
            floor = [c["floor"][mode]["ms"] if with_neuron else c["floor"][mode]["matmul_ms"] for c in cases]
            ax.plot(sizes, floor, "k--", label="floor (matmul + neuron)" if with_neuron else "matmul floor")
            ax.set_yscale("log")
            ax.set_ylabel("time per call, ms (log scale)")
            _n_axis(ax, sizes, f"{precision}, {mode}")
    for j, mode in enumerate(modes):
        _near_floor_panel(axes[-1][j], payload, mode, color)
    s = payload["settings"]
    fig.suptitle(f"Linear(N, N) + LIF, T={s['T']}, B={s['B']}, {payload['environment']['device']}"
                 + (" (CPU: not the benchmark)" if payload["note"] else "")
                 + (" (quick run: not benchmark figures)" if payload.get("quick") else ""))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write(path, buffer.getvalue())
    return path


def _n_axis(ax, sizes, title):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("neurons N (log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def _near_floor_panel(ax, payload, mode, color):
    """Time over the floor of the entries within NEAR_FLOOR of it, per precision (float32
    solid, bfloat16 dashed); error bars span the fastest to the slowest round."""
    sizes = sorted({c["N"] for c in payload["cases"]})
    for precision, style in zip(payload["precisions"], ("-", "--")):
        cases = [c for c in payload["cases"] if c["precision"] == precision and c["floor"][mode]["ms"]]
        for name in color:
            rows = [(c["N"], c["libraries"][name][mode], c["floor"][mode]["ms"]) for c in cases
                    if "error" not in c["libraries"].get(name, {"error": 1})]
            rows = [(n, r, f) for n, r, f in rows if r["ms"] / f <= NEAR_FLOOR]
            if not rows:
                continue
            ratio = [r["ms"] / f for _, r, f in rows]
            low = [r["ms"] / f - min(r.get("round_ms", [r["ms"]])) / f for _, r, f in rows]
            high = [max(r.get("round_ms", [r["ms"]])) / f - r["ms"] / f for _, r, f in rows]
            ax.errorbar([n for n, _, _ in rows], ratio, yerr=[low, high], marker="o", linestyle=style,
                        color=color[name], capsize=3, label=f"{name}, {precision}")
    ax.axhline(1.0, color="black", linestyle=":", label="floor")
    ax.set_ylabel("time over the floor (x)")
    _n_axis(ax, sizes, f"{mode}: entries within {NEAR_FLOOR:g}x their floor")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(p)
    raise SystemExit(run(p.parse_args()))
