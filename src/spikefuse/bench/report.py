"""Benchmark results: the environment they were measured in, and atomic JSON + markdown files."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform

import torch

import spikefuse

from .atomic import atomic_write  # noqa: F401  (the benchmarks write through report)
from ..ops.launch import usable_cpus
from . import charts

PACKAGES = ("spikefuse", "torch", "triton", "snntorch", "norse", "spikingjelly", "tonic")
QUICK_NOTE = ("Quick run (--quick): tiny sizes and few repetitions, to check that the benchmark runs; "
              "these numbers are not benchmark figures")


def environment() -> dict:
    """Device name, library versions and date: recorded in every result file."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # run from a source tree: its own version
            versions[name] = (spikefuse.__version__ + " (source)") if name == "spikefuse" else None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"device": device, "cuda": torch.version.cuda, "python": platform.python_version(),
            "cpus": {"usable": usable_cpus(), "host": os.cpu_count()},  # (a taskset share of the host)
            "versions": versions, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def write_results(name: str, payload: dict, markdown: str, out_dir: str) -> tuple[str, str]:
    """benchmarks/results/<name>-<device>.json and .md, and the chart (.png) where
    spikefuse.bench.charts draws this benchmark; returns the JSON and markdown paths.
    A payload with "quick": true is a --quick run: <name>-quick-<device>.*, headed QUICK_NOTE,
    so that it never replaces, nor passes for, a full run's results."""
    if payload.get("quick"):
        name += "-quick"
        markdown = f"**{QUICK_NOTE}.**\n\n{markdown}"
    device = payload.get("environment", {}).get("device", "cpu")
    tag = "".join(c if c.isalnum() else "-" for c in device).strip("-").lower() or "cpu"
    base = os.path.join(out_dir, f"{name}-{tag}")
    atomic_write(base + ".json", json.dumps(payload, indent=2) + "\n")
    atomic_write(base + ".md", markdown)
    try:
        charts.draw(payload, base + ".png")
    except Exception as e:  # noqa: BLE001  (the results are written; a picture must not lose them)
        print(f"no chart for {base}.json: {type(e).__name__}: {e}")
    return base + ".json", base + ".md"


def table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else ("-" if v is None else str(v))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
