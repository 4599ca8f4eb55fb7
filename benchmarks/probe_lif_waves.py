"""Produces benchmarks/results/probe-lif-waves-<gpu>.json (argv[1]; on a GPU).

Where the fused LIF kernels lose time against the copy floor, per launch configuration.

For each (BLOCK, K, num_warps): the compiler's registers and spills per thread, the
programs that fit on one multiprocessor at once, the waves the grid needs, and the GPU
time of the forward and the backward kernel alone. Times are CUDA-graph replays of 20
calls (no host in the span), medians of 10 replays. Beside them, in the same run, the
same-size floors of the same traffic through PyTorch: a copy (the forward's: read 4 B,
write 4 B per element) and an add (the backward's: read 8 B, write 4 B), and the T sweep
gives each kernel's fixed cost (time = fixed + bytes / rate, least squares).

usage: python3 benchmarks/probe_lif_waves.py OUT.json
"""
import json
import statistics
import sys

import torch

import spikefuse.ops.lif as lif_ops

CALLS = 20
REGISTERS_PER_SM, MAX_WARPS_PER_SM, MAX_PROGRAMS_PER_SM = 65536, 64, 32


def graph_ms(fn):
    """GPU ms per fn() call: CALLS calls captured in one CUDA graph, median of 10 replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / CALLS)
    del graph
    return statistics.median(times)


def compiled_of(launcher, BLOCK, K, warps):
    """The compiled kernel a CachedLaunch holds for this configuration."""
    for key, compiled in launcher._compiled.items():
        meta = dict(item for item in key[1:] if isinstance(item, tuple) and len(item) == 2
                    and isinstance(item[0], str))
        if meta.get("BLOCK") == BLOCK and meta.get("K") == K and meta.get("num_warps") == warps:
            return compiled
    return None


def residency(compiled, warps, programs, sms):
    regs = compiled.n_regs
    per_warp = -(-regs * 32 // 256) * 256  # registers are given out per warp, 256 at a time
    by_regs = REGISTERS_PER_SM // (per_warp * warps) if regs else MAX_PROGRAMS_PER_SM
    per_sm = min(by_regs, MAX_WARPS_PER_SM // warps, MAX_PROGRAMS_PER_SM)
    return {"regs": regs, "spills": compiled.n_spills, "programs_per_sm": per_sm,
            "waves": programs / (per_sm * sms)}


def probe_config(x, grad, BLOCK, K, warps, sms):
    lif_ops.launch_config = lambda N, dtype: (BLOCK, K, warps)
    T, N = x.shape[0], x[0].numel()
    _, _, xs, ckpt = lif_ops._forward(x, 0.5, None, None, 1.0, "hard", 0.0, True, False)
    fwd = graph_ms(lambda: lif_ops._forward(x, 0.5, None, None, 1.0, "hard", 0.0, True, False))
    bwd = graph_ms(lambda: lif_ops._backward(grad, None, xs, ckpt, 0.5, None, 1.0, "hard", 0.0,
                                             False, "rectangular", 1.0, False, False))
    programs = -(-N // BLOCK)
    row = {"cfg": [BLOCK, K, warps], "T": T, "N": N, "dtype": str(x.dtype), "fwd_ms": fwd, "bwd_ms": bwd}
    for name, launcher in (("fwd", lif_ops._lif_forward_kernel), ("bwd", lif_ops._lif_backward_kernel)):
        compiled = compiled_of(launcher, BLOCK, K, warps)
        if compiled is not None:
            row[name] = residency(compiled, warps, programs, sms)
    return row


def same_size_floors(x, grad):
    out = torch.empty_like(x)
    return {"copy_ms": graph_ms(lambda: out.copy_(x)),
            "add_ms": graph_ms(lambda: torch.add(x, grad, out=out))}


def fixed_cost(rows, key, bytes_per_element):
    """Least-squares fit time = fixed + bytes / rate over rows of one configuration."""
    xs = [r["T"] * r["N"] * bytes_per_element for r in rows]
    ys = [r[key] for r in rows]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
    return {"fixed_us": (my - slope * mx) * 1e3, "rate_gbs": 1e-6 / slope}


def main(path):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    original = lif_ops.launch_config
    results = {"device": torch.cuda.get_device_name(), "sms": sms, "rows": [], "floors": [], "fits": []}
    plan = {
        torch.float32: [(64, 2, 1), (64, 4, 1), (64, 8, 1), (64, 16, 1), (128, 4, 1), (128, 8, 1)],
        torch.bfloat16: [(64, 8, 1), (128, 4, 1), (128, 8, 1), (256, 4, 1), (256, 8, 1)],
    }
    shapes = {torch.float32: [(50, 262144), (100, 262144), (200, 262144), (500, 65536), (1000, 65536)],
              torch.bfloat16: [(100, 262144)]}
    for dtype, configs in plan.items():
        for T, N in shapes[dtype]:
            g = torch.Generator(device="cuda").manual_seed(0)
            x = (torch.randn(T, N, generator=g, device="cuda") * 0.6 + 0.4).to(dtype)
            grad = torch.randn(T, N, generator=g, device="cuda").to(dtype)
            floors = {"T": T, "N": N, "dtype": str(dtype), **same_size_floors(x, grad)}
            results["floors"].append(floors)
            print(json.dumps(floors), flush=True)
            for BLOCK, K, warps in configs:
                try:
                    row = probe_config(x, grad, BLOCK, K, warps, sms)
                except Exception as error:  # one failing configuration must not end the probe
                    row = {"cfg": [BLOCK, K, warps], "T": T, "N": N, "error": repr(error)[:300]}
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
    lif_ops.launch_config = original
    for cfg in plan[torch.float32]:
        rows = [r for r in results["rows"] if r["cfg"] == list(cfg) and r["N"] == 262144
                and "error" not in r and r["dtype"] == str(torch.float32)]
        if len(rows) >= 2:
            results["fits"].append({"cfg": list(cfg), "fwd": fixed_cost(rows, "fwd_ms", 8),
                                    "bwd": fixed_cost(rows, "bwd_ms", 12)})
    floors = [f for f in results["floors"] if f["N"] == 262144 and f["dtype"] == str(torch.float32)]
    for key, b in (("copy_ms", 8), ("add_ms", 12)):
        results["fits"].append({"torch": key, **fixed_cost(floors, key, b)})
    for fit in results["fits"]:
        print(json.dumps(fit), flush=True)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/probe-lif-waves.json")
