"""GPU timing done right: CUDA events after warm-up, medians, peak memory, the copy ceiling."""
from __future__ import annotations

import statistics
import time

import torch


def median_ms(fn, *, warmup: int = 3, min_reps: int = 5, max_reps: int = 100, budget_s: float = 2.0):
    """Median time of fn() in ms: CUDA events around each call on CUDA, else a wall clock."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = int(max(min_reps, min(max_reps, budget_s / max(once, 1e-6))))
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


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


def copy_bandwidth_gbs(nbytes: int = 2**31) -> float | None:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written (GB/s)."""
    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms, _ = median_ms(lambda: dst.copy_(src), warmup=3, min_reps=20, max_reps=50)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9
