"""PNG charts of benchmark results, drawn from a results file's JSON payload alone, so that a
committed result can be drawn again on any machine:

    spikefuse bench chart benchmarks/results/lif-nvidia-h200.json [...]   (spikefuse.bench.chart)

One picture per file (lif, neurons, steps, train, data, ddp-scaling, the temporal pipeline:
grouped bars drawn here; sparse and on: the charts their benchmarks draw). Times are on a log axis, because the entries span one to
several hundred times spikefuse's; where the run measured a floor (bandwidth, FLOPs, the
step's own GPU kernel time) it is drawn as a black bar mark over its group.
"""
from __future__ import annotations

import io

from .atomic import atomic_write


def draw(payload: dict, path: str) -> str | None:
    """The chart of `payload` written to `path` (PNG, atomically); None, with a note on
    stdout, where there is none (no matplotlib, a benchmark without a chart here, no data)."""
    drawer = DRAWERS.get(payload.get("benchmark"))
    if drawer is None:
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("no chart: matplotlib is not installed (pip install 'spikefuse[plot]')")
        return None
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    if not drawer(fig.subplots(), payload):
        return None
    env = payload.get("environment", {})
    fig.suptitle(f"{TITLES[payload['benchmark']]}: {env.get('device', '?')}, {str(env.get('date', ''))[:10]}"
                 + (" (quick run: not benchmark figures)" if payload.get("quick") else ""))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write(path, buffer.getvalue())
    return path


def grouped_bars(ax, groups, series, floors=None, ylabel="ms (log scale)", floor_label="floor"):
    """One cluster of bars per group, one bar per series (None: not measured); floors: one
    value (or None) per group, marked across its cluster."""
    names = [name for name, values in series.items() if any(v is not None for v in values)]
    if not names or not groups:
        return False
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [g - 0.4 + (k + 0.5) * width for g, v in enumerate(series[name]) if v is not None]
        ax.bar(xs, [v for v in series[name] if v is not None], width, label=name)
    for g, floor in enumerate(floors or []):
        if floor is not None:
            ax.hlines(floor, g - 0.42, g + 0.42, colors="black", linewidths=2.2,
                      label=floor_label if g == next(i for i, f in enumerate(floors) if f is not None) else None)
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never on them
    return True


def plain_log_ticks(ax):
    """Tick labels as plain numbers (0.3, 2, 50), minor ticks labelled at 2 and 5 only."""
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))


def _by_library(cases, key):
    names = dict.fromkeys(n for c in cases for n in c["libraries"])
    return {n: [c["libraries"].get(n, {}).get(key) for c in cases] for n in names}


def _lif(ax, payload):
    cases = payload["cases"]
    groups = [f"T={c['T']} B={c['B']}\nN={c['N']} {c['dtype']}" for c in cases]
    return grouped_bars(ax, groups, _by_library(cases, "stream_ms"), [c.get("floor_ms") for c in cases],
                        "ms per forward+backward, steady state (log scale)", "bandwidth floor")


def _neurons(ax, payload):
    cases = payload["cases"]
    groups = [f"{c['neuron']} T={c['T']}\nB={c['B']} N={c['N']}" for c in cases]
    return grouped_bars(ax, groups, _by_library(cases, "ms"), None, "ms per forward+backward (log scale)")


def _steps(ax, payload):
    def key(c):  # one group per network, width, precision and batch
        return c["net"], c.get("width", 1.0), c["precision"], c["B"]
    keys = list(dict.fromkeys(key(c) for c in payload["cases"]))
    modes = list(dict.fromkeys(c["mode"] for c in payload["cases"]))
    row = {(*key(c), c["mode"]): c for c in payload["cases"]}
    series = {m: [row.get((*k, m), {}).get("step_ms") for k in keys] for m in modes}
    kernels = [row.get((*k, "captured"), {}).get("kernel_ms") or row.get((*k, "eager"), {}).get("kernel_ms")
               for k in keys]
    groups = [f"{net}{'' if w == 1.0 else f' x{w:g}'} {precision}\nB={b}" for net, w, precision, b in keys]
    return grouped_bars(ax, groups, series, kernels, "ms per training step (log scale)", "GPU kernel time")


def _train(ax, payload):
    def key(c):  # one group per network, precision, time steps and batch (resnet18 runs at two T)
        return c["net"], c["precision"], c.get("T"), c.get("B")
    keys = list(dict.fromkeys(key(c) for c in payload["cases"]))
    impls = list(dict.fromkeys(c["impl"] for c in payload["cases"]))
    row = {(*key(c), c["impl"]): c for c in payload["cases"]}
    series = {i: [row.get((*k, i), {}).get("ms") for k in keys] for i in impls}
    floors = [next((row[(*k, i)].get("floor_ms") for i in impls if (*k, i) in row), None) for k in keys]
    return grouped_bars(ax, [f"{net} {precision}\nT={t} B={b}" for net, precision, t, b in keys], series, floors,
                        "ms per training step (log scale)", "floor (bytes + FLOPs)")


def _data(ax, payload):
    results = payload["results"]
    series = {r["pipeline"]: [r.get("epoch_s")] for r in results.values()}
    return grouped_bars(ax, ["one epoch"], series, None, "s per epoch (log scale)")


def _ddp_scaling(ax, payload):
    """Samples a second on one GPU and on N, per mode and precision; the scaling in the label."""
    rows = [r for r in payload["results"] if not r.get("error")]
    gpus = max((r["gpus"] for r in rows), default=0)
    groups = [f"{r['mode']}\n{r['precision']}, x{r['scaling']:.2f}" for r in rows]
    series = {"1 GPU": [r.get("samples_per_s_1gpu") for r in rows],
              f"{gpus} GPUs": [r.get("samples_per_s") for r in rows]}
    return grouped_bars(ax, groups, series, None, "samples/s, whole training steps (log scale)")


def _pipeline(ax, payload):
    """Per sequence length, the planner's chunking: measured and predicted speedup over one
    GPU, and the busiest GPU's peak memory over one GPU's."""
    chosen = [(r["T"], next((p for p in r["pipeline"] if p.get("planner_choice")), None)) for r in payload["results"]]
    chosen = [(T, p) for T, p in chosen if p is not None]
    groups = [f"T={T}\n{p['chunks']} chunks" for T, p in chosen]
    series = {"speedup, measured": [p["speedup"] for _, p in chosen],
              "speedup, predicted": [p["predicted_speedup"] for _, p in chosen],
              "peak memory": [p["peak_ratio_to_single"] for _, p in chosen]}
    if not grouped_bars(ax, groups, series, [1.0] * len(chosen), f"x one GPU (log scale), {payload['gpus']} GPUs",
                        "one GPU = 1"):
        return False
    low, high = ax.get_ylim()  # a narrow span: label more than the decades, within the bars' range
    ticks = [t for t in (0.25, 0.4, 0.5, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4) if low <= t <= high]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_ylim(low, high)
    ax.set_yticks([], minor=True)
    return True


DRAWERS = {"lif": _lif, "neurons": _neurons, "steps": _steps, "train": _train, "data": _data,
           "ddp-scaling": _ddp_scaling, "temporal pipeline": _pipeline}
TITLES = {"lif": "LIF forward+backward", "neurons": "ALIF, CUBA, recurrent neurons",
          "steps": "whole training steps", "train": "training steps of the CIFAR networks",
          "data": "one epoch of SHD-shaped data", "ddp-scaling": "data-parallel training, scaling",
          "temporal pipeline": "layers as pipeline stages, time in chunks"}
