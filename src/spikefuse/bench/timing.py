"""GPU timing done right: CUDA events after warm-up, medians, peak memory, the copy ceiling."""
from __future__ import annotations

import statistics
import time

import torch

from ..neuron_options import check_int, check_number


def median_ms(fn, *, warmup: int = 3, min_reps: int = 5, max_reps: int = 100, budget_s: float = 2.0,
              back_to_back: int = 1, warmup_s: float = 0.0):
    """Median time of fn() in ms: CUDA events around each call on CUDA, else a wall clock.

    back_to_back=1 times one call from an idle GPU: the host's time to the first launch
    and any wait between launches count (a call's latency). back_to_back=n times n calls
    queued one after another and divides by n, after n more untimed calls queued just
    before them: the span opens on a GPU already busy, as in the middle of a training loop,
    so it is the steady-state time per call (the throughput): the GPU's time when the host
    keeps ahead, the host's when it cannot (the queue then drains and the GPU waits).

    warmup_s: warm up for at least this long too (the calls waited for), so that the GPU's
    clocks settle to fn's own load whatever ran before it: after seconds of GEMMs at the power
    cap they sit lower than after a launch-bound loop, by up to 20 % on an H200."""
    # a NaN warmup or warmup_s skipped the warm-up, an inf one never ended; back_to_back 0 divided
    # by zero, min_reps 2.5 was truncated, 0 reps raised from statistics.median
    warmup, min_reps, max_reps = (check_int(name, v, low) for name, v, low in
                                  (("warmup", warmup, 0), ("min_reps", min_reps, 1), ("max_reps", max_reps, 1)))
    back_to_back = check_int("back_to_back", back_to_back)
    budget_s = check_number("budget_s", budget_s, low=0)  # max_reps bounds the reps it buys
    warmup_s = check_number("warmup_s", warmup_s, low=0, high=3600)  # 2**70 s warmed up for ever
    cuda = torch.cuda.is_available()
    started, calls = time.perf_counter(), 0
    while calls < warmup or time.perf_counter() - started < warmup_s:
        fn()
        calls += 1
        if cuda and warmup_s:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    once = time.perf_counter() - t0
    calls_per_rep = back_to_back * (2 if cuda and back_to_back > 1 else 1)  # the untimed ones too
    reps = int(max(min_reps, min(max_reps, budget_s / max(once * calls_per_rep, 1e-6))))
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(calls_per_rep - back_to_back):  # fill the queue first
                fn()
            start.record()
            for _ in range(back_to_back):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / back_to_back)
        else:
            t0 = time.perf_counter()
            for _ in range(back_to_back):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / back_to_back)
    return statistics.median(times), times


def in_rounds(measure, calls: dict, rounds: int) -> tuple[dict, dict]:
    """(key -> [measure(call) of each round], key -> the error that stopped it). Every round
    measures each call in turn, so drift on a shared GPU over the run (clocks, a neighbour's
    load) hits every entry alike instead of whichever entry ran while it lasted; each round
    starts further along the list, so no entry always follows the same one (a GPU that has
    just run long GEMMs at its power cap clocks lower than one that idled through a launch-bound
    loop). The spread of an entry's rounds is the run-to-run spread its comparisons are judged
    against. A call that raises (out of memory, a failing kernel) sits out the later rounds;
    the others go on."""
    rounds = check_int("rounds", rounds)  # 0 measured nothing, NaN raised from range()
    keys = list(calls)
    results, errors = {key: [] for key in keys}, {}
    for r in range(rounds):
        start = r * len(keys) // rounds
        for key in keys[start:] + keys[:start]:
            if key in errors:
                continue
            try:
                results[key].append(measure(calls[key]))
            except Exception as error:  # noqa: BLE001 -- reported by the caller, the others still run
                errors[key] = error
    return results, errors


def captured(fn, warmup: int = 3):
    """(replay, result): fn captured in a CUDA graph, warmed up first on a side stream (as
    torch.cuda.graph asks), and what fn returned inside the capture. replay() runs fn's
    kernels with one launch from the host: timing it gives their GPU time, as inside a
    captured training step, where an eager call of several small kernels would time the
    host's launches instead. CUDA only."""
    warmup = check_int("warmup", warmup, 0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    graph.replay()
    return graph.replay, result


def peak_extra_mib(fn) -> float | None:
    """Peak memory fn() allocates beyond what was already allocated (MiB); None off CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def graph_pool_segments() -> dict:
    """{(pool id, address): (reserved bytes, allocated bytes)} of the caching allocator's
    segments outside its default pool: CUDA graphs' private pools. A replay writes into its
    pool without allocating, so torch.cuda.max_memory_allocated misses what the pool holds
    beyond its live tensors; a step's absolute peak needs the pool's reserved bytes."""
    segments = {}
    for segment in torch.cuda.memory_snapshot():
        pool = tuple(segment.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            allocated = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
            segments[(pool, segment["address"])] = (segment["total_size"], allocated)
    return segments


def step_peak_bytes(fn, base: int, pools_before: dict) -> int:
    """The absolute peak of one call of fn (a training step) on CUDA: everything allocated
    since `base` (torch.cuda.memory_allocated() before its model, optimizer and inputs were
    made) at the call's peak, with the graph pools made since `pools_before`
    (graph_pool_segments()) counted at their reserved size instead of their live tensors."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    new = [v for k, v in graph_pool_segments().items() if k not in pools_before]
    return torch.cuda.max_memory_allocated() - base - sum(a for _, a in new) + sum(r for r, _ in new)


def copy_bandwidth_gbs(nbytes: int = 2**31) -> float | None:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written (GB/s)."""
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms, _ = median_ms(lambda: dst.copy_(src), warmup=3, min_reps=20, max_reps=50)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9
