"""`spikefuse bench chart FILE.json ...`: draw the PNG chart of results files already written
(no GPU needed): x.json -> x.png, by spikefuse.bench.charts, or for `on` and `sparse` by the
chart their own benchmark draws; `runs` draws one per task, x-<task>.png."""
from __future__ import annotations

import json
import os

from ..errors import UsageError
from . import charts


def redraw(json_paths: list[str]) -> list[str]:
    """Charts next to results files (x.json -> x.png); the paths written."""
    written = []
    for json_path in json_paths:
        with open(json_path) as f:
            payload = json.load(f)
        if not isinstance(payload, dict):
            raise TypeError(f"{json_path} holds a JSON {type(payload).__name__}, not a results object")
        png_path = os.path.splitext(json_path)[0] + ".png"
        if payload.get("benchmark") == "on":  # the benchmarks that draw their own
            from .on import write_chart
            png = write_chart(payload, png_path)
            png = png if png.endswith(".png") else None
        elif payload.get("benchmark") == "sparse":
            from .sparse import chart
            png = chart(payload["cases"], png_path, quick=payload.get("quick", False))
        elif payload.get("benchmark") == "runs":  # one chart per task: x-<task>.png
            from .runs import write_charts
            drawn = write_charts(payload["tasks"], os.path.splitext(json_path)[0], payload.get("quick", False))
            written += drawn
            png = None if not drawn else ""  # "": drawn above, nothing more to add or report
        else:
            png = charts.draw(payload, png_path)
        if png:
            written.append(png)
        elif png is None:
            print(f"{json_path}: no chart for benchmark {payload.get('benchmark')!r}")
    return written


def configure(parser) -> None:
    parser.add_argument("results", nargs="+", metavar="FILE.json", help="results files written by spikefuse bench")


def run(args) -> int:
    for path in args.results:
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such results file")
    try:
        written = redraw(args.results)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"not a spikefuse results file ({type(e).__name__}: {e})") from None
    print("wrote", *written) if written else None
    return 0
