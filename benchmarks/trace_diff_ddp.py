"""Produces benchmarks/results/multi-gpu-*/trace_diff.txt: the SyncBN step against the local-BN
step, kernel by kernel, from profile_ddp_step.py's traces of 2 ranks (3 steps each).

Per rank: each SyncBN exchange kernel's duration and the gaps around it, the span and kernel
time per step, and the per-step GPU time of every kernel name whose total differs by more than
3 us between the two steps.
    TRACE_DIR=DIR torchrun --nproc-per-node 2 benchmarks/profile_ddp_step.py captured captured-local-bn
    python benchmarks/trace_diff_ddp.py DIR
"""
import collections
import gzip
import json
import os
import statistics
import sys

STEPS = 3  # profile_ddp_step.py profiles three steps


def kernels(path):
    opened = gzip.open if path.endswith(".gz") else open
    with opened(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])


def short(name):
    return name.split("(")[0][:60]


def trace(directory, mode, rank):
    for suffix in (".json", ".json.gz"):
        path = os.path.join(directory, f"{mode}-rank{rank}-of-2{suffix}")
        if os.path.exists(path):
            return kernels(path)
    return None


def main(directory):
    totals = {}
    for mode in ("captured", "captured-local-bn"):
        for rank in (0, 1):
            ks = trace(directory, mode, rank)
            if ks is None:
                continue
            per_name, calls = collections.Counter(), collections.Counter()
            for e in ks:
                per_name[short(e["name"])] += e["dur"]
                calls[short(e["name"])] += 1
            span = (ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]) / STEPS
            totals[(mode, rank)] = (per_name, calls, span)
            exchanges = [i for i, e in enumerate(ks) if "exchange_kernel" in e["name"]]
            if exchanges:
                durs = [ks[i]["dur"] for i in exchanges]
                print(mode, "rank", rank, "exchanges", len(durs), "median dur", statistics.median(durs), "min",
                      min(durs), "max", max(durs), "sum/step", sum(durs) / STEPS)
                print("  first 18 durs:", [round(d, 1) for d in durs[:18]])
                gaps = []
                for i in exchanges[:18]:
                    e, before = ks[i], ks[i - 1]
                    after = ks[i + 1] if i + 1 < len(ks) else None
                    gaps.append((round(e["ts"] - (before["ts"] + before["dur"]), 1),
                                 round(after["ts"] - (e["ts"] + e["dur"]), 1) if after else None,
                                 short(before["name"])[:30]))
                print("  gaps (before, after, prev kernel):", gaps)
            print(mode, "rank", rank, "span per step (us)", round(span, 1), "kernel sum per step",
                  round(sum(per_name.values()) / STEPS, 1))
    for rank in (0, 1):
        if ("captured", rank) not in totals or ("captured-local-bn", rank) not in totals:
            continue
        (a, calls_a, span_a), (b, calls_b, span_b) = totals[("captured", rank)], totals[("captured-local-bn", rank)]
        print(f"rank {rank}: SyncBN - local per step: span {round(span_a - span_b, 1)} us")
        for delta, name in sorted(((a[k] - b[k]) / STEPS, k) for k in set(a) | set(b)):
            if abs(delta) > 3:
                print(f"   {delta:+8.1f} us  {name}  calls {calls_a[name] / STEPS:.0f} vs {calls_b[name] / STEPS:.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
