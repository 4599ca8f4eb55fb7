"""`spikefuse bench lif`: LIF forward+backward against the bandwidth floor and the peers.

Every library runs the same neuron (decay 0.5, threshold 1, hard reset to 0) on the same
input; its spikes are checked against spikefuse's before it is timed, and spikefuse's
input gradient against the plain PyTorch loop's (same surrogate). The floor is the bytes
the minimal algorithm moves (x read, spikes written, grad_s read, grad_x written, and x or
a saved state read once more: 5 accesses, 20 B/element in float32, 10 in bfloat16) over
the device-to-device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import gc

import torch

from . import peers
from .options import names
from .report import environment, table, write_results
from .timing import captured, copy_bandwidth_gbs, median_ms, peak_extra_mib

MAIN_SHAPES = [(100, 64, 4096), (500, 16, 4096), (1000, 8, 8192)]
SWEEP_T = [32, 128, 512, 2048, 8192]
SWEEP_ELEMENTS = 2**26  # T * B * N held fixed across the sweep
SWEEP_BATCH = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOOP_LIBRARIES = ("pytorch-loop", "snntorch", "norse")  # one Python step per time step
BACK_TO_BACK = 10  # calls queued per timing in the throughput measurement
QUICK_TIMING = {"warmup": 1, "min_reps": 2, "max_reps": 2, "budget_s": 0.0}  # --quick: 2 timed calls


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON + markdown")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, 2 timed calls each: a smoke test (CPU too), written as lif-quick-<device>")
    parser.add_argument("--no-sweep", action="store_true", help="skip the fixed-work T sweep")
    parser.add_argument("--libraries", default=",".join(peers.ADAPTERS),
                        help="comma-separated subset of " + ",".join(peers.ADAPTERS))


def make_inputs(T, B, N, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(T, B, N, generator=g, device=device) * 0.6 + 0.4).to(dtype)
    grad = torch.randn(T, B, N, generator=g, device=device).to(dtype)
    return x.requires_grad_(True), grad


def forward_backward(run, x, grad):
    spikes = run(x)
    (gx,) = torch.autograd.grad(spikes, x, grad)
    return spikes, gx


def captured_forward_backward(run, x, grad):
    """(replay, spikes): one forward+backward captured in a CUDA graph, as a training loop
    with static shapes would run it (the host then issues one launch per call)."""
    # a fresh leaf: x's autograd node from the eager calls belongs to the default stream, and
    # the warm-ups (spikefuse.bench.timing.captured) run on a side stream
    x = x.detach().clone().requires_grad_(True)
    replay, (spikes, _) = captured(lambda: forward_backward(run, x, grad))
    return replay, spikes


def measure_graph(run, x, grad, ours_spikes, quick=False):
    """spikefuse's forward+backward replayed from a CUDA graph: spikes checked, then timed."""
    replay, spikes = captured_forward_backward(run, x, grad)
    torch.cuda.synchronize()
    agree = (spikes.float() == ours_spikes.float()).float().mean().item()
    timing = QUICK_TIMING if quick else {"budget_s": 2.0}
    ms, _ = median_ms(replay, **timing)
    stream_ms, _ = median_ms(replay, back_to_back=BACK_TO_BACK, **timing)
    return {"ms": ms, "stream_ms": stream_ms, "peak_extra_mib": None, "spike_agreement": agree,
            "grad_rel_err_vs_loop": None}


def measure_case(libs, T, B, N, dtype, device, bandwidth, floor_bytes, quick=False):
    x, grad = make_inputs(T, B, N, dtype, device)
    ours_spikes, ours_gx = forward_backward(libs["spikefuse"], x, grad)
    rate = ours_spikes.float().mean().item()
    rows = {}
    for name, run in libs.items():
        spikes, gx = forward_backward(run, x, grad)
        agree = (spikes.float() == ours_spikes.float()).float().mean().item()
        grad_err = None
        if name == "pytorch-loop":  # same surrogate: the gradients must agree too
            grad_err = ((gx.float() - ours_gx.float()).norm() / ours_gx.float().norm()).item()
        del spikes, gx
        loop = name in LOOP_LIBRARIES
        call = lambda: forward_backward(run, x, grad)  # noqa: E731
        timing = QUICK_TIMING if quick else {"budget_s": 1.0 if loop else 2.0}
        ms, _ = median_ms(call, **timing)
        stream_ms, _ = median_ms(call, back_to_back=2 if loop else BACK_TO_BACK, **timing)
        mem = peak_extra_mib(call)
        rows[name] = {"ms": ms, "stream_ms": stream_ms, "peak_extra_mib": mem, "spike_agreement": agree,
                      "grad_rel_err_vs_loop": grad_err}
        gc.collect()
    if device == "cuda":
        try:
            rows["spikefuse-cuda-graph"] = measure_graph(libs["spikefuse"], x, grad, ours_spikes, quick)
        except RuntimeError as error:  # reported, not fatal: the eager rows are the benchmark
            print(f"CUDA graph capture failed: {error}", flush=True)
    floor_ms = floor_bytes * T * B * N / (bandwidth * 1e9) * 1e3 if bandwidth else None
    ours, ours_stream = rows["spikefuse"]["ms"], rows["spikefuse"]["stream_ms"]
    for r in rows.values():
        r["ratio_to_spikefuse"] = r["ms"] / ours
        r["stream_ratio_to_spikefuse"] = r["stream_ms"] / ours_stream
        r["ratio_to_floor"] = r["ms"] / floor_ms if floor_ms else None
        r["stream_ratio_to_floor"] = r["stream_ms"] / floor_ms if floor_ms else None
    return {"T": T, "B": B, "N": N, "dtype": str(dtype).replace("torch.", ""),
            "firing_rate": rate, "floor_ms": floor_ms, "libraries": rows}


def run(args) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wanted = set(names("--libraries", args.libraries, peers.ADAPTERS))  # "," measured spikefuse alone
    libs = {k: v for k, v in peers.available().items() if k in wanted | {"spikefuse"}}
    not_installed = sorted(wanted - set(libs) - {"spikefuse"})
    if not_installed:
        print(f"not installed, skipped: {', '.join(not_installed)}", flush=True)
    bandwidth = copy_bandwidth_gbs(2**26) if args.quick else copy_bandwidth_gbs()
    shapes = [(8, 2, 64), (16, 2, 96)] if args.quick else MAIN_SHAPES
    cases = []
    for dtype_name, dtype in DTYPES.items():
        floor_bytes = 5 * torch.finfo(dtype).bits // 8
        for T, B, N in shapes:
            case = measure_case(libs, T, B, N, dtype, device, bandwidth, floor_bytes, args.quick)
            cases.append(case)
            print(summary_line(case), flush=True)
    sweep = []
    if not args.no_sweep:
        fast = {k: v for k, v in libs.items() if k not in LOOP_LIBRARIES}
        elements = 2**12 if args.quick else SWEEP_ELEMENTS
        for T in ([4, 16] if args.quick else SWEEP_T):
            N = elements // (T * SWEEP_BATCH)
            case = measure_case(fast, T, SWEEP_BATCH, N, torch.float32, device, bandwidth, 20, args.quick)
            case["ns_per_neuron_step"] = {k: r["ms"] * 1e6 / elements for k, r in case["libraries"].items()}
            sweep.append(case)
            print(summary_line(case), flush=True)
    payload = {"benchmark": "lif", "environment": environment(), "copy_bandwidth_gbs": bandwidth,
               "equations": "decay 0.5, threshold 1.0, hard reset to 0, rectangular surrogate (peers: their default surrogate)",
               "quick": args.quick, "not_installed": not_installed, "cases": cases, "time_sweep": sweep}
    paths = write_results("lif", payload, markdown(payload), args.out)
    print("wrote", *paths)
    return 0


def summary_line(case):
    parts = [f"T={case['T']} B={case['B']} N={case['N']} {case['dtype']}:"]
    for name, r in case["libraries"].items():
        floor = (f" ({r['ratio_to_floor']:.2f}x floor; streamed {r['stream_ms']:.3f} ms, "
                 f"{r['stream_ratio_to_floor']:.2f}x)") if r["ratio_to_floor"] else ""
        parts.append(f"{name} {r['ms']:.3f} ms{floor} agree={r['spike_agreement']:.4f}")
    return " | ".join(parts)


def markdown(payload) -> str:
    env = payload["environment"]
    out = [f"# LIF forward+backward\n\n{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"Copy bandwidth measured in the run: {payload['copy_bandwidth_gbs']} GB/s. "
           f"Equations: {payload['equations']}.\n"]
    if payload.get("not_installed"):
        out.append(f"Not installed here, so not measured: {', '.join(payload['not_installed'])}.\n")
    out.append("Two timings per library, both medians of CUDA-event spans after warm-up: "
               "*call* is one forward+backward from an idle GPU (the host's time to its first "
               f"launch and any gap between launches count); *streamed* is {BACK_TO_BACK} calls "
               "queued back to back, divided by their number, timed after as many untimed calls "
               "queued just before them (the steady-state time per call of a training loop: "
               "the GPU's when the host keeps ahead, else the host's; loop libraries: 2 calls). "
               "*spikefuse-cuda-graph*: the same forward+backward captured once in a CUDA graph "
               "and replayed (spikes checked against the eager call; its memory is the graph's "
               "pool, not measured per call).\n")
    header = ["T", "B", "N", "dtype", "library", "call ms", "x floor", "x spikefuse", "streamed ms",
              "x floor", "x spikefuse", "peak extra MiB", "spike agreement"]
    rows = []
    for case in payload["cases"] + payload["time_sweep"]:
        for name, r in case["libraries"].items():
            rows.append([case["T"], case["B"], case["N"], case["dtype"], name, r["ms"], r["ratio_to_floor"],
                         r["ratio_to_spikefuse"], r["stream_ms"], r["stream_ratio_to_floor"],
                         r["stream_ratio_to_spikefuse"], r["peak_extra_mib"], r["spike_agreement"]])
    out.append(table(header, rows))
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(p)
    raise SystemExit(run(p.parse_args()))
