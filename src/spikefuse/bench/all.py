"""`spikefuse bench all --out DIR`: every registered benchmark in one go, each with its defaults.

Each part runs in this process as `spikefuse bench <part> --out DIR` would, one after the
other, with a progress line as it starts and one as it ends (ok, failed or skipped, and its
time). A part that fails is reported with its exception's one-line message, its full traceback
in DIR/logs/<part>.log, and the rest still run. `parallel` runs only where 2 or more CUDA GPUs
are present, `steps` only on CUDA, `sparse` and `runs` only on CUDA unless --quick. DIR/summary.json and
summary.md list every part, its status, duration and the files it wrote; they are rewritten after
each part, so an interrupted run still leaves one. Exit code 1 if any part failed.
--quick passes --quick to every part (a smoke test: tiny sizes, results named <part>-quick-*,
not benchmark figures) and writes summary-quick.json and .md instead.

    spikefuse bench all --out benchmarks/results/h100/
    spikefuse bench all --out DIR --only lif,on
    spikefuse bench all --out DIR --skip data,parallel
    spikefuse bench all --out /tmp/bench --quick
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import time
import traceback

import torch

from spikefuse.errors import UsageError, one_line

from .command import BENCHMARKS
from .report import QUICK_NOTE, atomic_write, environment, table

SUMMARY = ("summary.json", "summary.md")
QUICK_SUMMARY = ("summary-quick.json", "summary-quick.md")


NOT_PARTS = ("all", "chart")  # this command, and the one that draws results already written


def parts() -> list[str]:
    """Every registered benchmark that measures, in registration order."""
    return [name for name in BENCHMARKS if name not in NOT_PARTS]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for every part's results and the summary")
    parser.add_argument("--only", help="comma-separated parts to run (default: all of " + ",".join(parts()) + ")")
    parser.add_argument("--skip", default="", help="comma-separated parts not to run")
    parser.add_argument("--quick", action="store_true",
                        help="pass --quick to every part: a smoke test, results named *-quick*, not figures")


def selected(args) -> list[str]:
    known = parts()

    def listed(option, text):
        picked = [n.strip() for n in (text or "").split(",") if n.strip()]
        unknown = [n for n in picked if n not in known]
        if unknown:
            raise UsageError(f"{option} {text}: unknown part {', '.join(unknown)}; pick from {', '.join(known)}")
        return picked

    only, skip = listed("--only", args.only), listed("--skip", args.skip)
    if args.only is not None and not only:  # "--only ," ran every part
        raise UsageError(f"--only {args.only!r}: name at least one part; pick from {', '.join(known)}")
    chosen = [n for n in (only or known) if n not in skip]
    if not chosen:
        raise UsageError("--only/--skip leave no part to run")
    return chosen


def why_not(name: str, quick: bool = False) -> str | None:
    """Why a part cannot run on this machine, or None."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "parallel" and gpus < 2 and not quick:  # --quick runs its pipeline on 2 CPU processes
        return f"needs 2 or more CUDA GPUs, this machine has {gpus}"
    if name == "steps" and not gpus:
        return "needs a CUDA device (CUDA graphs)"
    if name in ("sparse", "runs") and not gpus and not quick:
        return "needs a CUDA device (--quick runs it on the CPU)"
    return None


def run(args) -> int:
    chosen = selected(args)
    out = args.out
    os.makedirs(out, exist_ok=True)
    results = []
    started = time.time()
    for i, name in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {name}: started", flush=True)
        result = run_part(name, out, args.quick)
        results.append(result)
        note = f": {result['note']}" if result.get("note") else ""
        print(f"[{i}/{len(chosen)}] {name}: {result['status']} after {result['seconds']:.1f} s{note}", flush=True)
        write_summary(out, results, time.time() - started, args.quick)
    failed = [r["name"] for r in results if r["status"] == "failed"]
    summary = os.path.join(out, (QUICK_SUMMARY if args.quick else SUMMARY)[1])
    print(f"bench all: {len(results) - len(failed)} of {len(results)} parts did not fail"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"; summary in {summary}")
    return 1 if failed else 0


def run_part(name: str, out: str, quick: bool = False) -> dict:
    """Run one part with its defaults and --out `out` (and --quick); what happened, as a summary entry."""
    result = {"name": name, "status": "skipped", "seconds": 0.0, "files": [], "note": why_not(name, quick)}
    if result["note"]:
        return result
    module = importlib.import_module(BENCHMARKS[name][0])
    parser = argparse.ArgumentParser(prog=f"spikefuse bench {name}")
    module.configure(parser)
    before = snapshot(out)
    t0 = time.perf_counter()
    try:
        code = module.run(parser.parse_args(["--out", out] + (["--quick"] if quick else [])))
        result.update(status="ok" if not code else "failed", note=None if not code else f"exit code {code}")
    except (Exception, SystemExit) as error:  # noqa: BLE001 -- one part failing never stops the others
        log = os.path.join(out, "logs", f"{name}.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            f.write(traceback.format_exc())
        result.update(status="failed", note=one_line(error), log=os.path.relpath(log, out))
    result["seconds"] = time.perf_counter() - t0
    result["files"] = changed(out, before)
    gc.collect()  # the next part starts with the GPU memory this one held given back
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def snapshot(folder: str) -> dict:
    """path relative to `folder` -> modification time, for every file under it."""
    found = {}
    for root, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(root, f)
            found[os.path.relpath(path, folder)] = os.stat(path).st_mtime_ns
    return found


def changed(folder: str, before: dict) -> list[str]:
    """Files under `folder` written since `before` (the summary and the logs left out)."""
    return sorted(p for p, mtime in snapshot(folder).items()
                  if before.get(p) != mtime and p not in SUMMARY + QUICK_SUMMARY and not p.startswith("logs" + os.sep))


def write_summary(out: str, results: list[dict], seconds: float, quick: bool = False) -> None:
    payload = {"benchmark": "all", "environment": environment(), "seconds": seconds, "quick": quick,
               "failed": [r["name"] for r in results if r["status"] == "failed"], "parts": results}
    names = QUICK_SUMMARY if quick else SUMMARY  # a quick run never replaces a full run's summary
    atomic_write(os.path.join(out, names[0]), json.dumps(payload, indent=2) + "\n")
    env = payload["environment"]
    rows = [[r["name"], r["status"], r["seconds"], r.get("note") or "",
             ", ".join(r["files"]) + (f" (traceback: {r['log']})" if r.get("log") else "")] for r in results]
    atomic_write(os.path.join(out, names[1]),
                 (f"**{QUICK_NOTE}.**\n\n" if quick else "")
                 + f"# spikefuse bench all\n\n{env['device']}, {env['date']}, versions {env['versions']}\n\n"
                 f"{len(results)} parts in {seconds:.0f} s; failed: {', '.join(payload['failed']) or 'none'}.\n\n"
                 + table(["part", "status", "seconds", "note", "files"], rows))
